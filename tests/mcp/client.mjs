#!/usr/bin/env node
// rsim's MCP face through the official TypeScript SDK client (@modelcontextprotocol/sdk, pinned in
// package.json). Connects over streamable HTTP (--url URL) or stdio (--rsim BIN --study DIR), lists
// tools, calls every tool with good arguments in a research-like order and with bad ones, checks
// progress notifications and request cancellation (notifications/cancelled), resources and prompts.
// A reviewer connects over stdio for `review`.
//
// Prints one line per check and ends with `RESULT passed=N failed=M`; exits 1 on any failure.
import { parseArgs } from "node:util";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const { values: args } = parseArgs({
  options: {
    url: { type: "string" },
    rsim: { type: "string" },
    study: { type: "string" },
    tag: { type: "string", default: "ts" },
    steps: { type: "string", default: "4000" },
  },
});
if (!args.rsim || !args.study) {
  console.error("usage: client.mjs [--url URL] --rsim BIN --study DIR [--tag T] [--steps N]");
  process.exit(2);
}

const WRITERS = ["branch", "register_dataset", "run_sft", "evaluate", "compare", "review", "conclude", "cancel_job"];
const QUERIES = ["get_node", "list_nodes", "dag", "log", "diff", "get_job", "wait_job"];
// A worker lists every tool but `review` (tests/MCP_CONTRACT.md, "Roles").
const EXPECTED = new Set([...WRITERS, ...QUERIES].filter((n) => n !== "review"));
const label = `ts ${args.url ? "http" : "stdio"}`;
let passed = 0;
let failed = 0;

const short = (v, n = 300) => {
  const s = typeof v === "string" ? v : JSON.stringify(v);
  return s && s.length > n ? s.slice(0, n) + "…" : s;
};
const t0 = Date.now();
const at = () => `${((Date.now() - t0) / 1000).toFixed(1)}s`;
function ok(name) {
  passed++;
  console.log(`ok   [${label}] ${name} (${at()})`);
}
function fail(name, why) {
  failed++;
  console.log(`FAIL [${label}] ${name} (${at()}): ${why}`);
}
function check(name, cond, why = "assertion failed") {
  cond ? ok(name) : fail(name, why);
  return cond;
}
const textOf = (r) => (r.content ?? []).map((c) => c.text ?? "").join("\n");

function stdioTransport(role) {
  return new StdioClientTransport({
    command: args.rsim,
    args: ["mcp", "--study", args.study, "--role", role, "--agent", `${args.tag}-${role}`],
    stderr: "inherit",
  });
}

async function connect(role) {
  const client = new Client({ name: `rsim-test-${args.tag}`, version: "1.0.0" });
  const transport = args.url && role === "worker" ? new StreamableHTTPClientTransport(new URL(args.url)) : stdioTransport(role);
  await client.connect(transport);
  return client;
}

async function good(client, name, tool, toolArgs, opts = {}) {
  let r;
  try {
    r = await client.callTool({ name: tool, arguments: toolArgs }, undefined, { timeout: 120_000, ...opts });
  } catch (e) {
    fail(name, `${tool} threw ${e?.name}: ${e?.message}`);
    return null;
  }
  if (r.isError) {
    fail(name, `${tool} returned isError: ${short(textOf(r))}`);
    return null;
  }
  const sc = r.structuredContent;
  if (!sc || typeof sc !== "object") {
    fail(name, `${tool} returned no structuredContent: ${short(textOf(r))}`);
    return null;
  }
  let same = false;
  try {
    same = JSON.stringify(JSON.parse(textOf(r))) === JSON.stringify(sc);
  } catch {}
  if (!same) {
    fail(name, `${tool}: the text content is not the structured content as JSON`);
    return null;
  }
  return sc;
}

