// The rsim web page: the live view `rsim serve` serves at `/`, and the same script inlined in the
// static snapshot `rsim report --html` writes (its data then comes from the embedded JSON).
// Everything an agent wrote is set with textContent or as an SVG text node — never as HTML.
import { mountDag, nodeColor, cleanText, readOnlyNote } from "./dag.js";

const $ = (id) => document.getElementById(id);
const embedded = $("rsim-data");
const STATIC = embedded ? JSON.parse(embedded.textContent) : null;
const SVG = "http://www.w3.org/2000/svg";

const state = {
  layout: null,
  expand: new Set(),
  selected: null,
  compare: [],
  me: null,
  logTimer: null,
};

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k === "on") for (const [ev, f] of Object.entries(v)) e.addEventListener(ev, f);
    else if (v !== undefined && v !== null && v !== false) e.setAttribute(k, v === true ? "" : String(v));
  }
  for (const k of kids.flat()) {
    if (k === null || k === undefined || k === false) continue;
    e.appendChild(typeof k === "string" || typeof k === "number" ? document.createTextNode(cleanText(String(k))) : k);
  }
  return e;
}

function svg(tag, attrs, ...kids) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
  for (const k of kids.flat()) {
    if (k === null || k === undefined) continue;
    e.appendChild(typeof k === "string" || typeof k === "number" ? document.createTextNode(cleanText(String(k))) : k);
  }
  return e;
}

function showError(msg) {
  const e = $("error");
  if (!msg) { e.hidden = true; e.textContent = ""; return; }
  e.textContent = cleanText(msg);
  e.hidden = false;
}

async function api(path) {
  if (STATIC) throw new Error("static snapshot: " + path + " is not in this file");
  const r = await fetch("/api/" + path, { headers: { Accept: "application/json" }, credentials: "same-origin" });
  let body = null;
  try { body = await r.json(); } catch (_) { body = null; }
  if (!r.ok) throw new Error((body && body.error) || r.status + " " + r.statusText);
  return body;
}

async function post(action, args) {
  const r = await fetch("/api/call/" + encodeURIComponent(action), {
    method: "POST",
    headers: { "Content-Type": "application/json", Accept: "application/json" },
    credentials: "same-origin",
    body: JSON.stringify(args),
  });
  let body = null;
  try { body = await r.json(); } catch (_) { body = null; }
  return { ok: r.ok, status: r.status, body };
}

const fmt = (v, d = 3) => (typeof v === "number" && isFinite(v) ? v.toFixed(d) : "–");
const short = (c) => (c ? String(c).slice(0, 10) : "");

// ---------------------------------------------------------------- DAG
const view = mountDag($("dag"), {
  onSelect: (id) => openNode(id),
  onExpand: (id, n) => { state.expand.add(id); loadDag(); if (!n || n.id === id) openNode(id); },
});
$("fit").addEventListener("click", () => view.fit());

async function loadDag() {
  try {
    const q = state.expand.size ? "?expand=" + encodeURIComponent([...state.expand].join(",")) : "";
    const layout = STATIC ? STATIC.layout : await api("dag" + q);
    state.layout = layout;
    view.update(layout);
    if (state.selected) view.select(state.selected);
    $("counts").textContent = layout.total === 0
      ? "no nodes yet"
      : `${layout.shown} of ${layout.total} nodes shown${layout.summarised ? " (concluded subtrees collapsed)" : ""} · frontier ${layout.frontier.length}` +
        (layout.best ? ` · best ${layout.best}` : "");
    // A clone without the study's key: say so before the counts, with the reason on hover.
    const ro = readOnlyNote(layout);
    if (ro) {
      $("counts").textContent = `${ro.text} · ${$("counts").textContent}`;
      $("counts").title = ro.title;
      document.body.dataset.readOnly = "true";
    }
    document.body.dataset.nodes = String(layout.shown);
    // First paint (ms since navigation), for tools/web-bench.sh: the frame after the first draw.
    if (!document.body.dataset.firstPaint) {
      requestAnimationFrame(() => { document.body.dataset.firstPaint = performance.now().toFixed(0); });
    }
  } catch (e) {
    showError("DAG: " + e.message);
  }
}

