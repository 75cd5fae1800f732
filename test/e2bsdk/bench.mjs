// make bench-e2b's SDK side (bench/e2b.go), driven over stdin so that its creates take turns
// with REST's: "create" times Sandbox.create() → the first commands.run('true') result (then
// kills it) and prints {"createFirst": ms}; "calls N" times N commands.run('true') on a running
// sandbox and N runCode('1+1') on a warm context and prints {"run": [...], "runCode": [...]};
// in turns with each commands.run it times, from the same Node process, the same Start RPC sent
// with plain fetch (no SDK: the server and the transport) and agentbox's REST exec of the same
// argv ("rawStart", "rawExec"), so that the SDK's own share can be told apart.
import { Sandbox } from '@e2b/code-interpreter'
import readline from 'node:readline'

const ms = (t0) => Number(process.hrtime.bigint() - t0) / 1e6
const warm = await Sandbox.create({ timeoutMs: 120_000 }) // modules and connections warm, untimed
await warm.commands.run('true')
await warm.kill()
console.log(JSON.stringify({ ready: true }))

for await (const line of readline.createInterface({ input: process.stdin })) {
  const [what, arg] = line.trim().split(' ')
  if (what === 'create') {
    const t0 = process.hrtime.bigint()
    const sbx = await Sandbox.create({ timeoutMs: 120_000 })
    await sbx.commands.run('true')
    const t = ms(t0)
    await sbx.kill()
    console.log(JSON.stringify({ createFirst: t }))
  } else if (what === 'calls') {
    const m = Number(arg)
    const out = { run: [], runCode: [] }
    const sbx = await Sandbox.create({ timeoutMs: 300_000 })
    await sbx.commands.run('true')
    out.rawStart = []
    out.rawExec = []
    const url = process.env.E2B_SANDBOX_URL
    const key = process.env.E2B_API_KEY
    const msg = Buffer.from(JSON.stringify({ process: { cmd: '/bin/bash', args: ['-l', '-c', 'true'] }, stdin: false }))
    const envelope = Buffer.alloc(5 + msg.length)
    envelope.writeUInt32BE(msg.length, 1)
    msg.copy(envelope, 5)
    const rawStart = async () => {
      const r = await fetch(url + '/process.Process/Start', { method: 'POST', body: envelope, headers: {
        'content-type': 'application/connect+json', 'connect-protocol-version': '1',
        'e2b-sandbox-id': sbx.sandboxId, 'e2b-sandbox-port': '49983', 'x-access-token': key } })
      const body = Buffer.from(await r.arrayBuffer()).toString()
      if (r.status !== 200 || !body.includes('exit status 0')) throw new Error(`raw Start: ${r.status} ${body}`)
    }
    const rawExec = async () => {
      const r = await fetch(process.env.E2B_API_URL + `/v1/sandboxes/${sbx.sandboxId}/exec`, { method: 'POST',
        headers: { 'content-type': 'application/json', 'x-api-key': key }, body: JSON.stringify({ command: ['/bin/bash', '-l', '-c', 'true'] }) })
      const body = await r.text()
      if (r.status !== 200) throw new Error(`REST exec: ${r.status} ${body}`)
    }
    await rawStart()
    await rawExec()
    for (let i = 0; i < m; i++) {
      let t0 = process.hrtime.bigint()
      await sbx.commands.run('true')
      out.run.push(ms(t0))
      t0 = process.hrtime.bigint()
      await rawStart()
      out.rawStart.push(ms(t0))
      t0 = process.hrtime.bigint()
      await rawExec()
      out.rawExec.push(ms(t0))
    }
    await sbx.runCode('1+1') // the interpreter starts: the context is warm after this
    for (let i = 0; i < m; i++) {
      const t0 = process.hrtime.bigint()
      const r = await sbx.runCode('1+1')
      out.runCode.push(ms(t0))
      if (r.text !== '2') throw new Error('runCode 1+1 gave ' + r.text)
    }
    await sbx.kill()
    console.log(JSON.stringify(out))
    break
  }
}