async function bad(client, name, tool, toolArgs, ...needles) {
  let r;
  try {
    r = await client.callTool({ name: tool, arguments: toolArgs });
  } catch (e) {
    fail(name, `expected an isError result, got ${e?.name}: ${e?.message}`);
    return;
  }
  const msg = textOf(r);
  const missing = needles.filter((n) => !msg.toLowerCase().includes(n.toLowerCase()));
  if (!r.isError) fail(name, `expected isError, got success: ${short(msg)}`);
  else if (missing.length) fail(name, `error message does not name ${missing}: ${short(msg)}`);
  else if (r.structuredContent !== undefined) fail(name, `an error result carries structuredContent`);
  else ok(name);
}

// run_sft / evaluate: the final recorded result (through wait_job when still running) and the
// number of progress notifications.
async function longJob(client, name, tool, toolArgs) {
  // Progress per request (the tool, then wait_job): MCP requires the value to increase.
  const progress = [[], []];
  const opts = (i) => ({ onprogress: (p) => progress[i].push(p.progress), resetTimeoutOnProgress: true });
  const count = () => progress[0].length + progress[1].length;
  let sc = await good(client, name, tool, toolArgs, opts(0));
  if (sc && sc.status === "running" && sc.job) {
    sc = await good(client, name, "wait_job", { job: sc.job, timeout_s: 300 }, opts(1));
  }
  const bad = progress.find((v) => v.some((p, i) => i > 0 && p <= v[i - 1]));
  if (sc && bad) {
    fail(name, `progress values of one request do not increase: ${bad}`);
    return [null, count()];
  }
  return [sc, count()];
}

