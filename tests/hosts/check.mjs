// Checks one host run (tools/hosts.sh): what the scripted model saw (its request log) and what rsim
// recorded (`rsim log --json`, git). Prints `ok …` / `FAIL …` lines; exits 1 on any failure.
//   node check.mjs --label L --model-log FILE --rsim RSIM --study DIR --agent NAME [--campaign [--reviewer-host]]
import fs from "node:fs";
import { execFileSync } from "node:child_process";

const argv = process.argv.slice(2);
const opt = (k) => {
  const i = argv.indexOf(`--${k}`);
  return i >= 0 ? argv[i + 1] : undefined;
};
const label = opt("label");
const agent = opt("agent");
let failed = 0;
const ok = (m) => console.log(`ok   ${label}: ${m}`);
const fail = (m, why) => {
  failed++;
  console.log(`FAIL ${label}: ${m}${why ? ` — ${why}` : ""}`);
};
const check = (c, m, why) => (c ? ok(m) : fail(m, why));
const short = (v) => (typeof v === "string" ? v : JSON.stringify(v)).slice(0, 300);

const reqs = fs.existsSync(opt("model-log"))
  ? fs.readFileSync(opt("model-log"), "utf8").trim().split("\n").filter(Boolean).map((l) => JSON.parse(l))
  : [];
const main = reqs.filter((r) => r.main);
const unknown = reqs.filter((r) => r.api === "unknown" || r.api === "error");
check(!unknown.length, "the host asked the model endpoint only what it serves", short(unknown.map((r) => `${r.method ?? ""} ${r.path} ${r.error ?? ""}`)));
if (!main.length) {
  fail("the host sent the model a request offering rsim's tools", `${reqs.length} requests, none with rsim tools`);
  process.exit(1);
}
if (argv.includes("--campaign")) campaign();
const lastReq = main[main.length - 1];
const calls = lastReq.calls ?? [];
const want = ["list_nodes", "branch", "branch", "register_dataset", "run_sft", "wait_job", "evaluate", "conclude"];
check(JSON.stringify(calls.map((c) => c.tool)) === JSON.stringify(want), "the host ran every scripted tool call once, in order, and sent each result back", short(calls.map((c) => c.tool)));
const answered = lastReq.answer?.type === "text" || typeof lastReq.answer?.text === "string" || lastReq.answer?.type === "message";
check(answered, "the turn ended with the model's final text", short(lastReq.answer));
calls.forEach((c, i) => {
  if (i === 2) return;
  const bad = c.error || /^(not found|invalid|rejected|error|rule |unknown)/im.test(c.text) || /requires approval|not allowed|denied/i.test(c.text);
  check(!bad, `${c.tool} answered with a result`, short(c.text));
});
const badCall = calls[2];
if (badCall) {
  check(/no node n999/.test(badCall.text), "the bad call (branch from n999) came back to the model as rsim's error text", short(badCall.text));
  // Claude Code and Gemini CLI flag the result as an error; Codex hands the model the error text alone.
  if (lastReq.api !== "responses") check(badCall.error, "the bad call's result is flagged as an error", short(badCall.raw ?? badCall));
}

// The record.
const rsim = opt("rsim");
const study = opt("study");
const log = JSON.parse(execFileSync(rsim, ["-C", study, "log", "--json", "--limit", "1000"], { encoding: "utf8" }));
const mine = log.actions.filter((a) => a.agent === agent).reverse();
const others = log.actions.filter((a) => a.agent !== agent && a.agent !== "owner");
const recorded = ["branch", "register_dataset", "run_sft", "evaluate", "conclude"];
check(JSON.stringify(mine.map((a) => a.action)) === JSON.stringify(recorded), `rsim log: each action once under agent ${agent}`, short(mine.map((a) => `${a.action}/${a.decision}`)));
check(mine.every((a) => a.decision === "accepted" && a.role === "worker"), "rsim log: every action accepted, role worker", short(mine.map((a) => `${a.action}/${a.decision}/${a.role}`)));
check(new Set(mine.map((a) => a.node)).size === 1, "rsim log: one node for the whole turn", short(mine.map((a) => a.node)));
check(!others.length, "rsim log: no action under another agent's name", short(others.map((a) => `${a.agent}:${a.action}`)));
const authors = execFileSync("git", ["-C", study, "log", "--all", "--format=%an"], { encoding: "utf8" }).trim().split("\n");
check(authors.filter((a) => a === agent).length === recorded.length, `git log: ${recorded.length} commits by ${agent}`, short(authors));
process.exit(failed ? 1 : 0);

