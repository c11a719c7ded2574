// Benchmark of `rsim lsp` (not a test: it prints figures, asserts nothing):
// hover and diagnostics latency on a study of N nodes (default 1,000), as an editor sees them.
//   node tests/editor/bench.mjs [N] [samples]
// The study is grown through the server's own owner command (rsim.branch), then each figure is
// the round trip from the request (or didChange) to its answer (or publishDiagnostics).
import { spawn, execFileSync } from "node:child_process";
import { mkdtempSync, rmSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { pathToFileURL } from "node:url";
import * as rpc from "vscode-jsonrpc/node";
import * as lsp from "vscode-languageserver-protocol/node";

const N = Number(process.argv[2] ?? 1000);
const SAMPLES = Number(process.argv[3] ?? 100);
const ROOT = resolve(import.meta.dirname, "../..");
const RSIM = process.env.RSIM_BIN ? resolve(process.env.RSIM_BIN) : join(ROOT, "target/debug/rsim");

const dir = mkdtempSync(join(tmpdir(), "rsim-lsp-bench-"));
const study = join(dir, "study");
execFileSync(RSIM, ["init", study, "--example", "tiny-arith-ngram"], { stdio: "ignore" });
// Room for N nodes: the owner raises the budget on main, as a person would.
const cfgPath = join(study, "rsim.toml");
writeFileSync(cfgPath, readFileSync(cfgPath, "utf8").replace(/max_nodes = \d+/, `max_nodes = ${N + 10}`));
execFileSync("git", ["-C", study, "-c", "user.name=owner", "-c", "user.email=owner@localhost",
  "-c", "commit.gpgsign=false", "commit", "-q", "-am", "room for the benchmark"]);
const server = spawn(RSIM, ["-C", study, "lsp"], { stdio: ["pipe", "pipe", "inherit"] });
const conn = rpc.createMessageConnection(
  new rpc.StreamMessageReader(server.stdout),
  new rpc.StreamMessageWriter(server.stdin),
);
let diagWaiter = null;
conn.onNotification(lsp.PublishDiagnosticsNotification.type, (p) => diagWaiter?.(p));
conn.listen();
await conn.sendRequest(lsp.InitializeRequest.type, { processId: process.pid, rootUri: null, capabilities: {} });
await conn.sendNotification(lsp.InitializedNotification.type, {});

const t0 = performance.now();
for (let i = 1; i < N; i++) {
  const parent = i < 10 ? "n0" : `n${1 + Math.floor(Math.random() * (i - 1))}`;
  await conn.sendRequest(lsp.ExecuteCommandRequest.type, {
    command: "rsim.branch",
    arguments: [{ parents: [parent], title: `direction ${i}` }],
  });
}
const grow = (performance.now() - t0) / 1000;

const pct = (xs, p) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))];
};
const stats = (xs) => ({ p50: +pct(xs, 50).toFixed(2), p90: +pct(xs, 90).toFixed(2), max: +Math.max(...xs).toFixed(2) });

// Hover on node ids in a Markdown document.
const md = pathToFileURL(join(study, "NOTES.md")).href;
const ids = Array.from({ length: SAMPLES }, (_, i) => `n${Math.floor((i * 7919) % N)}`);
await conn.sendNotification(lsp.DidOpenTextDocumentNotification.type, {
  textDocument: { uri: md, languageId: "markdown", version: 1, text: ids.join("\n") + "\n" },
});
const hoverNode = [];
for (let i = 0; i < SAMPLES; i++) {
  const t = performance.now();
  const h = await conn.sendRequest(lsp.HoverRequest.type, { textDocument: { uri: md }, position: { line: i, character: 1 } });
  hoverNode.push(performance.now() - t);
  if (!h) throw new Error(`no hover for ${ids[i]}`);
}

// rsim.toml: hover on a key, and diagnostics after each change (alternately wrong and right).
const toml = pathToFileURL(join(study, "rsim.toml")).href;
const good = readFileSync(join(study, "rsim.toml"), "utf8");
const bad = good.replace("[budgets]", "[budgets]\nevaluatoins = 3");
await conn.sendNotification(lsp.DidOpenTextDocumentNotification.type, {
  textDocument: { uri: toml, languageId: "toml", version: 1, text: good },
});
const line = good.split("\n").findIndex((l) => l.startsWith("[budgets]"));
const hoverKey = [];
for (let i = 0; i < SAMPLES; i++) {
  const t = performance.now();
  await conn.sendRequest(lsp.HoverRequest.type, { textDocument: { uri: toml }, position: { line, character: 3 } });
  hoverKey.push(performance.now() - t);
}
const diags = [];
for (let i = 0; i < SAMPLES; i++) {
  const wrong = i % 2 === 0;
  const got = new Promise((res) => (diagWaiter = res));
  const t = performance.now();
  await conn.sendNotification(lsp.DidChangeTextDocumentNotification.type, {
    textDocument: { uri: toml, version: i + 2 },
    contentChanges: [{ text: wrong ? bad : good }],
  });
  const p = await got;
  diags.push(performance.now() - t);
  if ((p.diagnostics.length === 1) !== wrong) throw new Error("unexpected diagnostics");
}

const dagT = [];
for (let i = 0; i < 5; i++) {
  const t = performance.now();
  await conn.sendRequest("rsim/dag", {});
  dagT.push(performance.now() - t);
}

console.log(JSON.stringify({
  nodes: N, samples: SAMPLES, binary: RSIM, grow_s: +grow.toFixed(1),
  hover_node_ms: stats(hoverNode), hover_config_key_ms: stats(hoverKey),
  diagnostics_ms: stats(diags), dag_layout_ms: stats(dagT),
}, null, 2));
await conn.sendRequest(lsp.ShutdownRequest.type);
await conn.sendNotification(lsp.ExitNotification.type);
conn.dispose();
server.kill();
rmSync(dir, { recursive: true, force: true });