// ---------------------------------------------------------------- node panel
function verdictChip(v) {
  const c = el("span", { class: "chip" }, v || "");
  c.style.background = nodeColor({ verdict: v, status: "concluded" });
  return c;
}

function section(title, ...kids) {
  return el("div", { class: "sec" }, el("h3", {}, title), ...kids);
}

async function openNode(id) {
  state.selected = id;
  if (state.logTimer) { clearInterval(state.logTimer); state.logTimer = null; }
  if (location.hash !== "#" + id) history.replaceState(null, "", "#" + id);
  const panel = $("panel");
  let data;
  try {
    if (STATIC) {
      data = STATIC.panels[id];
      if (!data) {
        const n = (STATIC.layout.nodes || []).find((x) => x.id === id);
        if (!n) throw new Error("no node " + id);
        panel.replaceChildren(el("h2", {}, n.id + " — " + n.title), el("p", { class: "muted" }, "This snapshot carries the panels of the best path, the frontier and the best-scored nodes; run `rsim serve` for every node."));
        return;
      }
    } else {
      data = await api("node/" + encodeURIComponent(id));
    }
  } catch (e) {
    panel.replaceChildren(el("h2", {}, id), el("p", { class: "error", role: "alert" }, e.message));
    return;
  }
  showError(null);
  view.select(id);
  renderPanel(data);
}

function renderPanel(d) {
  const n = d.node;
  const panel = $("panel");
  const inCompare = state.compare.includes(n.id);
  const head = el("div", { class: "head" },
    el("h2", { id: "node-title" }, n.id + " — " + n.title),
    el("div", { class: "meta" },
      el("span", { class: "chip", "data-status": n.status }, n.status),
      n.outcome ? el("span", { class: "chip" }, n.outcome) : null,
      " by ", n.created_by, " at ", n.created_at, " · branch ", n.branch),
    el("div", { class: "meta" }, "parents: ",
      ...(n.parents.length ? n.parents.map((p) => el("button", { class: "link", type: "button", on: { click: () => openNode(p) } }, p)) : ["none"]),
      " · children: ",
      ...(n.children.length ? n.children.slice(0, 50).map((p) => el("button", { class: "link", type: "button", on: { click: () => openNode(p) } }, p)) : ["none"])),
    el("button", { type: "button", id: "compare-toggle", on: { click: () => toggleCompare(n.id) } }, inCompare ? "remove from comparison" : "compare"),
  );
  const st = d.stats;
  const dev = section("Dev score",
    el("p", {}, st && st.mean !== null && st.mean !== undefined
      ? `mean ${fmt(st.mean, 4)}` + (st.ci95 ? ` (95% interval ${fmt(st.ci95[0], 4)} – ${fmt(st.ci95[1], 4)})` : "") + ` over ${st.values.length} evaluation${st.values.length === 1 ? "" : "s"}`
      : "no dev evaluation yet"),
    st && st.suspect ? el("p", { class: "suspect" }, "SUSPECT: a dev score significantly above the hidden dev twin's — this node is left out of every ranking") : null);
  const recipe = (n.hypothesis || "").split("\n").filter((l) => /^\s*(recipe|proposal)\s*:/.test(l));
  const hyp = section("Hypothesis", el("pre", { class: "text", id: "hypothesis" }, n.hypothesis || ""),
    recipe.length ? el("div", {}, el("h4", {}, "Recipe"), el("pre", { class: "text" }, recipe.join("\n"))) : null);
  const actions = section("Actions",
    el("table", {},
      el("thead", {}, el("tr", {}, ["#", "action", "decision", "agent", "at", "commit", "summary"].map((h) => el("th", {}, h)))),
      el("tbody", {}, (n.actions || []).map((a) => el("tr", { class: a.decision },
        el("td", {}, a.seq), el("td", {}, a.action),
        el("td", {}, a.decision + (a.rule ? " (" + a.rule + ")" : "")),
        el("td", {}, a.agent), el("td", {}, a.at),
        el("td", { class: "mono", title: a.commit }, short(a.commit)),
        el("td", {}, a.summary || "", a.reason ? el("div", { class: "muted" }, a.reason) : null))))));
  const reviews = section("Reviews",
    d.reviews.length ? el("ul", { class: "reviews" }, d.reviews.map((r) => el("li", {},
      verdictChip(r.verdict), " ", el("span", { class: "review-reason" }, r.reason),
      el("div", { class: "muted" }, `by ${r.agent} at ${r.at} · on ${r.on} #${r.seq} · commit ${short(r.commit)}`),
      r.summary ? el("details", {}, el("summary", {}, "the review's reasoning"), el("pre", { class: "text" }, r.summary)) : null)))
      : el("p", { class: "muted" }, "no review of this node yet"));
  const notes = n.notes ? section("Findings", el("pre", { class: "text", id: "findings" }, n.notes)) : null;
  const jobs = [];
  for (const a of n.actions || []) if (a.job) jobs.push({ job: a.job, label: `#${a.seq} ${a.action}`, running: false });
  for (const r of d.running || []) jobs.push({ job: r.job, label: `${r.action} (running)`, running: true });
  const logBox = el("pre", { class: "log", id: "job-log" }, "");
  const jobSec = section("Jobs",
    jobs.length ? el("div", {}, jobs.map((j) => el("button", { type: "button", class: "link", on: { click: () => showLog(j, logBox) } }, j.label + " · " + j.job)), logBox)
      : el("p", { class: "muted" }, "no job"));
  const curveSec = section("Learning curves", curveChart([{ node: n.id, curves: d.curves }]));
  const write = writeForm(n);
  // replaceChildren would write a null as the text "null".
  panel.replaceChildren(...[head, dev, hyp, notes, reviews, curveSec, jobSec, actions, write].filter(Boolean));
  const live = jobs.find((j) => j.running);
  if (live && !STATIC) showLog(live, logBox);
}

