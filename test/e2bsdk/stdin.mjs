// Written for E2B: a command started with stdin open is fed while it runs, then its stdin is
// closed (EOF). Each step prints one "ok ..." line that sdk_test.go checks; any failure throws.
import { Sandbox } from 'e2b'
import assert from 'node:assert/strict'

const sbx = await Sandbox.create({ timeoutMs: 120_000 })
try {
  // Input reaches the command as it is sent: each line is echoed back before the next is sent.
  let out = ''
  const cat = await sbx.commands.run('cat', { background: true, stdin: true, onStdout: (d) => { out += d } })
  const until = async (want) => {
    for (let i = 0; i < 100 && !out.includes(want); i++) await new Promise((r) => setTimeout(r, 50))
    assert.ok(out.includes(want), `waiting for ${JSON.stringify(want)}, got ${JSON.stringify(out)}`)
  }
  await sbx.commands.sendStdin(cat.pid, 'hello\n')
  await until('hello\n')
  await cat.sendStdin('world\n')
  await until('world\n')
  await sbx.commands.closeStdin(cat.pid)
  const res = await cat.wait()
  assert.equal(res.exitCode, 0)
  assert.equal(res.stdout, 'hello\nworld\n')
  console.log('ok sendStdin closeStdin')

  // Bytes, more than one frame's worth, counted by the command once its stdin ends.
  const wc = await sbx.commands.run('wc -c', { background: true, stdin: true })
  await wc.sendStdin(new Uint8Array(100_000).fill(7))
  await wc.closeStdin()
  assert.equal((await wc.wait()).stdout.trim(), '100000')
  console.log('ok binary stdin')

  // Without stdin: true the command's stdin is closed, and sendStdin says so.
  const sleeper = await sbx.commands.run('sleep 30', { background: true })
  const err = await sbx.commands.sendStdin(sleeper.pid, 'x').catch((e) => e)
  assert.ok(err instanceof Error && /stdin not enabled/.test(err.message), 'sendStdin without stdin: ' + err)
  await sleeper.kill()
  console.log('ok stdin off')

  // A command killed while its stdin is open ends.
  const held = await sbx.commands.run('cat', { background: true, stdin: true })
  assert.equal(await held.kill(), true)
  const end = await held.wait().catch((e) => e)
  assert.ok(end.exitCode !== 0, 'a killed command does not exit 0')
  assert.equal((await sbx.commands.list()).length, 0)
  console.log('ok kill with open stdin')
} finally {
  await sbx.kill()
}
