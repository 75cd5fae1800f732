// inspector-loop.mjs: the sandbox loop over stdio with the official MCP Inspector's CLI
// (@modelcontextprotocol/inspector-cli), one process per call, as a script or a person would
// drive `agentbox mcp`:
//
//   node inspector-loop.mjs /path/to/agentbox /path/to/state-dir [more `agentbox mcp` flags...]
//
// Each step is exactly
//   npx @modelcontextprotocol/inspector-cli --cli AGENTBOX mcp --state-dir DIR [FLAGS] --method tools/list
//   npx @modelcontextprotocol/inspector-cli --cli AGENTBOX mcp --state-dir DIR [FLAGS] --method tools/call \
//       --tool-name NAME --tool-arg key=value ...
// with the package's bin run directly by this Node (no npx lookup). The CLI prints the JSON-RPC
// result on stdout; this script parses it and checks the contract. Exits 1 with
// "inspector-loop: FAIL: ..." on the first failed assertion, after destroying the sandbox.
import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const [bin, stateDir, ...mcpFlags] = process.argv.slice(2);
if (!bin || !stateDir) {
  console.error("usage: node inspector-loop.mjs AGENTBOX_BINARY STATE_DIR [agentbox mcp flags, e.g. --cgroup-parent NAME]");
  process.exit(2);
}
const cli = join(here, "node_modules", "@modelcontextprotocol", "inspector-cli", "build", "cli.js");
if (!existsSync(cli)) {
  console.error(`inspector-loop: ${cli} is missing: run \`make test\` (or \`npm ci\` in ${here})`);
  process.exit(2);
}
// inspector-cli 1.0.3 picks the package.json it reports as its client identity by testing
// "../package.json" relative to the working directory, then imports it relative to its own
// module (modelcontextprotocol/inspector#1503): it crashes with ERR_MODULE_NOT_FOUND unless the
// working directory's parent has a package.json. node_modules/ (parent: our package.json) does.
const cwd = join(here, "node_modules");

const started = performance.now();
const ms = () => Math.round(performance.now() - started);
const log = (...a) => console.log(`[${String(ms()).padStart(6)} ms]`, ...a);

class AssertionFailed extends Error {}
function check(cond, msg, detail) {
  if (!cond) throw new AssertionFailed(msg + (detail === undefined ? "" : `\n  got: ${JSON.stringify(detail, null, 2)}`));
}

// inspect runs one inspector-cli process and returns its parsed JSON result.
function inspect(method, extra = []) {
  const argv = [cli, "--cli", bin, "mcp", "--state-dir", stateDir, ...mcpFlags, "--method", method, ...extra];
  const t = performance.now();
  const r = spawnSync(process.execPath, argv, { cwd, encoding: "utf8", timeout: 120_000, env: process.env });
  const took = Math.round(performance.now() - t);
  const shown = `node ${argv.map((a) => (/[\s"'$]/.test(a) ? `'${a}'` : a)).join(" ")}`;
  if (r.error || r.status !== 0) {
    throw new AssertionFailed(`${shown}\n  exited ${r.status ?? r.error} after ${took} ms\n  stdout: ${r.stdout}\n  stderr: ${r.stderr}`);
  }
  let out;
  try {
    out = JSON.parse(r.stdout);
  } catch (e) {
    throw new AssertionFailed(`${shown}\n  stdout is not JSON (${e.message}): ${r.stdout}\n  stderr: ${r.stderr}`);
  }
  log(`${method}${extra.length ? " " + extra.slice(1).join(" ").slice(0, 100) : ""}: ${took} ms`);
  return out;
}

// call runs tools/call and returns the result, checking its shape; a tool error (isError)
// fails unless allowError.
function call(name, args, { allowError = false } = {}) {
  const pairs = Object.entries(args).map(([k, v]) => `${k}=${typeof v === "string" ? v : JSON.stringify(v)}`);
  const res = inspect("tools/call", ["--tool-name", name, ...(pairs.length ? ["--tool-arg", ...pairs] : [])]);
  if (!allowError) check(!res.isError, `${name} returned isError`, res);
  check(res.structuredContent && typeof res.structuredContent === "object", `${name}: no structuredContent`, res);
  check(Array.isArray(res.content) && res.content.some((c) => c.type === "text" && c.text), `${name}: no text rendering in content`, res);
  return res;
}