async function showLog(j, box) {
  if (state.logTimer) { clearInterval(state.logTimer); state.logTimer = null; }
  if (STATIC) { box.textContent = "job logs are not in the static snapshot"; return; }
  const load = async () => {
    try {
      const r = await api("log/" + encodeURIComponent(j.job));
      box.textContent = cleanText(r.log);
      box.scrollTop = box.scrollHeight;
    } catch (e) {
      box.textContent = "log: " + e.message;
    }
  };
  await load();
  if (j.running) state.logTimer = setInterval(load, 2000);
}

function writeForm(n) {
  if (STATIC) return null;
  const me = state.me;
  if (!me || !me.can_write) {
    return section("Write", el("p", { class: "muted", id: "readonly" }, `You are ${me ? me.agent + " (" + me.role + ")" : "an observer"}: this page is read-only.`));
  }
  const outcome = el("select", { name: "outcome" }, ["positive", "negative", "inconclusive"].map((o) => el("option", { value: o }, o)));
  const findings = el("textarea", { name: "findings", rows: 3, placeholder: "what was learned" });
  const out = el("p", { class: "muted" });
  const form = el("form", { class: "write", on: { submit: async (ev) => {
    ev.preventDefault();
    const r = await post("conclude", { node: n.id, outcome: outcome.value, findings: findings.value });
    out.textContent = r.ok ? "recorded: " + (r.body && r.body.commit ? short(r.body.commit) : "ok") : "refused: " + ((r.body && r.body.error) || r.status);
    if (r.ok) openNode(n.id);
  } } }, el("label", {}, "outcome ", outcome), findings, el("button", { type: "submit" }, "conclude"), out);
  return section(`Write as ${me.agent} (${me.role}) — through the same policy as every agent`, form);
}

// ---------------------------------------------------------------- curves
const PALETTE = ["#2f6fd6", "#c8423b", "#2e9d4c", "#8a4fd0", "#d69a00", "#1a9aa0", "#b0558a", "#666"];