async function flow(client) {
  const t = args.tag;
  const { tools } = await client.listTools();
  const names = new Set(tools.map((x) => x.name));
  const missing = [...EXPECTED].filter((n) => !names.has(n));
  const extra = [...names].filter((n) => !EXPECTED.has(n));
  check("tools/list gives a worker exactly its tools", !missing.length && !extra.length, `missing ${missing}, unexpected ${extra}`);
  const noSchema = tools.filter((x) => x.inputSchema?.type !== "object" || !x.outputSchema).map((x) => x.name);
  check("every tool has an object input schema and an output schema", !noSchema.length, `${noSchema}`);

  const b = await good(client, "branch a node from the root", "branch", { parents: ["n0"], title: `${t} plain format` });
  const b2 = await good(client, "branch a sibling for comparison", "branch", { parents: ["n0"], title: `${t} scratchpad format` });
  if (!b) return fail("the rest of the flow", "no node to work on");
  const node = b.node;
  const reg = await good(client, "register_dataset (inline rows)", "register_dataset", {
    node,
    name: `${t}-inline`,
    // Three-digit sums: the study's protected test split is two-digit addition, so no row is contaminated.
    source: { kind: "inline", rows: Array.from({ length: 50 }, (_, i) => ({ prompt: `${i + 110}+${i + 221}=`, answer: `${2 * i + 331}` })) },
  });
  if (reg) check("register_dataset keeps every clean inline row", reg.rows === 50, short(reg));
  const [sft, nProgress] = await longJob(client, "run_sft (with wait_job if still running)", "run_sft", {
    node,
    base: "base",
    datasets: [`${t}-inline`],
    learning_rate: 0.001,
    steps: Number(args.steps),
    batch_size: 16,
  });
  const ck = sft?.checkpoint;
  if (sft) check("run_sft records a succeeded job and a checkpoint", sft.job?.state === "succeeded" && /^[0-9a-f]{64}$/.test(ck ?? ""), short(sft));
  check("progress notifications arrive for run_sft/wait_job with a progressToken", nProgress > 0, "no notifications/progress received");
  if (ck) {
    const [ev] = await longJob(client, "evaluate on dev", "evaluate", { node, checkpoint: ck, task: "add2", split: "dev" });
    if (ev) {
      const em = ev.metrics?.exact_match;
      check("evaluate reports exact_match in [0, 1]", typeof em === "number" && em >= 0 && em <= 1, short(ev));
      const gj = await good(client, "get_job", "get_job", { job: ev.job.id });
      if (gj) check("get_job gives the recorded job", gj.node === node && gj.job?.state === "succeeded", short(gj));
    }
  }
  if (b2) {
    const cmp = await good(client, "compare", "compare", { node: "n0", nodes: [node, b2.node], task: "add2" });
    if (cmp) check("compare has one row per node", cmp.rows?.length === 2, short(cmp));
  }
  const gn = await good(client, "get_node", "get_node", { node });
  if (gn) check("get_node gives the node", gn.id === node && gn.parents?.includes("n0"), short(gn));
  const ln = await good(client, "list_nodes", "list_nodes", { status: "open", limit: 500 });
  if (ln) check("list_nodes (open) includes the node", ln.nodes?.some((n) => n.id === node), short(ln));
  const dg = await good(client, "dag children of n0", "dag", { view: "children", node: "n0" });
  if (dg) check("dag children of n0 include the node", dg.nodes?.some((n) => n.id === node), short(dg));
  const lg = await good(client, "log", "log", { node, limit: 10 });
  if (lg) check("log shows the node's actions", lg.actions?.length >= 3, short(lg));
  const conc = await good(client, "conclude", "conclude", { node, outcome: "inconclusive", findings: `${t}: one seed only.` });
  if (conc) check("conclude marks the node concluded", conc.status === "concluded", short(conc));
  await bad(client, "acting on a concluded node is refused", "register_dataset", {
    node,
    name: `${t}-late`,
    source: { kind: "arith", op: "add", digits: 2, format: "plain", n: 10, seed: 3 },
  }, "node-concluded");

  if (b2) await cancelByRequest(client, b2.node);

  // Bad arguments.
  await bad(client, "unknown field is rejected, naming it", "conclude", { node, outcome: "positive", findings: "x", extra_field: 1 }, "extra_field");
  await bad(client, "wrong type is rejected, naming the field", "list_nodes", { limit: "ten" }, "limit");
  await bad(client, "missing field is rejected, naming it", "evaluate", { node, checkpoint: "base", task: "add2" }, "split");
  await bad(client, "enum violation is rejected, naming the field", "conclude", { node, outcome: "great", findings: "x" }, "outcome");
  await bad(client, "worker calling review is refused by rule `role`", "review", { node: "n0", summary: "no" }, "role");
  try {
    const r = await client.callTool({ name: "no_such_tool", arguments: {} });
    fail("unknown tool is JSON-RPC error -32602 naming it", `a tool result instead: ${short(r)}`);
  } catch (e) {
    check("unknown tool is JSON-RPC error -32602 naming it", e?.code === -32602 && String(e?.message).includes('unknown tool "no_such_tool"'), `${e?.code} ${e?.message}`);
  }

  // Resources and prompts.
  try {
    const { resources } = await client.listResources();
    check("resources/list includes rsim://dag", resources.some((r) => r.uri === "rsim://dag"), short(resources));
    const dag = JSON.parse((await client.readResource({ uri: "rsim://dag" })).contents[0].text);
    check("read rsim://dag gives the DAG as JSON", dag.nodes?.some((n) => n.id === node), short(dag));
    const nd = JSON.parse((await client.readResource({ uri: `rsim://node/${node}` })).contents[0].text);
    check("read rsim://node/{id} gives the node", nd.id === node, short(nd));
  } catch (e) {
    fail("resources", `${e?.name}: ${e?.message}`);
  }
  try {
    const { prompts } = await client.listPrompts();
    check("prompts/list gives worker and reviewer", ["worker", "reviewer"].every((n) => prompts.some((p) => p.name === n)), short(prompts));
    const p = await client.getPrompt({ name: "worker" });
    check("prompts/get worker gives the role instructions", p.messages.map((m) => m.content?.text ?? "").join(" ").length > 200, short(p));
  } catch (e) {
    fail("prompts", `${e?.name}: ${e?.message}`);
  }
}

