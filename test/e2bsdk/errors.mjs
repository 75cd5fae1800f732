// E2B's errors as the SDK raises them: a missing sandbox, a bad key, a key whose scope forbids
// the call, another caller's sandbox. sdk_test.go passes the keys: E2B_API_KEY (operate),
// READ_KEY (read scope), OTHER_KEY (another principal), BAD_KEY (no such key).
import { Sandbox, NotFoundError, SandboxNotFoundError, AuthenticationError, SandboxError } from 'e2b'
import assert from 'node:assert/strict'

const missing = 'sb-000000000000'
await assert.rejects(Sandbox.connect(missing), (e) => e instanceof SandboxNotFoundError || e instanceof NotFoundError)
await assert.rejects(Sandbox.getInfo(missing), SandboxNotFoundError)
assert.equal(await Sandbox.kill(missing), false)
await assert.rejects(Sandbox.setTimeout(missing, 60_000), SandboxNotFoundError)
console.log('ok missing sandbox')

await assert.rejects(Sandbox.create({ apiKey: process.env.BAD_KEY }), AuthenticationError)
await assert.rejects(Sandbox.list({ apiKey: process.env.BAD_KEY }).nextItems(), AuthenticationError)
console.log('ok bad key')

// A read-scoped key may list but not create.
const err = await Sandbox.create({ apiKey: process.env.READ_KEY }).catch((e) => e)
assert.ok(err instanceof SandboxError, String(err))
assert.equal(err.statusCode, 403)
assert.match(err.message, /scope/)
await Sandbox.list({ apiKey: process.env.READ_KEY }).nextItems()
console.log('ok forbidden scope', err.statusCode)

// Another principal's sandbox is not there for this one, on the API and on envd.
const sbx = await Sandbox.create({ timeoutMs: 60_000 })
await assert.rejects(Sandbox.getInfo(sbx.sandboxId, { apiKey: process.env.OTHER_KEY }), SandboxNotFoundError)
assert.equal(await Sandbox.kill(sbx.sandboxId, { apiKey: process.env.OTHER_KEY }), false)
const theirs = await Sandbox.connect(sbx.sandboxId).catch((e) => e) // with our key: fine
assert.equal(theirs.sandboxId, sbx.sandboxId)
const stolen = new Sandbox({ sandboxId: sbx.sandboxId, envdVersion: '0.5.2', envdAccessToken: process.env.OTHER_KEY, apiKey: process.env.OTHER_KEY })
assert.equal(await stolen.isRunning(), false, 'envd answers another principal as E2B does a missing sandbox')
await assert.rejects(stolen.commands.run('echo no'))
console.log('ok other principal')

// envd errors: a missing file, a command that does not exist.
await assert.rejects(sbx.files.read('/nonexistent/file'), NotFoundError)
const notFound = await sbx.commands.run('definitely-not-a-command').catch((e) => e)
assert.equal(notFound.exitCode, 127)
console.log('ok envd errors')
await sbx.kill()
