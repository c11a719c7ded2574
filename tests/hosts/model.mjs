// A scripted model endpoint on loopback standing in for a host's model API (test code: the hosts and
// rsim are real). One process serves the three APIs the hosts speak:
//   - Anthropic Messages   POST /v1/messages (streaming and not), /v1/messages/count_tokens (Claude Code)
//   - OpenAI Responses     POST /v1/responses (streaming; Codex CLI)
//   - Gemini               POST /v1beta/models/M:streamGenerateContent | :generateContent | :countTokens
// Each request of the agent's main loop (one that offers rsim's tools) is answered with the next tool
// call of a Worker's turn, computed from the tool results the host sent back (the node `branch`
// returned, the job `run_sft` started, the checkpoint it recorded), then a final text. Requests that
// offer no rsim tool (titles, summaries, next-speaker checks) get a short text or JSON answer.
//
//   node model.mjs --log FILE.jsonl [--tag TAG] [--script worker|campaign]
// prints `model: listening on http://127.0.0.1:PORT` on stdout. Every request is appended to the log
// as one JSON line ({api, path, main, calls, answer}); the last main request's `calls` is the whole
// turn as the model saw it: every tool call with the result text and error flag the host sent back.
import http from "node:http";
import fs from "node:fs";

const argv = process.argv.slice(2);
const opt = (k, d) => {
  const i = argv.indexOf(`--${k}`);
  return i >= 0 ? argv[i + 1] : d;
};
const logFile = opt("log", "model.jsonl");
const tag = opt("tag", "host");
const scriptName = opt("script", "worker");