// `rsim run --worker 'cmd:HOST …'`: every Worker turn (one conversation per node) made its calls once,
// without an error, and the record holds each worker node's actions once under the turn's agent.
function campaign() {
  const want = ["get_node", "register_dataset", "run_sft", "wait_job", "evaluate", "conclude"];
  // A turn's last request holds its whole conversation: the one whose calls are complete.
  const turns = main.filter((r) => (r.calls ?? []).length === want.length);
  const n = Number(opt("experiments"));
  check(turns.length === n, `${n} Worker turns ran the whole scripted turn`, `${turns.length} of ${main.length} main requests complete`);
  for (const r of turns) {
    const seq = r.calls.map((c) => c.tool);
    check(JSON.stringify(seq) === JSON.stringify(want), `turn on ${r.calls[0]?.args?.node}: every call once, in order`, short(seq));
    const bad = r.calls.filter((c) => c.error || /^(not found|invalid|rejected|error|rule )/im.test(c.text));
    check(!bad.length, `turn on ${r.calls[0]?.args?.node}: no call answered with an error`, short(bad.map((c) => `${c.tool}: ${c.text}`)));
  }
  const log = JSON.parse(execFileSync(opt("rsim"), ["-C", opt("study"), "log", "--json", "--limit", "5000"], { encoding: "utf8" }));
  const byWorkers = log.actions.filter((a) => a.role === "worker");
  const nodes = [...new Set(byWorkers.map((a) => a.node))];
  check(nodes.length === n, `rsim log: workers acted on ${n} nodes`, short(nodes));
  for (const node of nodes) {
    const acts = byWorkers.filter((a) => a.node === node).reverse();
    const ok1 = JSON.stringify(acts.map((a) => a.action)) === JSON.stringify(["register_dataset", "run_sft", "evaluate", "conclude"]);
    check(ok1 && new Set(acts.map((a) => a.agent)).size === 1 && acts.every((a) => a.decision === "accepted"), `rsim log: node ${node}: each worker action once, accepted, under one agent`, short(acts.map((a) => `${a.agent}:${a.action}/${a.decision}`)));
  }
  const runs = log.actions.filter((a) => a.action === "run_sft" && a.decision === "accepted");
  check(runs.length === n, `rsim log: ${n} training runs in the campaign`, `${runs.length}`);
  if (argv.includes("--reviewer-host")) reviewerHost(log, nodes);
  process.exit(failed ? 1 : 0);
}

// `rsim run --reviewer 'cmd:HOST …'`: the host wrote the campaign's reviews through the `review` tool —
// the opening's directions and a verdict on every node a Worker trained — and the orchestrator branched
// the nodes the Workers worked on from its proposals, as it does the built-in reviewer's.
function reviewerHost(log, workerNodes) {
  const sent = main.flatMap((r) => (r.calls ?? []).filter((c) => c.tool === "review"));
  // A conversation's requests repeat its earlier calls: one review per distinct request sent.
  const reviews = [...new Map(sent.map((c) => [JSON.stringify(c.args), c])).values()];
  check(reviews.length >= 2, "the host's Reviewer turns each wrote a review (the opening and at least one with verdicts)", `${reviews.length}`);
  const bad = reviews.filter((c) => c.error || /^(not found|invalid|rejected|forbidden|error|rule )/im.test(c.text));
  check(!bad.length, "every review the host sent was accepted", short(bad.map((c) => c.text)));
  const recorded = log.actions.filter((a) => a.action === "review");
  check(recorded.length === reviews.length && recorded.every((a) => a.decision === "accepted" && a.role === "reviewer" && a.agent === "reviewer-command"),
    "rsim log: each review once, accepted, role reviewer, agent reviewer-command", short(recorded.map((a) => `${a.agent}/${a.role}:${a.decision} ${a.summary}`)));
  const judged = new Set(reviews.flatMap((c) => (c.args.verdicts ?? []).map((v) => v.node)));
  const unjudged = workerNodes.filter((x) => !judged.has(x));
  check(!unjudged.length, "the host gave a verdict on every node a Worker trained", `unjudged: ${short(unjudged)}`);
  const proposed = new Set(reviews.flatMap((c) => (c.args.proposals ?? []).map((p) => p.title)));
  for (const node of workerNodes) {
    const info = JSON.parse(execFileSync(opt("rsim"), ["-C", opt("study"), "--json", "show", node], { encoding: "utf8" }));
    check(proposed.has(info.title) && /proposal: n\d+\/\d+#\d+/.test(info.hypothesis ?? ""),
      `node ${node} was branched by the orchestrator from one of the host's proposals`, short(`${info.title} | ${info.hypothesis}`));
  }
}
