// make bench-e2b's SDK side (bench/e2b.go), driven over stdin so that its creates take turns
// with REST's: "create" times Sandbox.create() → the first commands.run('true') result (then
// kills it) and prints {"createFirst": ms}; "calls N" times N commands.run('true') on a running
// sandbox and N runCode('1+1') on a warm context and prints {"run": [...], "runCode": [...]}.
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
    for (let i = 0; i < m; i++) {
      const t0 = process.hrtime.bigint()
      await sbx.commands.run('true')
      out.run.push(ms(t0))
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
