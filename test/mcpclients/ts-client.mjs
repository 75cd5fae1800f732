// ts-client.mjs: the official TypeScript SDK (@modelcontextprotocol/sdk) as an agent would use
// it against `agentbox serve`: streamable HTTP with the bearer token, the sandbox loop, and exec
// output streamed as notifications/progress while the command runs.
//
//   AGENTBOX_MCP_URL=http://127.0.0.1:8765/mcp AGENTBOX_TOKEN=... node ts-client.mjs
//
// Last, the same SDK's client for the older HTTP+SSE transport checks /sse (health).
//
// Exits 0 when every assertion holds; otherwise prints "ts-client: FAIL: ..." and exits 1.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { SSEClientTransport } from "@modelcontextprotocol/sdk/client/sse.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const url = process.env.AGENTBOX_MCP_URL || process.argv[2];
const token = process.env.AGENTBOX_TOKEN;
if (!url || !token) {
  console.error("usage: AGENTBOX_MCP_URL=http://HOST:PORT/mcp AGENTBOX_TOKEN=TOKEN node ts-client.mjs");
  process.exit(2);
}

const started = performance.now();
const ms = () => Math.round(performance.now() - started);
const log = (...a) => console.log(`[${String(ms()).padStart(6)} ms]`, ...a);

class AssertionFailed extends Error {}
function check(cond, msg, detail) {
  if (!cond) {
    throw new AssertionFailed(msg + (detail === undefined ? "" : `\n  got: ${JSON.stringify(detail, null, 2)}`));
  }
}

const TOOLS = [
  "sandbox_create", "sandbox_list", "sandbox_get", "sandbox_destroy", "sandbox_extend",
  "exec", "file_write", "file_read", "file_list", "health",
];

function connectClient(headers) {
  const client = new Client({ name: "agentbox-ts-client", version: "1.0.0" });
  const transport = new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers } });
  return { client, transport };
}

// call invokes a tool and returns its result, failing on a protocol error or, unless
// allowError, on a tool error (isError).
async function call(client, name, args, options = {}) {
  const { allowError, ...reqOptions } = options;
  const res = await client.callTool({ name, arguments: args }, undefined, { timeout: 120_000, ...reqOptions });
  if (!allowError) {
    check(!res.isError, `${name} returned isError`, res);
  }
  check(res.structuredContent && typeof res.structuredContent === "object", `${name}: no structuredContent`, res);
  check(Array.isArray(res.content) && res.content.some((c) => c.type === "text" && c.text), `${name}: no text rendering in content`, res);
  return res;
}

