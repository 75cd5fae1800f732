// Written for E2B: the internet and network options of create, and the options agentbox
// refuses. Prints "ok ..." lines (with sandbox ids) that sdk_test.go checks against the
// sandboxes' recorded network policies.
import { Sandbox } from 'e2b'
import assert from 'node:assert/strict'

const closed = await Sandbox.create({ timeoutMs: 60_000 })
assert.equal((await closed.getInfo()).allowInternetAccess, false)
console.log('ok default', closed.sandboxId)

const open = await Sandbox.create({ timeoutMs: 60_000, allowInternetAccess: true })
assert.equal((await open.getInfo()).allowInternetAccess, true)
console.log('ok internet', open.sandboxId)

const narrow = await Sandbox.create({ timeoutMs: 60_000, network: { denyOut: ['0.0.0.0/0'], allowOut: ['pypi.org'] } })
console.log('ok allowOut', narrow.sandboxId)

const mounted = await Sandbox.create({ timeoutMs: 60_000, volumeMounts: { '/mnt/data': 'data' } }).catch((e) => e)
assert.ok(mounted instanceof Error && /volumeMounts/.test(mounted.message), 'volumeMounts: ' + mounted)
console.log('ok volumeMounts refused')

for (const s of [closed, open, narrow]) await s.kill()
