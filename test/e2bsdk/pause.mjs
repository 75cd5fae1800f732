// Pause and resume (agentbox's sleep and wake): a file written before the pause (in the home, on
// the sandbox's disk; a relative path) is there after
// connect resumes the sandbox.
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