let client;
let transport;
let sandboxId;
try {
  // 0. Without the token the endpoint refuses (401).
  {
    const bare = connectClient({});
    let refused;
    try {
      await bare.client.connect(bare.transport);
    } catch (e) {
      refused = e;
    }
    await bare.client.close().catch(() => {});
    check(refused, "connecting without the bearer token succeeded; /mcp must require it");
    check(/401/.test(String(refused?.message) + String(refused?.code)), "connecting without the token failed, but not with 401", String(refused));
    log("without the token: refused:", String(refused.message).slice(0, 160));
  }

  // 1. Connect with the token.
  ({ client, transport } = connectClient({ Authorization: `Bearer ${token}` }));
  await client.connect(transport);
  const info = client.getServerVersion();
  log(`connected: ${info?.name} ${info?.version}, protocol ${transport.protocolVersion ?? "?"}, session ${transport.sessionId ?? "(none)"}`);
  check(info?.name, "initialize: no serverInfo.name", info);
  const caps = client.getServerCapabilities();
  check(caps?.tools, "initialize: the server does not declare the tools capability", caps);

  // 2. List tools: every tool of the contract, each with input and output schemas.
  const { tools } = await client.listTools();
  const names = tools.map((t) => t.name);
  log(`tools/list: ${names.join(", ")}`);
  for (const want of TOOLS) {
    const t = tools.find((x) => x.name === want);
    check(t, `tools/list: tool ${want} is missing`, names);
    check(t.description && t.description.length > 20, `tools/list: ${want} has no real description`, t.description);
    check(t.inputSchema?.type === "object", `tools/list: ${want} has no object inputSchema`, t.inputSchema);
    check(t.outputSchema?.type === "object", `tools/list: ${want} has no object outputSchema`, t.outputSchema);
  }
  const execTool = tools.find((t) => t.name === "exec");
  for (const arg of ["sandbox_id", "command", "env", "cwd", "stdin", "timeout_seconds"]) {
    check(execTool.inputSchema.properties?.[arg], `exec's inputSchema lacks ${arg}`, Object.keys(execTool.inputSchema.properties ?? {}));
  }
  check(execTool.inputSchema.properties.command.type === "array" ||
        (Array.isArray(execTool.inputSchema.properties.command.type) && execTool.inputSchema.properties.command.type.includes("array")),
        "exec's command is not an array in inputSchema", execTool.inputSchema.properties.command);

  // 3. A typed error is a tool result with isError and the code in structured content.
  {
    const res = await call(client, "sandbox_get", { sandbox_id: "sb-000000000000" }, { allowError: true });
    check(res.isError === true, "sandbox_get of an unknown id: isError is not true", res);
    check(JSON.stringify(res.structuredContent).includes("SANDBOX_NOT_FOUND"), "sandbox_get of an unknown id: SANDBOX_NOT_FOUND not in structuredContent", res.structuredContent);
    log("sandbox_get(unknown id): isError with SANDBOX_NOT_FOUND");
  }

  // 4. Create a sandbox.
  {
    const res = await call(client, "sandbox_create", { ttl_seconds: 600 });
    sandboxId = res.structuredContent.sandbox_id;
    check(typeof sandboxId === "string" && sandboxId.length > 0, "sandbox_create: no sandbox_id", res.structuredContent);
    check(res.structuredContent.state === "running", "sandbox_create: state is not running", res.structuredContent);
    log(`sandbox_create: ${sandboxId} (${res.structuredContent.state})`);
  }

  // 5. exec with a progressToken: a line a second for 3 seconds, each line delivered as a
  // progress notification while the command runs, all before the result.
  {
    const command = ["sh", "-c", "for i in 1 2 3; do echo line$i; sleep 1; done"];
    const notes = [];
    const t0 = performance.now();
    const res = await call(client, "exec", { sandbox_id: sandboxId, command }, {
      onprogress: (p) => notes.push({ at: performance.now() - t0, progress: p.progress, total: p.total, message: p.message }),
    });
    const resultAt = performance.now() - t0;
    const sc = res.structuredContent;
    for (const f of ["exit_code", "signal", "stdout", "stderr", "truncated", "duration_ms", "timed_out"]) {
      check(f in sc, `exec: structuredContent lacks ${f}`, sc);
    }
    check(sc.exit_code === 0 && sc.timed_out === false && sc.truncated === false, "exec: not a clean exit", sc);
    check(sc.stdout === "line1\nline2\nline3\n", "exec: wrong stdout", sc.stdout);
    check(sc.duration_ms >= 2000, "exec: duration_ms below the 2 s the command sleeps", sc.duration_ms);

    log(`exec: result after ${Math.round(resultAt)} ms; ${notes.length} progress notification(s):`);
    for (const n of notes) {
      log(`  +${String(Math.round(n.at)).padStart(5)} ms  progress=${n.progress}${n.total !== undefined ? "/" + n.total : ""}  message=${JSON.stringify(n.message)}`);
    }
    check(notes.length > 0, "exec: no progress notification arrived before the result (progressToken was sent)");
    for (let i = 1; i < notes.length; i++) {
      check(notes[i].progress > notes[i - 1].progress, "exec: progress values must increase with each notification", notes.map((n) => n.progress));
    }
    const streamed = notes.map((n) => n.message ?? "").join("");
    check(streamed.includes("line1\nline2\nline3\n"), "exec: the progress messages do not carry the three lines", streamed);
    // When did each line first show up? Notifications received after the result would have
    // been dropped by the SDK (the request's progress handler is gone), so each was before it.
    const seenAt = {};
    let acc = "";
    for (const n of notes) {
      acc += n.message ?? "";
      for (const line of ["line1", "line2", "line3"]) {
        if (seenAt[line] === undefined && acc.includes(line + "\n")) seenAt[line] = n.at;
      }
    }
    log(`  lines seen at: line1 +${Math.round(seenAt.line1)} ms, line2 +${Math.round(seenAt.line2)} ms, line3 +${Math.round(seenAt.line3)} ms, result +${Math.round(resultAt)} ms`);
    for (const line of ["line1", "line2", "line3"]) {
      check(seenAt[line] !== undefined && seenAt[line] <= resultAt, `exec: ${line} did not arrive as a progress notification before the result`, seenAt);
    }
    // Streamed while running, not flushed at the end: the command prints the lines a second
    // apart (line3 2 s after line1) and ends a second after line3. Half of that is slack for
    // a loaded machine.
    check(seenAt.line1 < seenAt.line2 && seenAt.line2 < seenAt.line3 && seenAt.line3 - seenAt.line1 >= 1000,
      "exec: the lines arrived together, not as the command printed them (a second apart)", seenAt);
    check(resultAt - seenAt.line1 >= 1500, "exec: line1 arrived less than 1.5 s before the result: output is not streamed while the command runs", { seenAt, resultAt });
  }

  // 6. Write a file and read it back (text, a byte range, and binary).
  {
    const text = "héllo from the TypeScript SDK ✓\nsecond line\n";
    const w = await call(client, "file_write", { sandbox_id: sandboxId, path: "/workspace/ts-client.txt", content: text });
    log(`file_write: ${JSON.stringify(w.structuredContent)}`);
    const r = await call(client, "file_read", { sandbox_id: sandboxId, path: "/workspace/ts-client.txt" });
    check(r.structuredContent.content === text, "file_read: content differs from what file_write wrote", r.structuredContent);
    check(r.structuredContent.size === Buffer.byteLength(text), "file_read: size is not the file's byte length", r.structuredContent);
    log(`file_read: ${r.structuredContent.size} bytes, content matches`);

    const part = await call(client, "file_read", { sandbox_id: sandboxId, path: "/workspace/ts-client.txt", offset: 7, length: 4 });
    check(part.structuredContent.content === "from", "file_read offset 7 length 4: wrong bytes", part.structuredContent);
    check(part.structuredContent.size === Buffer.byteLength(text), "file_read of a range: size must still be the file's size", part.structuredContent);

    const bin = Buffer.from(Array.from({ length: 256 }, (_, i) => i));
    await call(client, "file_write", { sandbox_id: sandboxId, path: "/workspace/bytes.bin", content_base64: bin.toString("base64"), mode: "0600" });
    const rb = await call(client, "file_read", { sandbox_id: sandboxId, path: "/workspace/bytes.bin" });
    check(typeof rb.structuredContent.content_base64 === "string", "file_read of binary bytes: no content_base64", rb.structuredContent);
    check(Buffer.from(rb.structuredContent.content_base64, "base64").equals(bin), "file_read of binary bytes: bytes differ", rb.structuredContent);
    check(rb.structuredContent.size === 256, "file_read of binary bytes: size is not 256", rb.structuredContent);
    log("file_write/file_read: 256 binary bytes round-trip as content_base64");

    const ls = await call(client, "file_list", { sandbox_id: sandboxId, path: "/workspace" });
    const listed = JSON.stringify(ls.structuredContent);
    check(listed.includes("ts-client.txt") && listed.includes("bytes.bin"), "file_list /workspace: the written files are not listed", ls.structuredContent);
    log("file_list: both files listed");

    const cat = await call(client, "exec", { sandbox_id: sandboxId, command: ["cat", "/workspace/ts-client.txt"] });
    check(cat.structuredContent.stdout === text, "exec cat: the command sees other bytes than file_write wrote", cat.structuredContent);
  }

  // 7. Destroy the sandbox.
  {
    const res = await call(client, "sandbox_destroy", { sandbox_id: sandboxId });
    log(`sandbox_destroy: ${JSON.stringify(res.structuredContent).slice(0, 200)}`);
    sandboxId = undefined;
  }

  await transport.terminateSession().catch(() => {});
  await client.close();
  client = undefined;

  // 8. The older HTTP+SSE transport at /sse, same token.
  {
    const sseUrl = new URL(url);
    sseUrl.pathname = sseUrl.pathname.replace(/\/mcp$/, "/sse");
    const sse = new Client({ name: "agentbox-ts-client-sse", version: "1.0.0" });
    await sse.connect(new SSEClientTransport(sseUrl, { requestInit: { headers: { Authorization: `Bearer ${token}` } } }));
    const h = await call(sse, "health", {});
    check(h.structuredContent.status === "ok", "health over /sse: status is not ok", h.structuredContent);
    await sse.close();
    log(`SSE ${sseUrl.pathname}: connected, health ${h.structuredContent.status}`);
  }
  log("ts-client: PASS");
  process.exit(0);
} catch (e) {
  console.error(`ts-client: FAIL: ${e instanceof AssertionFailed ? e.message : e?.stack || e}`);
  if (client && sandboxId) {
    // Leave nothing behind even when an assertion failed.
    await client.callTool({ name: "sandbox_destroy", arguments: { sandbox_id: sandboxId } }).catch((err) => console.error(`cleanup: sandbox_destroy ${sandboxId}: ${err}`));
  }
  await client?.close().catch(() => {});
  process.exit(1);
}