/** SVG chart of loss per step; groups = [{node, curves:[{points:[[step,loss]]}]}]. */
function curveChart(groups) {
  const W = 460, H = 200, L = 44, B = 24, T = 8, R = 8;
  const all = groups.flatMap((g) => g.curves.flatMap((c) => c.points));
  if (!all.length) return el("p", { class: "muted" }, "no loss logged yet");
  let x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity;
  for (const [x, y] of all) { x0 = Math.min(x0, x); x1 = Math.max(x1, x); y0 = Math.min(y0, y); y1 = Math.max(y1, y); }
  if (x1 === x0) x1 = x0 + 1;
  if (y1 === y0) y1 = y0 + 1;
  const sx = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
  const sy = (y) => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
  const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart curve", role: "img" },
    svg("line", { x1: L, y1: H - B, x2: W - R, y2: H - B, class: "axis" }),
    svg("line", { x1: L, y1: T, x2: L, y2: H - B, class: "axis" }),
    svg("text", { x: 2, y: T + 10, class: "tick" }, fmt(y1, 3)),
    svg("text", { x: 2, y: H - B, class: "tick" }, fmt(y0, 3)),
    svg("text", { x: L, y: H - 6, class: "tick" }, "step " + x0),
    svg("text", { x: W - R - 60, y: H - 6, class: "tick" }, "step " + x1));
  groups.forEach((g, gi) => {
    const color = PALETTE[gi % PALETTE.length];
    const runs = g.curves.filter((c) => c.points.length);
    for (const c of runs) {
      root.appendChild(svg("polyline", { points: c.points.map(([x, y]) => sx(x) + "," + sy(y)).join(" "), fill: "none", stroke: color, "stroke-opacity": runs.length > 1 ? 0.3 : 1, "stroke-width": 1.5, class: "run" }));
    }
    if (runs.length > 1) {
      // Seeds as mean with a band (min–max) at each logged step.
      const by = new Map();
      for (const c of runs) for (const [x, y] of c.points) { if (!by.has(x)) by.set(x, []); by.get(x).push(y); }
      const steps = [...by.keys()].sort((a, b) => a - b);
      const mean = steps.map((x) => [x, by.get(x).reduce((a, b) => a + b, 0) / by.get(x).length]);
      const lo = steps.map((x) => [x, Math.min(...by.get(x))]);
      const hi = steps.map((x) => [x, Math.max(...by.get(x))]);
      const band = hi.concat(lo.reverse()).map(([x, y]) => sx(x) + "," + sy(y)).join(" ");
      root.appendChild(svg("polygon", { points: band, fill: color, "fill-opacity": 0.15, stroke: "none", class: "band" }));
      root.appendChild(svg("polyline", { points: mean.map(([x, y]) => sx(x) + "," + sy(y)).join(" "), fill: "none", stroke: color, "stroke-width": 2.5, class: "mean-line" }));
    }
  });
  const legend = el("div", { class: "legend" }, groups.map((g, gi) => {
    const k = el("i", { class: "k" });
    k.style.background = PALETTE[gi % PALETTE.length];
    return el("span", {}, k, `${g.node} (${g.curves.length} run${g.curves.length === 1 ? "" : "s"}) `);
  }));
  return el("div", {}, root, legend);
}

// ---------------------------------------------------------------- comparison
function toggleCompare(id) {
  const i = state.compare.indexOf(id);
  if (i >= 0) state.compare.splice(i, 1);
  else if (state.compare.length < 12) state.compare.push(id);
  const b = $("compare-toggle");
  if (b) b.textContent = state.compare.includes(id) ? "remove from comparison" : "compare";
  loadCompare();
}

async function loadCompare() {
  const box = $("compare"), curves = $("curves");
  let cmp = null;
  try {
    if (STATIC) cmp = STATIC.overview.compare || null;
    else if (state.compare.length) cmp = await api("compare?nodes=" + encodeURIComponent(state.compare.join(",")));
  } catch (e) {
    box.replaceChildren(el("p", { class: "error" }, e.message));
    return;
  }
  if (!cmp || !cmp.nodes.length) {
    box.replaceChildren(el("p", { class: "muted" }, "Add nodes with “compare” in their panel."));
    return;
  }
  box.replaceChildren(intervalChart(cmp), diffTable(cmp));
  if (!STATIC) {
    const groups = [];
    for (const n of cmp.nodes) {
      try { const d = await api("node/" + encodeURIComponent(n.node)); groups.push({ node: n.node, curves: d.curves }); } catch (_) { /* gone */ }
    }
    curves.replaceChildren(curveChart(groups));
  } else {
    const groups = cmp.nodes.filter((n) => STATIC.panels[n.node]).map((n) => ({ node: n.node, curves: STATIC.panels[n.node].curves }));
    curves.replaceChildren(curveChart(groups));
  }
}

