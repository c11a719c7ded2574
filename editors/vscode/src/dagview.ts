// The DAG webview's script: the shared renderer (editors/dag/dag.js, the same one the web page
// uses) on the left, the selected node's panel on the right. Data comes from the extension
// (postMessage), which asks `rsim lsp`. Every string is put in the page as text, never as HTML.
// A plain-JS ES module (typed by dag.d.ts beside it), bundled by esbuild.
import { cleanText, mountDag, readOnlyNote, type DagLayout } from "../../dag/dag.js";

declare function acquireVsCodeApi(): { postMessage(m: unknown): void };
const vscode = acquireVsCodeApi();

const dagEl = document.getElementById("dag")!;
const side = document.getElementById("side")!;
const bar = document.getElementById("bar")!;
const goto = document.getElementById("goto") as HTMLInputElement;
goto.addEventListener("keydown", (e) => {
  const id = goto.value.trim();
  if (e.key === "Enter" && /^n\d{1,9}$/.test(id)) {
    view.select(id);
    vscode.postMessage({ type: "select", id });
  }
});
let first = true;
// When this script started: the first paint's time is measured from here (the layout asked for,
// computed by rsim, sent, drawn) and left on #dag as data-first-paint-ms for benchmarks.
const started = performance.now();

const view = mountDag(dagEl, {
  onSelect: (id: string) => vscode.postMessage({ type: "select", id }),
  onExpand: (id: string) => vscode.postMessage({ type: "expand", id }),
});

function el(tag: string, text?: string, cls?: string): HTMLElement {
  const e = document.createElement(tag);
  if (text !== undefined) e.textContent = text;
  if (cls) e.className = cls;
  return e;
}

function fmt(mean: number | null | undefined, ci?: number[] | null) {
  if (mean == null) return "–";
  return ci ? `${mean.toFixed(4)} [${ci[0].toFixed(4)}, ${ci[1].toFixed(4)}]` : mean.toFixed(4);
}

/** A small SVG line chart of (step, loss) points. */
function curve(points: [number, number][], label: string): HTMLElement {
  const wrap = el("div");
  wrap.appendChild(el("div", label));
  if (points.length < 2) {
    wrap.appendChild(el("div", points.length ? `loss ${points[0][1]}` : "no progress lines yet"));
    return wrap;
  }
  const W = 340, H = 110, P = 4;
  const xs = points.map((p) => p[0]), ys = points.map((p) => p[1]);
  const [x0, x1] = [Math.min(...xs), Math.max(...xs)];
  const [y0, y1] = [Math.min(...ys), Math.max(...ys)];
  const sx = (x: number) => P + ((x - x0) / (x1 - x0 || 1)) * (W - 2 * P);
  const sy = (y: number) => H - P - ((y - y0) / (y1 - y0 || 1)) * (H - 2 * P);
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("width", String(W));
  svg.setAttribute("height", String(H));
  svg.setAttribute("class", "loss-curve");
  const path = document.createElementNS(ns, "polyline");
  path.setAttribute("points", points.map((p) => `${sx(p[0])},${sy(p[1])}`).join(" "));
  path.setAttribute("fill", "none");
  path.setAttribute("stroke", "currentColor");
  svg.appendChild(path);
  wrap.appendChild(svg);
  wrap.appendChild(el("div", `steps ${x0}–${x1} · loss ${y1.toFixed(4)} → ${ys[ys.length - 1].toFixed(4)}`));
  return wrap;
}

function showPanel(p: any) {
  side.replaceChildren();
  const n = p.node, c = p.card;
  side.appendChild(el("h2", `${n.id} — ${n.title}`, "node-title"));
  side.appendChild(
    el(
      "div",
      `${n.status}${n.outcome ? ` (${n.outcome})` : ""} · verdict: ${c.verdict ?? "not reviewed"} · runs: ${c.runs}`,
    ),
  );
  side.appendChild(el("div", `${c.metric} on ${c.task} (dev): ${fmt(c.score.mean, c.score.ci95)} n=${c.score.n}`, "node-score"));
  side.appendChild(el("h2", "Hypothesis"));
  side.appendChild(el("div", n.hypothesis || "–"));
  side.appendChild(el("h2", "Actions"));
  const t = el("table");
  for (const a of n.actions) {
    const tr = el("tr");
    tr.appendChild(el("td", String(a.seq)));
    tr.appendChild(el("td", a.action));
    tr.appendChild(el("td", a.decision));
    const td = el("td");
    const link = el("a", String(a.commit).slice(0, 10));
    link.setAttribute("href", "#");
    link.addEventListener("click", (e) => {
      e.preventDefault();
      vscode.postMessage({ type: "commit", commit: a.commit });
    });
    td.appendChild(link);
    tr.appendChild(td);
    tr.appendChild(el("td", a.summary));
    t.appendChild(tr);
  }
  side.appendChild(t);
  side.appendChild(el("h2", "Metrics"));
  const mt = el("table");
  for (const m of n.metrics) {
    const tr = el("tr");
    for (const v of [m.task, m.split, m.name, String(m.value)]) tr.appendChild(el("td", v));
    mt.appendChild(tr);
  }
  side.appendChild(mt);
  side.appendChild(el("h2", "Training loss"));
  if (!p.curves.length) side.appendChild(el("div", "no training run"));
  for (const cv of p.curves)
    side.appendChild(curve(cv.points, `${cv.job}${cv.seed != null ? ` seed ${cv.seed}` : ""} (${cv.state})`));
  if (p.reviews.length) {
    side.appendChild(el("h2", "Reviews"));
    for (const r of p.reviews) side.appendChild(el("div", `${r.agent}: ${r.verdict} — ${r.reason}`));
  }
  if (n.notes) {
    side.appendChild(el("h2", "Findings"));
    side.appendChild(el("div", n.notes));
  }
  side.appendChild(el("h2", "Job log"));
  side.appendChild(el("pre", p.running?.length ? "…" : "no job running", "job-log"));
}

window.addEventListener("message", (ev) => {
  const m = ev.data;
  if (m.type === "layout") {
    const L: DagLayout = m.layout;
    view.update(L);
    if (first) {
      view.fit();
      first = false;
      requestAnimationFrame(() => {
        dagEl.setAttribute("data-first-paint-ms", String(Math.round(performance.now() - started)));
        // From the webview document's own start (VS Code created its frame): the page's loading
        // of this script included.
        dagEl.setAttribute("data-since-frame-ms", String(Math.round(performance.now())));
      });
    }
    const counts = `${L.shown} of ${L.total} nodes${L.summarised ? " (summarised: click +N to open)" : ""} · best ${
      cleanText(L.best ?? "–")
    } · frontier ${L.frontier.length}`;
    // A clone without the study's private key: marked, with the server's reason as its tooltip.
    const ro = readOnlyNote(L);
    if (ro) {
      const mark = el("span", ro.text, "read-only");
      mark.title = ro.title;
      bar.replaceChildren(mark, document.createTextNode(` · ${counts}`));
      dagEl.setAttribute("data-read-only", "true");
    } else {
      bar.replaceChildren(document.createTextNode(counts));
      dagEl.removeAttribute("data-read-only");
    }
    dagEl.setAttribute("data-nodes", String(L.shown));
    dagEl.setAttribute("data-total", String(L.total));
  } else if (m.type === "node") {
    showPanel(m.panel);
  } else if (m.type === "log") {
    const pre = side.querySelector(".job-log");
    if (pre) pre.textContent = m.log.log;
  } else if (m.type === "error") {
    bar.textContent = `error: ${cleanText(m.message)}`;
  }
});

vscode.postMessage({ type: "ready" });
