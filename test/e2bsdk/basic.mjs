// Written for E2B: the flow of E2B's own docs, run unchanged against agentbox with E2B_API_URL,
// E2B_SANDBOX_URL and E2B_API_KEY pointing at it. Each step prints one "ok ..." line that the Go
// test (sdk_test.go) checks; any failure throws.
import { Sandbox } from 'e2b'
import assert from 'node:assert/strict'

const sbx = await Sandbox.create({ timeoutMs: 120_000, metadata: { purpose: 'e2b-sdk-test' } })
console.log('ok create', sbx.sandboxId)

const hi = await sbx.commands.run('echo hi')
assert.equal(hi.exitCode, 0)
assert.equal(hi.stdout, 'hi\n')
console.log('ok commands.run', JSON.stringify(hi.stdout))

const failed = await sbx.commands.run('echo oops >&2; exit 3').catch((e) => e)
assert.equal(failed.exitCode, 3)
assert.equal(failed.stderr, 'oops\n')
console.log('ok exit code', failed.exitCode)

await sbx.files.write('/tmp/e2b/hello.txt', 'hello from e2b')
assert.equal(await sbx.files.read('/tmp/e2b/hello.txt'), 'hello from e2b')
const entries = await sbx.files.list('/tmp/e2b')
assert.deepEqual(entries.map((e) => e.name), ['hello.txt'])
assert.equal(entries[0].type, 'file')
assert.equal(await sbx.files.exists('/tmp/e2b/hello.txt'), true)
await sbx.files.rename('/tmp/e2b/hello.txt', '/tmp/e2b/moved.txt')
assert.equal(await sbx.files.read('/tmp/e2b/moved.txt'), 'hello from e2b')
assert.equal(await sbx.files.makeDir('/tmp/e2b/sub'), true)
await sbx.files.remove('/tmp/e2b/moved.txt')
assert.equal(await sbx.files.exists('/tmp/e2b/moved.txt'), false)
const info = await sbx.files.getInfo('/tmp/e2b/sub')
assert.equal(info.type, 'dir')
console.log('ok files')

// Watching a directory: a file written under it is seen.
const seenEvents = []
const watch = await sbx.files.watchDir('/tmp/e2b', (ev) => seenEvents.push(ev), { recursive: true })
await sbx.files.write('/tmp/e2b/sub/watched.txt', 'x')
for (let i = 0; i < 50 && !seenEvents.some((e) => e.name === 'sub/watched.txt'); i++) await new Promise((r) => setTimeout(r, 100))
await watch.stop()
assert.ok(seenEvents.some((e) => e.name === 'sub/watched.txt' && e.type === 'create'), 'watchDir: ' + JSON.stringify(seenEvents))
console.log('ok watchDir')

// A background command whose output streams, then kill.
const seen = []
let resolveTick
const ticked = new Promise((r) => { resolveTick = r })
const bg = await sbx.commands.run('for i in $(seq 1 1000); do echo tick $i; sleep 0.1; done', {
  background: true,
  onStdout: (d) => { seen.push(d); if (seen.join('').includes('tick 3')) resolveTick() },
})
await ticked
const procs = await sbx.commands.list()
assert.ok(procs.some((p) => p.pid === bg.pid), 'commands.list shows the background command')
assert.equal(await bg.kill(), true)
const end = await bg.wait().catch((e) => e)
assert.ok(end.exitCode !== 0, 'a killed command does not exit 0')
assert.ok(seen.join('').includes('tick 1\n'))
console.log('ok background', bg.pid, 'killed after', seen.length, 'chunks')

// A PTY session.
let out = ''
const term = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => { out += new TextDecoder().decode(d) }, timeoutMs: 60_000 })
await sbx.pty.resize(term.pid, { cols: 100, rows: 30 })
await sbx.pty.sendInput(term.pid, new TextEncoder().encode('stty size; echo pty-$((40+2))\n'))
for (let i = 0; i < 100 && !out.includes('pty-42'); i++) await new Promise((r) => setTimeout(r, 100))
assert.ok(out.includes('pty-42'), 'the PTY ran the input: ' + JSON.stringify(out))
assert.ok(out.includes('30 100'), 'the PTY was resized: ' + JSON.stringify(out))
await sbx.pty.sendInput(term.pid, new TextEncoder().encode('exit 0\n'))
const tres = await term.wait()
assert.equal(tres.exitCode, 0)
console.log('ok pty')

await sbx.setTimeout(300_000)
const got = await Sandbox.getInfo(sbx.sandboxId)
assert.ok(got.endAt.getTime() - Date.now() > 200_000, 'setTimeout moved the end: ' + got.endAt.toISOString())
assert.equal(got.metadata.purpose, 'e2b-sdk-test')
assert.equal(got.state, 'running')
const listed = await Sandbox.list({ query: { metadata: { purpose: 'e2b-sdk-test' } } }).nextItems()
assert.ok(listed.some((s) => s.sandboxId === sbx.sandboxId))
console.log('ok setTimeout getInfo list')

const metrics = await sbx.getMetrics()
assert.equal(metrics.length, 1, 'one sample: ' + JSON.stringify(metrics))
assert.ok(metrics[0].cpuCount >= 1 && metrics[0].memUsed > 0 && metrics[0].memTotal >= metrics[0].memUsed, 'getMetrics: ' + JSON.stringify(metrics))
assert.ok(Math.abs(metrics[0].timestamp.getTime() - Date.now()) < 60_000, 'a sample of now: ' + metrics[0].timestamp.toISOString())
console.log('ok getMetrics')

const again = await Sandbox.connect(sbx.sandboxId)
assert.equal((await again.commands.run('echo again')).stdout, 'again\n')
console.log('ok connect')

assert.equal(await sbx.kill(), true)
assert.equal(await sbx.isRunning(), false)
console.log('ok kill')