function intervalChart(cmp) {
  const rows = cmp.nodes;
  const W = 460, rowH = 22, L = 70, R = 10, H = rows.length * rowH + 24;
  const vals = rows.flatMap((r) => (r.ci95 ? r.ci95 : r.mean !== null && r.mean !== undefined ? [r.mean] : []));
  if (!vals.length) return el("p", { class: "muted" }, "no dev evaluation among these nodes");
  let lo = Math.min(...vals), hi = Math.max(...vals);
  if (hi === lo) { lo -= 0.01; hi += 0.01; }
  const sx = (v) => L + ((v - lo) / (hi - lo)) * (W - L - R);
  const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart intervals", role: "img" });
  rows.forEach((r, i) => {
    const y = 12 + i * rowH;
    root.appendChild(svg("text", { x: 2, y: y + 4, class: "tick" }, r.node));
    if (r.ci95) root.appendChild(svg("line", { x1: sx(r.ci95[0]), x2: sx(r.ci95[1]), y1: y, y2: y, class: "ci" }));
    if (r.mean !== null && r.mean !== undefined) root.appendChild(svg("circle", { cx: sx(r.mean), cy: y, r: 4, class: "mean" }));
    root.appendChild(svg("text", { x: W - 150, y: y + 4, class: "tick" }, `${fmt(r.mean, 4)} n=${r.values.length}`));
  });
  root.appendChild(svg("text", { x: L, y: H - 4, class: "tick" }, fmt(lo, 3)));
  root.appendChild(svg("text", { x: W - R - 40, y: H - 4, class: "tick" }, fmt(hi, 3)));
  return root;
}

function diffTable(cmp) {
  if (!cmp.diffs.length) return el("p", { class: "muted" }, "Differences need two nodes with at least two dev values each.");
  return el("table", { class: "diffs" },
    el("thead", {}, el("tr", {}, ["b − a", "difference", "95% interval", ""].map((h) => el("th", {}, h)))),
    el("tbody", {}, cmp.diffs.map((d) => el("tr", {},
      el("td", {}, `${d.b} − ${d.a}`), el("td", {}, fmt(d.diff, 4)),
      el("td", {}, `${fmt(d.ci95[0], 4)} – ${fmt(d.ci95[1], 4)}`),
      el("td", {}, d.ci95[0] > 0 || d.ci95[1] < 0 ? "differs" : "not distinguishable")))));
}

// ---------------------------------------------------------------- overview
function lineChart(points, series, title) {
  const W = 460, H = 140, L = 44, B = 22, T = 16, R = 8;
  const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart timeline", role: "img" },
    svg("text", { x: L, y: 11, class: "tick" }, title),
    svg("line", { x1: L, y1: H - B, x2: W - R, y2: H - B, class: "axis" }));
  if (!points.length) return root;
  const n = points.length;
  const sx = (i) => L + (n === 1 ? 0 : (i / (n - 1)) * (W - L - R));
  series.forEach((s, si) => {
    const max = Math.max(s.max || 0, ...points.map(s.get), 1e-9);
    const sy = (v) => T + (1 - v / max) * (H - T - B);
    root.appendChild(svg("polyline", { points: points.map((p, i) => sx(i) + "," + sy(s.get(p))).join(" "), fill: "none", stroke: PALETTE[si], "stroke-width": 1.8 }));
    if (s.max) root.appendChild(svg("line", { x1: L, x2: W - R, y1: sy(s.max), y2: sy(s.max), class: "budget", stroke: PALETTE[si] }));
    root.appendChild(svg("text", { x: L + 4 + si * 150, y: H - 6, class: "tick", fill: PALETTE[si] }, s.label + " " + fmt(s.get(points[n - 1]), s.digits ?? 0) + (s.max ? " / " + s.max : "")));
  });
  root.appendChild(svg("text", { x: 2, y: H - B, class: "tick" }, "0"));
  return root;
}

