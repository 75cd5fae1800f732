// Pause and resume (agentbox's sleep and wake): a file written before the pause (in the home, on
// the sandbox's disk; a relative path) is there after connect resumes the sandbox. Then the
// lifecycle options: a sandbox created to pause at its timeout (onTimeout 'pause') pauses instead
// of ending, and with autoResume the next command resumes it.
import { Sandbox } from 'e2b'
import assert from 'node:assert/strict'

const sbx = await Sandbox.create({ timeoutMs: 120_000 })
await sbx.files.write('kept.txt', 'still here')
assert.equal(await sbx.pause(), true)
const info = await Sandbox.getInfo(sbx.sandboxId)
assert.equal(info.state, 'paused')
assert.equal(await sbx.pause(), false, 'pausing a paused sandbox answers 409: false')
console.log('ok pause')
const back = await Sandbox.connect(sbx.sandboxId)
assert.equal((await Sandbox.getInfo(sbx.sandboxId)).state, 'running')
assert.equal(await back.files.read('kept.txt'), 'still here')
assert.equal((await back.commands.run('echo awake')).stdout, 'awake\n')
console.log('ok resume')
await back.kill()

const auto = await Sandbox.create({ timeoutMs: 8_000, lifecycle: { onTimeout: 'pause', autoResume: true } })
const lc = (await auto.getInfo()).lifecycle
assert.deepEqual({ onTimeout: lc.onTimeout, autoResume: lc.autoResume }, { onTimeout: 'pause', autoResume: true })
await auto.files.write('kept.txt', 'through the timeout')
for (const end = Date.now() + 120_000; (await Sandbox.getInfo(auto.sandboxId)).state !== 'paused'; ) {
  assert.ok(Date.now() < end, 'not paused two minutes after its 8 s timeout')
  await new Promise((r) => setTimeout(r, 250))
}
console.log('ok paused at its timeout')
assert.equal((await auto.commands.run('cat kept.txt')).stdout, 'through the timeout')
assert.equal((await Sandbox.getInfo(auto.sandboxId)).state, 'running')
console.log('ok resumed by a command')
await auto.kill()
