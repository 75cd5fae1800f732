// Written for @e2b/code-interpreter: state kept between cells, streamed prints, a traceback,
// contexts. Run unchanged against agentbox (sdk_test.go sets the environment).
import { Sandbox } from '@e2b/code-interpreter'
import assert from 'node:assert/strict'

const sbx = await Sandbox.create({ timeoutMs: 120_000 })
console.log('ok create', sbx.sandboxId)

await sbx.runCode('x = 41')
const r = await sbx.runCode('x + 1')
assert.equal(r.text, '42')
assert.equal(r.results[0].isMainResult, true)
console.log('ok state', r.text)

const printed = []
const p = await sbx.runCode('import sys\nfor i in range(3):\n    print("line", i)\nprint("to stderr", file=sys.stderr)', {
  onStdout: (m) => printed.push(m.line),
})
assert.equal(printed.join(''), 'line 0\nline 1\nline 2\n')
assert.equal(p.logs.stdout.join(''), 'line 0\nline 1\nline 2\n')
assert.equal(p.logs.stderr.join(''), 'to stderr\n')
console.log('ok streamed', printed.length, 'chunks')

const e = await sbx.runCode('def f():\n    return 1 / 0\nf()')
assert.equal(e.error.name, 'ZeroDivisionError')
assert.equal(e.error.value, 'division by zero')
assert.match(e.error.traceback, /in f/)
console.log('ok error', e.error.name)

const html = await sbx.runCode('class H:\n    def _repr_html_(self):\n        return "<b>hi</b>"\nH()')
assert.equal(html.results[0].html, '<b>hi</b>')
console.log('ok mime', html.results[0].formats().join(','))

const ctx = await sbx.createCodeContext({ cwd: '/tmp' })
assert.equal(ctx.language, 'python')
const c1 = await sbx.runCode('import os\ny = os.getcwd()\ny', { context: ctx })
assert.equal(c1.text, "'/tmp'")
const c2 = await sbx.runCode("'x' in globals()", { context: ctx })
assert.equal(c2.text, 'False', 'a new context does not see the default one')
const ctxs = await sbx.listCodeContexts()
assert.ok(ctxs.some((c) => c.id === ctx.id))
await sbx.removeCodeContext(ctx)
console.log('ok contexts')

await sbx.kill()
console.log('ok kill')