async function loadOverview() {
  let o;
  try {
    o = STATIC ? STATIC.overview : await api("overview");
  } catch (e) {
    showError("overview: " + e.message);
    return;
  }
  const t = o.timeline;
  const pts = t.points;
  $("timeline").replaceChildren(
    pts.length ? el("p", { class: "muted" }, `from ${pts[0].at} to ${pts[pts.length - 1].at} (${pts.length} recorded actions)`) : el("p", { class: "muted" }, "nothing recorded yet"),
    lineChart(pts, [
      { label: "compute s", get: (p) => p.compute_s, max: t.budget_compute_s, digits: 0 },
      { label: "evaluations", get: (p) => p.evaluations, max: t.budget_evaluations },
    ], "budget used"),
    lineChart(pts, [
      { label: "lock-in (top direction's share of runs)", get: (p) => p.top_share, max: 1, digits: 2 },
    ], "lock-in index"));
  const a = o.audit;
  $("audit").replaceChildren(
    el("p", { id: "audit-line" }, `${a.attempts} attempts · ${a.accepted} accepted · ${a.rejected} refused · `, el("strong", {}, `${a.got_through} hacks got through`)),
    el("table", {}, el("tbody", {}, Object.entries(a.rejections_by_rule).map(([k, v]) => el("tr", {}, el("td", {}, "refused by " + k), el("td", {}, v))))),
    el("table", {}, el("thead", {}, el("tr", {}, ["check", "checked", "violations"].map((h) => el("th", {}, h)))),
      el("tbody", {}, a.checks.map((c) => el("tr", { title: c.what }, el("td", {}, c.name), el("td", {}, c.checked), el("td", {}, c.violations, c.examples.length ? el("div", { class: "muted" }, c.examples.join("; ")) : null))))));
}

// ---------------------------------------------------------------- live updates
let refreshTimer = null;
function refreshSoon() {
  if (refreshTimer) return;
  refreshTimer = setTimeout(async () => {
    refreshTimer = null;
    await loadDag();
    loadOverview();
    if (state.compare.length) loadCompare();
    if (state.selected && !state.logTimer) openNode(state.selected);
  }, 400);
}

// The live stream. A dropped connection is retried by the browser itself; a refused one (the
// server at its stream limit answers 503) closes the EventSource for good, so the page retries
// it with a growing, jittered pause (1 s doubling to 30 s), and looks again at what it missed.
let eventsBackoff = 1000;
function connectEvents() {
  const live = $("live");
  const es = new EventSource("/api/events");
  es.addEventListener("open", () => {
    live.textContent = "live"; live.className = "live on";
    if (eventsBackoff > 1000) refreshSoon();
    eventsBackoff = 1000;
  });
  es.addEventListener("change", (ev) => { document.body.dataset.tick = ev.data; refreshSoon(); });
  es.addEventListener("error", () => {
    live.textContent = "reconnecting…"; live.className = "live off";
    if (es.readyState !== EventSource.CLOSED) return;
    es.close();
    const pause = eventsBackoff * (0.75 + Math.random() / 2);
    eventsBackoff = Math.min(eventsBackoff * 2, 30000);
    setTimeout(connectEvents, pause);
  });
}

async function main() {
  if (STATIC) {
    $("live").textContent = "snapshot";
    $("me").textContent = "static report";
    await loadDag();
    loadOverview();
    loadCompare();
  } else {
    try {
      state.me = await api("me");
      $("me").textContent = `${state.me.agent} · ${state.me.role}${state.me.can_write ? "" : " (read-only)"}`;
      if (state.me.tokens) $("logout").hidden = false;
    } catch (e) {
      showError(e.message);
    }
    await loadDag();
    loadOverview();
    connectEvents();
  }
  const h = decodeURIComponent(location.hash.slice(1));
  if (h) openNode(h);
  window.addEventListener("hashchange", () => {
    const id = decodeURIComponent(location.hash.slice(1));
    if (id && id !== state.selected) openNode(id);
  });
  document.body.dataset.ready = "1";
}

main();