// ---- the Worker's turn ----------------------------------------------------------------------------
// calls: [{tool, args, text, error}] so far (rsim tool names, results as text). Returns the next
// {tool, args}, or {text} to end the turn. `prompt` is the conversation's first user text.
const grab = (text, re) => {
  const m = (text ?? "").replace(/\\+"/g, '"').match(re);
  return m ? m[1] : undefined;
};
// The value `re` captures in the latest result of `tool` that has one (an error result has none: not
// every host flags errors — Codex hands back the error text alone).
const from = (calls, tool, re) => {
  for (const c of [...calls].reverse()) {
    if (c.tool !== tool) continue;
    const v = grab(c.text, re);
    if (v !== undefined) return v;
  }
  return undefined;
};

function worker(calls, prompt) {
  const n = calls.length;
  const campaign = scriptName === "campaign";
  const steps = Number(grab(prompt, /`run_sft`, (\d+) steps/) ?? 200);
  const batch = Number(grab(prompt, /batch size (\d+)/) ?? 16);
  const node = campaign ? grab(prompt, /Your node is (n\d+)/) : from(calls, "branch", /"node":\s*"(n\d+)"/);
  const script = [];
  if (!campaign) {
    script.push(() => ({ tool: "list_nodes", args: { status: "open", limit: 20 } }));
    script.push(() => ({ tool: "branch", args: { parents: ["n0"], title: `${tag}: three-digit sums` } }));
    // The bad call: a parent that does not exist. The host must hand the error back to the model.
    script.push(() => ({ tool: "branch", args: { parents: ["n999"], title: `${tag}: bad parent` } }));
  } else {
    script.push(() => ({ tool: "get_node", args: { node } }));
  }
  const ds = `${tag}-${node}-sums`;
  script.push(() => ({
    tool: "register_dataset",
    args: {
      node,
      name: ds,
      // Three-digit sums: the protected test split is two-digit addition, so no row is contaminated.
      source: { kind: "inline", rows: Array.from({ length: 40 }, (_, i) => ({ prompt: `${i + 110}+${i + 221}=`, answer: `${2 * i + 331}` })) },
    },
  }));
  script.push(() => ({ tool: "run_sft", args: { node, base: "base", datasets: [ds], learning_rate: 0.001, steps, batch_size: batch } }));
  script.push((c) => ({ tool: "wait_job", args: { job: from(c, "run_sft", /"job":\s*"([^"]+)"/) ?? from(c, "run_sft", /"job":\s*\{[^}]*?"id":\s*"([^"]+)"/), timeout_s: 120 } }));
  script.push((c) => {
    const ck = from(c, "wait_job", /"checkpoint":\s*"([0-9a-f]{64})"/) ?? from(c, "run_sft", /"checkpoint":\s*"([0-9a-f]{64})"/);
    return { tool: "evaluate", args: { node, checkpoint: ck ?? "base", task: "add2", split: "dev" } };
  });
  script.push((c) => {
    const em = from(c, "evaluate", /"exact_match":\s*([0-9.eE+-]+)/);
    return { tool: "conclude", args: { node, outcome: "inconclusive", findings: `${tag}: one run on three-digit sums, dev exact_match ${em ?? "n/a"}; one seed only.` } };
  });
  if (n < script.length) return script[n](calls);
  return { text: `Done: node ${node} concluded (${tag}).` };
}

// ---- the Reviewer's turn (`rsim run --reviewer 'cmd:HOST …'`) ------------------------------------------
// The orchestrator's brief says which turn this is. The opening: one `review` on the root proposing
// two first directions. Later: `compare` the nodes under review, then one `review` with a verdict on
// each (the best by dev exact match `promising`, the others `dead_end`) and, while budget is left, one
// proposal continuing the best. Titles and reasons carry the tag, so the record shows whose they are.
function reviewer(calls, prompt) {
  const n = calls.length;
  const root = grab(prompt, /only the root (n\d+) exists/);
  if (root) {
    if (n === 0) {
      const proposals = ["plain sums", "reversed sums"].map((what) => ({
        parents: [root],
        title: `${tag} reviewer: ${what}`,
        hypothesis: `Train on ${what} from the base model; judge by dev exact match.`,
      }));
      return { tool: "review", args: { node: root, summary: `${tag} reviewer: opening with two directions.`, proposals } };
    }
    return { text: `Done: opening review on ${root} (${tag}).` };
  }
  const targets = (grab(prompt, /Review these concluded nodes: ([n\d, ]+)\./) ?? "").split(",").map((t) => t.trim()).filter(Boolean);
  const anchor = grab(prompt, /write one `review` on (n\d+)/) ?? "n0";
  const left = Number(grab(prompt, /Budget left: (\d+) experiments/) ?? 0);
  if (calls.some((c) => c.tool === "review")) return { text: `Done: reviewed ${targets.join(", ")} (${tag}).` };
  if (n === 0 && targets.length >= 2) {
    return { tool: "compare", args: { node: anchor, nodes: targets, task: "add2" } };
  }
  // The compare result's rows, best first by dev exact match when it names them.
  const cmp = calls.find((c) => c.tool === "compare");
  const score = (t) => Number(grab(cmp?.text, new RegExp(`"node":\\s*"${t}"[^}]*?"mean":\\s*([0-9.eE+-]+)`)) ?? 0);
  const ranked = [...targets].sort((a, b) => score(b) - score(a));
  const verdicts = ranked.map((t, i) => ({
    node: t,
    verdict: i === 0 ? "promising" : "dead_end",
    reason: `${tag} reviewer: dev exact match ${score(t)}${i === 0 ? ", the best of this round" : ", below " + ranked[0]}.`,
  }));
  const proposals = left > 0 && ranked.length
    ? [{ parents: [ranked[0]], title: `${tag} reviewer: continue ${ranked[0]}`, hypothesis: `Continue ${ranked[0]}, the best of its round, from its checkpoint.` }]
    : [];
  return { tool: "review", args: { node: anchor, summary: `${tag} reviewer: ${targets.join(", ")} reviewed.`, verdicts, proposals } };
}

// A turn's brief: a Worker's names its node, a Reviewer's its nodes or the opening.
const REVIEW = /The campaign starts: only the root|Review these concluded nodes:/;
const TASK = new RegExp(`Your node is n\\d+|${REVIEW.source}`);
const turn = (calls, prompt) => (REVIEW.test(prompt ?? "") ? reviewer(calls, prompt) : worker(calls, prompt));

// ---- helpers ----------------------------------------------------------------------------------------
const RSIM_TOOLS = ["branch", "register_dataset", "run_sft", "evaluate", "compare", "review", "conclude", "get_node", "list_nodes", "dag", "log", "diff", "reproduce", "get_job", "wait_job", "cancel_job"];
// A host's name for an rsim tool: `branch`, `mcp__rsim__branch`, `mcp_rsim_branch`, `rsim__branch`…
function rsimName(offered) {
  for (const t of RSIM_TOOLS) {
    if (offered === t) return t;
    if (offered.endsWith(t) && /rsim[_.:-]*$/.test(offered.slice(0, -t.length))) return t;
  }
  return undefined;
}
function hostName(offeredNames, tool) {
  return offeredNames.find((o) => rsimName(o) === tool && o !== tool) ?? offeredNames.find((o) => o === tool) ?? tool;
}
const textOf = (v) => {
  if (v == null) return "";
  if (typeof v === "string") return v;
  if (Array.isArray(v)) return v.map(textOf).join("\n");
  if (typeof v === "object") {
    if (typeof v.text === "string") return v.text;
    return JSON.stringify(v);
  }
  return String(v);
};
let seq = 0;
const id = (p) => `${p}_${process.pid}_${++seq}`;
function record(entry) {
  fs.appendFileSync(logFile, JSON.stringify({ t: Date.now(), ...entry }) + "\n");
}
function answerJsonSchema(schema) {
  // Side requests that want JSON (Gemini's next-speaker check, routing, …): fill the schema plainly.
  const out = {};
  for (const [k, p] of Object.entries(schema?.properties ?? {})) {
    if (k === "next_speaker") out[k] = "user";
    else if (p.enum) out[k] = p.enum[0];
    else if (p.type === "boolean" || p.type === "BOOLEAN") out[k] = false;
    else if (["number", "integer", "NUMBER", "INTEGER"].includes(p.type)) out[k] = p.minimum ?? 1;
    else if (p.type === "array" || p.type === "ARRAY") out[k] = [];
    else out[k] = "ok";
  }
  return out;
}

// ---- Anthropic Messages -----------------------------------------------------------------------------
function anthropic(body, res, path) {
  const loaded = (body.tools ?? []).map((t) => t.name).filter(Boolean);
  // Claude Code defers MCP tools: their names are listed in a system message, and the model loads
  // their schemas with ToolSearch ("select:NAME,…") before calling them, as a real model does.
  const deferred = [...new Set(JSON.stringify(body.messages ?? []).match(/mcp__rsim__[a-z_]+/g) ?? [])];
  const offered = [...new Set([...loaded, ...deferred])];
  const main = offered.some((o) => ["branch", "conclude", "review"].includes(rsimName(o)));
  const searched = JSON.stringify(body.messages ?? []).includes('"name":"ToolSearch"');
  const mustSearch = main && loaded.includes("ToolSearch") && !loaded.some((o) => rsimName(o)) && !searched;
  const calls = [];
  const pending = new Map();
  let prompt;
  for (const m of body.messages ?? []) {
    const blocks = typeof m.content === "string" ? [{ type: "text", text: m.content }] : (m.content ?? []);
    for (const b of blocks) {
      if (m.role === "user" && b.type === "text" && prompt === undefined) prompt = b.text;
      if (b.type === "text" && m.role === "user" && TASK.test(b.text)) prompt = b.text;
      if (b.type === "tool_use" && rsimName(b.name)) pending.set(b.id, { tool: rsimName(b.name), args: b.input });
      if (b.type === "tool_result" && pending.has(b.tool_use_id)) {
        calls.push({ ...pending.get(b.tool_use_id), text: textOf(b.content), error: b.is_error === true });
      }
    }
  }
  let answer;
  if (mustSearch) {
    answer = { type: "tool_use", id: id("toolu"), name: "ToolSearch", input: { query: `select:${deferred.join(",")}`, max_results: deferred.length } };
  } else if (main) {
    const next = turn(calls, prompt);
    answer = next.tool ? { type: "tool_use", id: id("toolu"), name: hostName(offered, next.tool), input: next.args } : { type: "text", text: next.text };
  } else {
    answer = { type: "text", text: "rsim worker turn" };
  }
  record({ api: "anthropic", path, main, model: body.model, stream: !!body.stream, offered: main ? offered.length : offered, calls: main ? calls : undefined, answer });
  const msg = {
    id: id("msg"),
    type: "message",
    role: "assistant",
    model: body.model ?? "scripted",
    content: [answer],
    stop_reason: answer.type === "tool_use" ? "tool_use" : "end_turn",
    stop_sequence: null,
    usage: { input_tokens: 10, output_tokens: 10, cache_creation_input_tokens: 0, cache_read_input_tokens: 0 },
  };
  if (!body.stream) return json(res, 200, msg);
  res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache" });
  const ev = (type, data) => res.write(`event: ${type}\ndata: ${JSON.stringify({ type, ...data })}\n\n`);
  ev("message_start", { message: { ...msg, content: [], stop_reason: null, usage: { ...msg.usage, output_tokens: 1 } } });
  if (answer.type === "tool_use") {
    ev("content_block_start", { index: 0, content_block: { type: "tool_use", id: answer.id, name: answer.name, input: {} } });
    ev("content_block_delta", { index: 0, delta: { type: "input_json_delta", partial_json: JSON.stringify(answer.input) } });
  } else {
    ev("content_block_start", { index: 0, content_block: { type: "text", text: "" } });
    ev("content_block_delta", { index: 0, delta: { type: "text_delta", text: answer.text } });
  }
  ev("content_block_stop", { index: 0 });
  ev("message_delta", { delta: { stop_reason: msg.stop_reason, stop_sequence: null }, usage: { output_tokens: 10 } });
  ev("message_stop", {});
  res.end();
}

// ---- OpenAI Responses (Codex) -------------------------------------------------------------------------
function responses(body, res, path) {
  // Codex groups an MCP server's tools in a namespace tool ({type: "namespace", name: "mcp__rsim",
  // tools}); a call names the namespace and the tool.
  const ns = new Map();
  const offered = (body.tools ?? [])
    .flatMap((t) => (t.type === "namespace" ? (t.tools ?? []).map((x) => (ns.set(`${t.name}__${x.name}`, [t.name, x.name]), `${t.name}__${x.name}`)) : [t.name ?? t.function?.name]))
    .filter(Boolean);
  const callName = (n) => (ns.has(n) ? { namespace: ns.get(n)[0], name: ns.get(n)[1] } : { name: n });
  const main = offered.some((o) => ["branch", "conclude", "review"].includes(rsimName(o)));
  const calls = [];
  const pending = new Map();
  let prompt;
  for (const it of body.input ?? []) {
    if (it.type === "message" && it.role === "user") {
      const t = textOf(it.content);
      if (prompt === undefined && !t.startsWith("<")) prompt = t;
      if (TASK.test(t)) prompt = t;
    }
    if (it.type === "function_call" && it.namespace) it.name = `${it.namespace}__${it.name}`;
    if (it.type === "function_call" && rsimName(it.name ?? "")) {
      let args;
      try {
        args = JSON.parse(it.arguments);
      } catch {
        args = it.arguments;
      }
      pending.set(it.call_id, { tool: rsimName(it.name), args });
    }
    if (it.type === "function_call_output" && pending.has(it.call_id)) {
      const out = it.output;
      const text = textOf(out?.content ?? out);
      const flag = out?.success === false || /"isError"\s*:\s*true|"is_error"\s*:\s*true/.test(typeof out === "string" ? out : JSON.stringify(out));
      calls.push({ ...pending.get(it.call_id), text, error: flag, raw: typeof out === "string" ? out.slice(0, 400) : out });
    }
  }
  let item;
  if (main) {
    const next = turn(calls, prompt);
    item = next.tool
      ? { type: "function_call", id: id("fc"), call_id: id("call"), ...callName(hostName(offered, next.tool)), arguments: JSON.stringify(next.args), status: "completed" }
      : { type: "message", id: id("msg"), role: "assistant", status: "completed", content: [{ type: "output_text", text: next.text, annotations: [] }] };
  } else {
    item = { type: "message", id: id("msg"), role: "assistant", status: "completed", content: [{ type: "output_text", text: "rsim worker turn", annotations: [] }] };
  }
  record({ api: "responses", path, main, model: body.model, stream: !!body.stream, offered: main ? offered.length : offered, calls: main ? calls : undefined, answer: item });
  const rid = id("resp");
  const usage = { input_tokens: 10, input_tokens_details: { cached_tokens: 0 }, output_tokens: 10, output_tokens_details: { reasoning_tokens: 0 }, total_tokens: 20 };
  const response = { id: rid, object: "response", created_at: Math.floor(Date.now() / 1000), status: "completed", model: body.model, output: [item], usage };
  if (!body.stream) return json(res, 200, response);
  res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache" });
  let n = 0;
  const ev = (type, data) => res.write(`event: ${type}\ndata: ${JSON.stringify({ type, sequence_number: n++, ...data })}\n\n`);
  ev("response.created", { response: { ...response, status: "in_progress", output: [] } });
  ev("response.output_item.added", { output_index: 0, item });
  if (item.type === "message") ev("response.output_text.delta", { item_id: item.id, output_index: 0, content_index: 0, delta: item.content[0].text });
  ev("response.output_item.done", { output_index: 0, item });
  ev("response.completed", { response });
  res.end();
}

// ---- Gemini -------------------------------------------------------------------------------------------
function gemini(body, res, path, method) {
  const model = decodeURIComponent(path.match(/models\/([^:]+):/)?.[1] ?? "scripted");
  if (method === "countTokens") {
    record({ api: "gemini", path, main: false });
    return json(res, 200, { totalTokens: 100 });
  }
  const offered = (body.tools ?? []).flatMap((t) => (t.functionDeclarations ?? []).map((f) => f.name)).filter(Boolean);
  const main = offered.some((o) => ["branch", "conclude", "review"].includes(rsimName(o)));
  const calls = [];
  const pending = [];
  let prompt;
  for (const c of body.contents ?? []) {
    for (const p of c.parts ?? []) {
      if (c.role === "user" && typeof p.text === "string") {
        if (prompt === undefined) prompt = p.text;
        if (TASK.test(p.text)) prompt = p.text;
      }
      if (p.functionCall && rsimName(p.functionCall.name)) pending.push({ id: p.functionCall.id, name: p.functionCall.name, tool: rsimName(p.functionCall.name), args: p.functionCall.args });
      if (p.functionResponse) {
        const i = pending.findIndex((x) => (p.functionResponse.id ? x.id === p.functionResponse.id : x.name === p.functionResponse.name));
        if (i < 0) continue;
        const [call] = pending.splice(i, 1);
        const r = p.functionResponse.response ?? {};
        const flag = r.error !== undefined || /"isError"\s*:\s*true/.test(JSON.stringify(r));
        calls.push({ tool: call.tool, args: call.args, text: textOf(r.error ?? r.output ?? r.content ?? r), error: flag, raw: r });
      }
    }
  }
  let part;
  const gc = body.generationConfig ?? {};
  if (main) {
    const next = turn(calls, prompt);
    part = next.tool ? { functionCall: { name: hostName(offered, next.tool), args: next.args } } : { text: next.text };
  } else if (gc.responseJsonSchema || gc.responseSchema || gc.responseMimeType === "application/json") {
    part = { text: JSON.stringify(answerJsonSchema(gc.responseJsonSchema ?? gc.responseSchema)) };
  } else {
    part = { text: "rsim worker turn" };
  }
  record({ api: "gemini", path, main, model, offered: main ? offered.length : offered, calls: main ? calls : undefined, answer: part });
  const out = {
    candidates: [{ content: { role: "model", parts: [part] }, finishReason: "STOP", index: 0 }],
    usageMetadata: { promptTokenCount: 10, candidatesTokenCount: 10, totalTokenCount: 20 },
    modelVersion: model,
  };
  if (method !== "streamGenerateContent") return json(res, 200, out);
  res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache" });
  res.write(`data: ${JSON.stringify(out)}\r\n\r\n`);
  res.end();
}

// ---- server ---------------------------------------------------------------------------------------------
function json(res, status, v) {
  res.writeHead(status, { "content-type": "application/json" });
  res.end(JSON.stringify(v));
}
const server = http.createServer((req, res) => {
  const chunks = [];
  req.on("data", (c) => chunks.push(c));
  req.on("end", () => {
    const path = req.url ?? "/";
    let body = {};
    try {
      body = chunks.length ? JSON.parse(Buffer.concat(chunks).toString("utf8")) : {};
    } catch {
      body = {};
    }
    if (process.env.MODEL_DUMP) fs.appendFileSync(process.env.MODEL_DUMP, JSON.stringify({ method: req.method, path, headers: req.headers, body }) + "\n");
    try {
      const p = path.split("?")[0];
      if (req.method === "POST" && p.endsWith("/messages/count_tokens")) {
        record({ api: "anthropic", path, main: false });
        return json(res, 200, { input_tokens: 100 });
      }
      if (req.method === "POST" && p.endsWith("/messages")) return anthropic(body, res, path);
      if (req.method === "POST" && p.endsWith("/responses")) return responses(body, res, path);
      const g = p.match(/\/models\/[^/]+:(streamGenerateContent|generateContent|countTokens)$/);
      if (req.method === "POST" && g) return gemini(body, res, path, g[1]);
      if (req.method === "GET" && p.endsWith("/models")) return json(res, 200, { data: [], models: [] });
      record({ api: "unknown", method: req.method, path });
      json(res, 404, { error: { message: `scripted model endpoint: no route ${req.method} ${path}` } });
    } catch (e) {
      record({ api: "error", path, error: String(e?.stack ?? e) });
      json(res, 500, { error: { message: String(e) } });
    }
  });
});
server.listen(Number(opt("port", 0)), "127.0.0.1", () => {
  console.log(`model: listening on http://127.0.0.1:${server.address().port}`);
});
process.on("SIGTERM", () => process.exit(0));
