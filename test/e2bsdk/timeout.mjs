// Written for E2B: setTimeout sets the sandbox's end to that long from now, shorter as well as
// longer than it was. Prints "ok ..." lines for sdk_test.go, which then watches the sandbox end.
import { Sandbox } from 'e2b'
import assert from 'node:assert/strict'

const sbx = await Sandbox.create({ timeoutMs: 120_000 })
const left = async () => (await Sandbox.getInfo(sbx.sandboxId)).endAt.getTime() - Date.now()

await sbx.setTimeout(600_000)
let l = await left()
assert.ok(l > 590_000 && l <= 600_000, `lengthened to 600 s: ${l} ms left`)
console.log('ok setTimeout longer')

await sbx.setTimeout(60_000)
l = await left()
assert.ok(l > 55_000 && l <= 60_000, `shortened to 60 s: ${l} ms left`)
console.log('ok setTimeout shorter')

// connect's timeout only ever extends (E2B's keep-alive).
await Sandbox.connect(sbx.sandboxId, { timeoutMs: 10_000 })
l = await left()
assert.ok(l > 50_000, `connect shortened the end: ${l} ms left`)
console.log('ok connect keeps the end')

await sbx.setTimeout(2_000)
console.log('ok setTimeout', sbx.sandboxId)