const TOOLS = [
  "sandbox_create", "sandbox_list", "sandbox_get", "sandbox_destroy", "sandbox_extend",
  "exec", "file_write", "file_read", "file_list", "health",
];

let sandboxId;
try {
  // tools/list
  const { tools } = inspect("tools/list");
  const names = (tools ?? []).map((t) => t.name);
  for (const want of TOOLS) check(names.includes(want), `tools/list: ${want} is missing`, names);
  log(`tools/list: ${names.join(", ")}`);

  // A typed error: a result with isError and the code, and the CLI still exits 0.
  {
    const res = call("sandbox_get", { sandbox_id: "sb-000000000000" }, { allowError: true });
    check(res.isError === true && JSON.stringify(res.structuredContent).includes("SANDBOX_NOT_FOUND"),
      "sandbox_get of an unknown id: want isError with SANDBOX_NOT_FOUND", res);
  }

  // sandbox_create
  {
    const res = call("sandbox_create", { ttl_seconds: 600 });
    sandboxId = res.structuredContent.sandbox_id;
    check(typeof sandboxId === "string" && sandboxId && res.structuredContent.state === "running",
      "sandbox_create: want sandbox_id and state running", res.structuredContent);
    log(`sandbox_create: ${sandboxId} (${res.structuredContent.state})`);
  }

  // exec: argv array, env, cwd, stdin; a non-zero exit is a normal result.
  {
    const res = call("exec", {
      sandbox_id: sandboxId,
      command: ["sh", "-c", "echo \"$FOO\"; pwd; cat; echo to-stderr >&2; exit 3"],
      env: { FOO: "bar from inspector" },
      cwd: "/tmp",
      stdin: "piped via stdin\n",
      timeout_seconds: 60,
    });
    const sc = res.structuredContent;
    for (const f of ["exit_code", "signal", "stdout", "stderr", "truncated", "duration_ms", "timed_out"]) {
      check(f in sc, `exec: structuredContent lacks ${f}`, sc);
    }
    check(sc.exit_code === 3 && sc.timed_out === false && sc.truncated === false, "exec: want exit_code 3, not timed out, not truncated", sc);
    check(sc.stdout === "bar from inspector\n/tmp\npiped via stdin\n", "exec: wrong stdout (env, cwd or stdin lost)", sc.stdout);
    check(sc.stderr === "to-stderr\n", "exec: wrong stderr", sc.stderr);
    log(`exec: exit_code ${sc.exit_code}, ${sc.duration_ms} ms, stdout ${JSON.stringify(sc.stdout)}`);
  }

  // file_write then file_read
  {
    const text = "written by inspector-cli over stdio: ünïcödé\n";
    const w = call("file_write", { sandbox_id: sandboxId, path: "/workspace/inspector.txt", content: text, mode: "0640" });
    log(`file_write: ${JSON.stringify(w.structuredContent)}`);
    const r = call("file_read", { sandbox_id: sandboxId, path: "/workspace/inspector.txt" });
    check(r.structuredContent.content === text, "file_read: content differs from what file_write wrote", r.structuredContent);
    check(r.structuredContent.size === Buffer.byteLength(text), "file_read: size is not the file's byte length", r.structuredContent);
    log(`file_read: ${r.structuredContent.size} bytes, content matches`);
  }

  // sandbox_destroy
  {
    const res = call("sandbox_destroy", { sandbox_id: sandboxId });
    log(`sandbox_destroy: state ${res.structuredContent.state}`);
    sandboxId = undefined;
  }
  log("inspector-loop: PASS");
} catch (e) {
  console.error(`inspector-loop: FAIL: ${e instanceof AssertionFailed ? e.message : e?.stack || e}`);
  if (sandboxId) {
    try {
      call("sandbox_destroy", { sandbox_id: sandboxId }, { allowError: true });
    } catch (err) {
      console.error(`cleanup: sandbox_destroy ${sandboxId}: ${err.message}`);
    }
  }
  process.exit(1);
}