// Aborting the run_sft request sends notifications/cancelled: the job must stop and be recorded as
// cancelled.
async function cancelByRequest(client, node) {
  const reg = await good(client, "register_dataset for the cancelled run", "register_dataset", {
    node,
    name: `${args.tag}-pad`,
    source: { kind: "arith", op: "add", digits: 2, format: "scratchpad", n: 200, seed: 4 },
  });
  if (!reg) return;
  // A connection of its own whose run_sft keeps the request open (--job-wait 120), so the abort, not
  // the short wait, ends the call; aborted once the job is training (a progress line `step …`).
  const canceller = new Client({ name: `rsim-test-${args.tag}-canceller`, version: "1.0.0" });
  await canceller.connect(
    new StdioClientTransport({
      command: args.rsim,
      args: ["mcp", "--study", args.study, "--agent", `${args.tag}-canceller`, "--job-wait", "120"],
      stderr: "inherit",
    }),
  );
  const ac = new AbortController();
  const timer = setTimeout(() => ac.abort("test cancels the request (no step progress within 60 s)"), 60_000);
  const onprogress = (p) => {
    if (String(p.message ?? "").startsWith("step ")) ac.abort("test cancels the request");
  };
  try {
    const r = await canceller.callTool(
      { name: "run_sft", arguments: { node, base: "base", datasets: [`${args.tag}-pad`], learning_rate: 0.001, steps: 10_000_000, batch_size: 16 } },
      undefined,
      { signal: ac.signal, onprogress, timeout: 120_000 },
    );
    fail("aborting a running run_sft request rejects the call", `answered before the abort: ${short(r.structuredContent ?? r)}`);
    await canceller.close().catch(() => {});
    return;
  } catch (e) {
    check("aborting a running run_sft request rejects the call", ac.signal.aborted, `${e?.name}: ${e?.message}`);
  } finally {
    clearTimeout(timer);
  }
  // The canceller stays connected until the cancellation is recorded (closing a stdio server kills it).
  try {
    await recordedCancelled(client, node);
  } finally {
    await canceller.close().catch(() => {});
  }
}

async function recordedCancelled(client, node) {
  const deadline = Date.now() + 30_000;
  let last = null;
  while (Date.now() < deadline) {
    const lg = await good(client, "log while waiting for the cancelled job", "log", { node, limit: 20 });
    last = lg?.actions?.find((a) => a.action === "run_sft");
    if (last?.job) {
      const gj = await good(client, "get_job of the cancelled job", "get_job", { job: last.job });
      if (gj) {
        check("a run_sft whose request was cancelled is recorded as cancelled", gj.job?.state === "cancelled", short(gj));
        return;
      }
    }
    await new Promise((r) => setTimeout(r, 300));
  }
  fail("a run_sft whose request was cancelled is recorded as cancelled", `not recorded within 30 s: ${short(last)}`);
}

async function reviewer() {
  let rev;
  try {
    rev = await connect("reviewer");
    const sc = await good(rev, "review by a reviewer (stdio)", "review", {
      node: "n0",
      summary: `${args.tag}: early comparison of answer formats.`,
      proposals: [{ parents: ["n0"], title: `${args.tag} reversed format`, hypothesis: "Reversed digits ease carries." }],
    });
    if (sc) check("review is recorded with a commit", /^[0-9a-f]{40}$/.test(sc.commit ?? ""), short(sc));
  } catch (e) {
    fail("reviewer connection over stdio", `${e?.name}: ${e?.message}`);
  } finally {
    await rev?.close();
  }
}

let client;
try {
  client = await connect("worker");
  ok("connect and initialize");
  const caps = client.getServerCapabilities() ?? {};
  check("server declares tools, resources and prompts", caps.tools && caps.resources && caps.prompts, short(caps));
  await flow(client);
} catch (e) {
  fail("session", `${e?.name}: ${e?.message}\n${e?.stack}`);
} finally {
  await client?.close().catch(() => {});
}
await reviewer();
console.log(`RESULT passed=${passed} failed=${failed}`);
process.exit(failed ? 1 : 0);
