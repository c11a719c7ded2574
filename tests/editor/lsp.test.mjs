// A conversation with the real `rsim lsp` over stdio, as an editor has it (vscode-jsonrpc and
// vscode-languageserver-protocol, the libraries VS Code's client is built on):
// initialize, diagnostics, hover, completion, each custom request, owner commands, malformed
// input, and rsim/recordChanged arriving while another rsim process writes the record.
//
// RSIM_BIN: the rsim binary (default target/debug/rsim from the repository root).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn, execFileSync } from "node:child_process";
import { mkdtempSync, rmSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { pathToFileURL } from "node:url";
import * as rpc from "vscode-jsonrpc/node";
import * as lsp from "vscode-languageserver-protocol/node";

const ROOT = resolve(import.meta.dirname, "../..");
const RSIM = process.env.RSIM_BIN ? resolve(process.env.RSIM_BIN) : join(ROOT, "target/debug/rsim");
let dir, study, server, conn;
const notes = [];

function waitFor(pred, ms = 20000) {
  return new Promise((res, rej) => {
    const t0 = Date.now();
    const tick = () => {
      const i = notes.findIndex(pred);
      if (i >= 0) return res(notes.splice(i, 1)[0]);
      if (Date.now() - t0 > ms) return rej(new Error("timed out waiting for a notification"));
      setTimeout(tick, 25);
    };
    tick();
  });
}

before(async () => {
  dir = mkdtempSync(join(tmpdir(), "rsim-lsp-"));
  study = join(dir, "study");
  execFileSync(RSIM, ["init", study, "--example", "tiny-arith-ngram"], { stdio: "ignore" });
  server = spawn(RSIM, ["lsp"], { cwd: dir, stdio: ["pipe", "pipe", "pipe"] });
  server.stderr.on("data", (d) => process.stderr.write(d));
  conn = rpc.createMessageConnection(
    new rpc.StreamMessageReader(server.stdout),
    new rpc.StreamMessageWriter(server.stdin),
  );
  conn.onNotification((method, params) => notes.push({ method, params }));
  conn.onRequest(() => null);
  conn.listen();
  const init = await conn.sendRequest(lsp.InitializeRequest.type, {
    processId: process.pid,
    rootUri: null,
    capabilities: {},
    workspaceFolders: [{ uri: pathToFileURL(study).href, name: "study" }],
  });
  assert.equal(init.serverInfo.name, "rsim");
  assert.ok(init.capabilities.hoverProvider);
  assert.deepEqual(init.capabilities.executeCommandProvider.commands.sort(), [
    "rsim.branch", "rsim.cancelJob", "rsim.compare", "rsim.conclude",
  ]);
  await conn.sendNotification(lsp.InitializedNotification.type, {});
});

after(async () => {
  try {
    await conn.sendRequest(lsp.ShutdownRequest.type);
    await conn.sendNotification(lsp.ExitNotification.type);
  } catch {}
  conn.dispose();
  server.kill();
  rmSync(dir, { recursive: true, force: true });
});

test("rsim.toml: a wrong key gets its diagnostic on its exact range; hover and completion", async () => {
  const uri = pathToFileURL(join(study, "rsim.toml")).href;
  const good = readFileSync(join(study, "rsim.toml"), "utf8");
  const bad = good.replace("[budgets]", "[budgets]\nevaluatoins = 3");
  assert.notEqual(bad, good, "the example has a [budgets] table");
  await conn.sendNotification(lsp.DidOpenTextDocumentNotification.type, {
    textDocument: { uri, languageId: "toml", version: 1, text: bad },
  });
  const d = await waitFor((n) => n.method === "textDocument/publishDiagnostics" && n.params.uri === uri);
  assert.equal(d.params.diagnostics.length, 1);
  const diag = d.params.diagnostics[0];
  const line = bad.split("\n").findIndex((l) => l.startsWith("evaluatoins"));
  assert.deepEqual(diag.range, { start: { line, character: 0 }, end: { line, character: 11 } });
  assert.match(diag.message, /unknown field `evaluatoins`/);
  // Fixed: the diagnostic goes away.
  await conn.sendNotification(lsp.DidChangeTextDocumentNotification.type, {
    textDocument: { uri, version: 2 }, contentChanges: [{ text: good }],
  });
  const ok = await waitFor((n) => n.method === "textDocument/publishDiagnostics" && n.params.uri === uri);
  assert.deepEqual(ok.params.diagnostics, []);
  const bline = good.split("\n").findIndex((l) => l.startsWith("[budgets]"));
  const hover = await conn.sendRequest(lsp.HoverRequest.type, {
    textDocument: { uri }, position: { line: bline, character: 3 },
  });
  assert.match(hover.contents.value, /\*\*budgets\*\*/);
  const text = good + "\n[policy]\nsandbox = ";
  await conn.sendNotification(lsp.DidChangeTextDocumentNotification.type, {
    textDocument: { uri, version: 3 }, contentChanges: [{ text }],
  });
  const lines = text.split("\n");
  const items = await conn.sendRequest(lsp.CompletionRequest.type, {
    textDocument: { uri }, position: { line: lines.length - 1, character: lines.at(-1).length },
  });
  assert.deepEqual(items.map((i) => i.label).sort(), ['"best-effort"', '"off"', '"required"']);
});

test("node ids: hover, definition, the node document, workspace symbols", async () => {
  const uri = pathToFileURL(join(study, "NOTES.md")).href;
  await conn.sendNotification(lsp.DidOpenTextDocumentNotification.type, {
    textDocument: { uri, languageId: "markdown", version: 1, text: "The base is n0.\n" },
  });
  const pos = { textDocument: { uri }, position: { line: 0, character: 13 } };
  const h = await conn.sendRequest(lsp.HoverRequest.type, pos);
  assert.match(h.contents.value, /\*\*n0\*\*/);
  assert.match(h.contents.value, /verdict: not reviewed/);
  const def = await conn.sendRequest(lsp.DefinitionRequest.type, pos);
  assert.equal(def.uri, "rsim://node/n0");
  const doc = await conn.sendRequest("rsim/nodeDocument", { uri: "rsim://node/n0" });
  assert.match(doc.text, /^# n0/);
  const syms = await conn.sendRequest(lsp.WorkspaceSymbolRequest.type, { query: "" });
  assert.ok(syms.some((s) => s.name.startsWith("n0")));
});

test("each custom request answers; unknown ones and bad params are errors", async () => {
  const dag = await conn.sendRequest("rsim/dag", {});
  assert.ok(dag.nodes.some((n) => n.id === "n0"));
  assert.equal(dag.total, dag.shown);
  const node = await conn.sendRequest("rsim/node", { node: "n0" });
  assert.equal(node.node.id, "n0");
  assert.equal(node.card.id, "n0");
  const log = await conn.sendRequest("rsim/log", { node: "n0" });
  assert.equal(log.actions[0].action, "init");
  const cmp = await conn.sendRequest("rsim/compare", { nodes: ["n0"] });
  assert.equal(cmp.nodes[0].node, "n0");
  assert.equal(cmp.task, "add2");
  const jobs = await conn.sendRequest("rsim/jobs", {});
  assert.ok(Array.isArray(jobs));
  const sum = await conn.sendRequest("rsim/summary", {});
  assert.ok(sum.nodes.some((n) => n.id === "n0" && n.group === "frontier"));
  const st = await conn.sendRequest("rsim/status", {});
  assert.equal(st.study, study);
  await assert.rejects(conn.sendRequest("rsim/jobLog", { job: "../../../etc/passwd" }));
  await assert.rejects(conn.sendRequest("rsim/nodeDocument", { uri: "rsim://node/../.." }), /rsim:\/\/node/);
  await assert.rejects(conn.sendRequest("rsim/nonesuch", {}), (e) => e.code === -32601);
  await assert.rejects(
    conn.sendRequest(lsp.ExecuteCommandRequest.type, { command: "rsim.branch", arguments: [{ parents: ["n0"] }] }),
    (e) => e.code === -32602 && /title/.test(e.message),
  );
});

test("a malformed message gets a parse error and the server keeps serving", async () => {
  // Raw bytes on the server's stdin, outside the library's framing.
  server.stdin.write("Content-Length: 9\r\n\r\n{not json");
  server.stdin.write("Content-Length: 5\r\n\r\n[1,2]");
  const st = await conn.sendRequest("rsim/status", {});
  assert.equal(st.study, study);
});

test("rsim/recordChanged arrives while another rsim process writes, and owner commands are recorded", async () => {
  notes.length = 0;
  execFileSync(RSIM, ["-C", study, "branch", "--from", "n0", "--title", "from another process"], { stdio: "ignore" });
  await waitFor((n) => n.method === "rsim/recordChanged");
  notes.length = 0;
  const r = await conn.sendRequest(lsp.ExecuteCommandRequest.type, {
    command: "rsim.branch", arguments: [{ parents: ["n0"], title: "from the editor" }],
  });
  assert.match(r.node, /^n\d+$/);
  await waitFor((n) => n.method === "rsim/recordChanged");
  const log = JSON.parse(execFileSync(RSIM, ["-C", study, "--json", "log", "--node", r.node]));
  const actions = log.actions ?? log;
  assert.equal(actions[0].action, "branch");
  assert.equal(actions[0].role, "owner");
});
