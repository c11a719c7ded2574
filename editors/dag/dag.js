// dag.js — the research DAG view shared by rsim's web page and the VS Code extension's webview.
// One plain ES module: no framework, no CDN, no network. The layout is computed by rsim
// (`faces::dagview`, served as JSON: `GET /api/dag`, `rsim lsp`'s `rsim/dag`); this file only
// draws it on a <canvas>, so it holds 10,000 nodes and more.
//
// API
//   import { mountDag } from "./dag.js";
//   const view = mountDag(element, { onSelect(id, node), onExpand(id, node) });
//   view.update(layout)   // draw a DagLayout (again: keeps the reader's pan/zoom once they moved)
//   view.select(id)       // highlight a node (null: none); returns whether it is drawn
//   view.fit()            // zoom to show the whole DAG
//   view.destroy()        // remove the canvas and listeners
//
// A DagLayout is { total, shown, summarised, task, metric, best, best_path: [id], frontier: [id],
//   width, height, nodes: [{ id, title, status, outcome?, verdict?, score?, evals, suspect?, x, y,
//   collapsed, expand?, best }], edges: [[from, to]], read_only? } — edges index into `nodes`; a
//   collapsed node (collapsed > 0) hides that many nodes, and `expand` is the id that opens it;
//   `read_only`, present only for a study that cannot be written here (a clone without the study's
//   private key), says why: readOnlyNote(layout) gives what a face shows for it.
//
// Interaction: drag to pan, wheel to zoom (around the pointer), click a node → onSelect(id, node);
// click a collapsed node (it shows "+N") → onExpand(node.expand, node) when given (pass that id
// back in the layout request's expand list), else onSelect;
// double-click the background to fit; hover shows the node's title. Nodes are coloured by their
// latest review verdict (promising green, needs_more_seeds amber, still_learning light blue,
// dead_end red; unreviewed: open
// blue, concluded grey) and labelled with their id and mean dev score when zoomed in enough.
// Every string is drawn as text (canvas fillText, DOM textContent), never parsed as HTML, and
// bidirectional-override characters are shown as "?" so a title cannot reorder what is shown.

const COLORS = {
  promising: "#2e9d4c",
  needs_more_seeds: "#d69a00",
  still_learning: "#5aa0e6",
  dead_end: "#c8423b",
  open: "#2f6fd6",
  concluded: "#8a8f98",
};
const BEST = "#e0b000";
const SELECT = "#111";

/** A string with bidi controls and other invisible format characters made visible. */
export function cleanText(s) {
  return String(s ?? "").replace(/[\u202a-\u202e\u2066-\u2069\u200e\u200f\u061c]/g, "?");
}

/** What a face shows above the DAG of a study that cannot be written here: null when it can,
 * else { text: "read-only clone", title: the server's reason (cleaned, for a tooltip) }. */
export function readOnlyNote(layout) {
  const why = layout && layout.read_only;
  if (typeof why !== "string" || !why) return null;
  return { text: "read-only clone", title: cleanText(why) };
}

/** The colour of a node: verdict first, then status. */
export function nodeColor(n) {
  return COLORS[n.verdict] || (n.status === "open" ? COLORS.open : COLORS.concluded);
}

export function mountDag(element, opts = {}) {
  const onSelect = opts.onSelect || (() => {});
  const onExpand = opts.onExpand || null;
  const doc = element.ownerDocument;
  const wrap = doc.createElement("div");
  wrap.className = "dag-wrap";
  wrap.style.position = "relative";
  wrap.style.width = "100%";
  wrap.style.height = "100%";
  wrap.style.overflow = "hidden";
  const canvas = doc.createElement("canvas");
  canvas.className = "dag-canvas";
  canvas.style.display = "block";
  canvas.style.width = "100%";
  canvas.style.height = "100%";
  canvas.style.cursor = "grab";
  canvas.setAttribute("role", "img");
  canvas.setAttribute("aria-label", "research DAG");
  const tip = doc.createElement("div");
  tip.className = "dag-tip";
  tip.style.position = "absolute";
  tip.style.pointerEvents = "none";
  tip.style.display = "none";
  tip.style.background = "rgba(20,20,24,0.92)";
  tip.style.color = "#fff";
  tip.style.font = "12px sans-serif";
  tip.style.padding = "3px 6px";
  tip.style.borderRadius = "3px";
  tip.style.maxWidth = "420px";
  tip.style.whiteSpace = "pre-wrap";
  wrap.appendChild(canvas);
  wrap.appendChild(tip);
  element.appendChild(wrap);
  const ctx = canvas.getContext("2d");

  let layout = null;
  let scale = 1, ox = 0, oy = 0; // screen = world * scale + offset
  let moved = false; // the reader panned or zoomed: keep their view on updates
  let selected = null;
  let grid = null; // spatial hash for hit tests
  let pending = false;
  let W = 0, H = 0, dpr = 1;
  const CELL = 64;

  function resize() {
    dpr = (doc.defaultView && doc.defaultView.devicePixelRatio) || 1;
    const r = canvas.getBoundingClientRect();
    W = Math.max(1, r.width);
    H = Math.max(1, r.height);
    canvas.width = Math.round(W * dpr);
    canvas.height = Math.round(H * dpr);
    if (!moved) fitNow();
    draw();
  }

  function fitNow() {
    if (!layout || !layout.nodes.length) {
      scale = 1; ox = 20; oy = 20;
      return;
    }
    const pad = 30;
    const w = Math.max(layout.width, 1), h = Math.max(layout.height, 1);
    scale = Math.min((W - 2 * pad) / w, (H - 2 * pad) / h, 2);
    if (!(scale > 0)) scale = 1;
    ox = pad + (W - 2 * pad - w * scale) / 2;
    oy = pad + (H - 2 * pad - h * scale) / 2;
  }

  function buildGrid() {
    grid = new Map();
    const ns = layout.nodes;
    for (let i = 0; i < ns.length; i++) {
      const k = Math.floor(ns[i].x / CELL) + "," + Math.floor(ns[i].y / CELL);
      let c = grid.get(k);
      if (!c) grid.set(k, (c = []));
      c.push(i);
    }
  }

  function radius() {
    // World units; at least 2.5 px on screen.
    return Math.max(7, 2.5 / scale);
  }

  function hit(sx, sy) {
    if (!layout || !grid) return -1;
    const wx = (sx - ox) / scale, wy = (sy - oy) / scale;
    const r = Math.max(radius(), 5 / scale) * 1.3;
    let best = -1, bd = r * r;
    const c0 = Math.floor((wx - r) / CELL), c1 = Math.floor((wx + r) / CELL);
    const r0 = Math.floor((wy - r) / CELL), r1 = Math.floor((wy + r) / CELL);
    for (let cx = c0; cx <= c1; cx++)
      for (let cy = r0; cy <= r1; cy++) {
        const cell = grid.get(cx + "," + cy);
        if (!cell) continue;
        for (const i of cell) {
          const n = layout.nodes[i];
          const d = (n.x - wx) ** 2 + (n.y - wy) ** 2;
          if (d <= bd) { bd = d; best = i; }
        }
      }
    return best;
  }

  function schedule() {
    if (pending) return;
    pending = true;
    (doc.defaultView || globalThis).requestAnimationFrame(() => { pending = false; draw(); });
  }

  function draw() {
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, W, H);
    if (!layout) return;
    const ns = layout.nodes;
    if (!ns.length) {
      ctx.fillStyle = "#666";
      ctx.font = "14px sans-serif";
      ctx.fillText("No nodes yet.", 20, 30);
      return;
    }
    // Visible world rectangle (with margin) for culling.
    const m = 40 / scale;
    const x0 = -ox / scale - m, x1 = (W - ox) / scale + m;
    const y0 = -oy / scale - m, y1 = (H - oy) / scale + m;
    const inView = (n) => n.x >= x0 && n.x <= x1 && n.y >= y0 && n.y <= y1;
    ctx.setTransform(dpr * scale, 0, 0, dpr * scale, dpr * ox, dpr * oy);
    // Edges: one path, then the best path's edges over it.
    ctx.lineWidth = 1 / scale;
    ctx.strokeStyle = "rgba(120,125,135,0.55)";
    ctx.beginPath();
    const bestEdges = [];
    for (const [a, b] of layout.edges) {
      const p = ns[a], q = ns[b];
      if (!p || !q) continue;
      if ((p.x < x0 && q.x < x0) || (p.x > x1 && q.x > x1)) continue;
      if ((p.y < y0 && q.y < y0) || (p.y > y1 && q.y > y1)) continue;
      if (p.best && q.best) { bestEdges.push([p, q]); continue; }
      ctx.moveTo(p.x, p.y);
      ctx.lineTo(q.x, q.y);
    }
    ctx.stroke();
    if (bestEdges.length) {
      ctx.lineWidth = 3 / scale;
      ctx.strokeStyle = BEST;
      ctx.beginPath();
      for (const [p, q] of bestEdges) { ctx.moveTo(p.x, p.y); ctx.lineTo(q.x, q.y); }
      ctx.stroke();
    }
    // Nodes, batched by colour.
    const r = radius();
    const byColor = new Map();
    for (let i = 0; i < ns.length; i++) {
      const n = ns[i];
      if (!inView(n)) continue;
      const c = nodeColor(n);
      let l = byColor.get(c);
      if (!l) byColor.set(c, (l = []));
      l.push(n);
    }
    for (const [c, l] of byColor) {
      ctx.fillStyle = c;
      ctx.beginPath();
      for (const n of l) {
        if (n.collapsed > 0) {
          ctx.rect(n.x - r * 1.3, n.y - r * 1.3, r * 2.6, r * 2.6);
        } else {
          ctx.moveTo(n.x + r, n.y);
          ctx.arc(n.x, n.y, r, 0, 2 * Math.PI);
        }
      }
      ctx.fill();
    }
    // Rings: best path, frontier (open, hollow ring), selection.
    ctx.lineWidth = 2 / scale;
    ctx.strokeStyle = BEST;
    ctx.beginPath();
    for (const n of ns) if (n.best && inView(n)) { ctx.moveTo(n.x + r + 3 / scale, n.y); ctx.arc(n.x, n.y, r + 3 / scale, 0, 2 * Math.PI); }
    ctx.stroke();
    if (selected != null && ns[selected]) {
      const n = ns[selected];
      ctx.strokeStyle = SELECT;
      ctx.lineWidth = 2.5 / scale;
      ctx.beginPath();
      ctx.arc(n.x, n.y, r + 6 / scale, 0, 2 * Math.PI);
      ctx.stroke();
    }
    // Labels when they are readable (drawn in screen space so the text stays crisp).
    if (scale >= 0.45) {
      ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
      ctx.font = "11px sans-serif";
      ctx.fillStyle = "#222";
      ctx.textBaseline = "middle";
      let drawn = 0;
      for (const n of ns) {
        if (!inView(n)) continue;
        if (++drawn > 4000) break;
        const sx = n.x * scale + ox + r * scale + 4, sy = n.y * scale + oy;
        let label = n.id;
        if (typeof n.score === "number") label += " " + n.score.toFixed(3);
        if (n.suspect) label += " ⚠ suspect";
        if (n.collapsed > 0) label += " +" + n.collapsed;
        ctx.fillText(label, sx, sy);
        if (scale >= 1.1) {
          ctx.fillStyle = "#666";
          ctx.fillText(cleanText(n.title).slice(0, 28), sx, sy + 12);
          ctx.fillStyle = "#222";
        }
      }
    }
  }

  // Pointer: drag to pan, click to select.
  let drag = null;
  function pos(e) {
    const r = canvas.getBoundingClientRect();
    return [e.clientX - r.left, e.clientY - r.top];
  }
  function onDown(e) {
    const [x, y] = pos(e);
    drag = { x, y, ox, oy, moved: false };
    canvas.style.cursor = "grabbing";
  }
  function onMove(e) {
    const [x, y] = pos(e);
    if (drag) {
      if (Math.abs(x - drag.x) + Math.abs(y - drag.y) > 3) drag.moved = true;
      if (drag.moved) {
        ox = drag.ox + x - drag.x;
        oy = drag.oy + y - drag.y;
        moved = true;
        tip.style.display = "none";
        schedule();
      }
      return;
    }
    const i = hit(x, y);
    if (i < 0) { tip.style.display = "none"; canvas.style.cursor = "grab"; return; }
    const n = layout.nodes[i];
    let t = n.id + " — " + cleanText(n.title);
    if (typeof n.score === "number") t += "\nmean dev " + n.score.toFixed(4) + " (" + n.evals + " eval" + (n.evals === 1 ? "" : "s") + ")";
    if (n.suspect) t += "\nSUSPECT: a dev score significantly above the hidden dev twin's — not ranked";
    t += "\n" + n.status + (n.verdict ? " · " + n.verdict : "") + (n.outcome ? " · " + n.outcome : "");
    if (n.collapsed > 0) t += "\n+" + n.collapsed + " nodes collapsed (click to expand)";
    tip.textContent = t;
    tip.style.left = Math.min(x + 14, W - 200) + "px";
    tip.style.top = (y + 12) + "px";
    tip.style.display = "block";
    canvas.style.cursor = "pointer";
  }
  function onUp(e) {
    if (!drag) return;
    const d = drag;
    drag = null;
    canvas.style.cursor = "grab";
    if (d.moved) return;
    const [x, y] = pos(e);
    const i = hit(x, y);
    if (i < 0) return;
    const n = layout.nodes[i];
    selected = i;
    draw();
    if (n.collapsed > 0 && onExpand) onExpand(n.expand || n.id, n);
    else onSelect(n.id, n);
  }
  function onLeave() { tip.style.display = "none"; }
  function onWheel(e) {
    e.preventDefault();
    const [x, y] = pos(e);
    const k = Math.exp(-e.deltaY * 0.0015);
    const ns = Math.min(Math.max(scale * k, 1e-4), 8);
    ox = x - (x - ox) * (ns / scale);
    oy = y - (y - oy) * (ns / scale);
    scale = ns;
    moved = true;
    schedule();
  }
  function onDbl(e) {
    const [x, y] = pos(e);
    if (hit(x, y) >= 0) return;
    moved = false;
    fitNow();
    draw();
  }
  canvas.addEventListener("pointerdown", onDown);
  canvas.addEventListener("pointermove", onMove);
  canvas.addEventListener("pointerup", onUp);
  canvas.addEventListener("pointerleave", onLeave);
  canvas.addEventListener("wheel", onWheel, { passive: false });
  canvas.addEventListener("dblclick", onDbl);
  const RO = doc.defaultView && doc.defaultView.ResizeObserver;
  const ro = RO ? new RO(() => resize()) : null;
  if (ro) ro.observe(wrap);

  return {
    update(next) {
      const prevId = selected != null && layout && layout.nodes[selected] ? layout.nodes[selected].id : null;
      layout = next && Array.isArray(next.nodes) ? next : { nodes: [], edges: [], width: 0, height: 0 };
      selected = null;
      if (prevId != null) {
        const i = layout.nodes.findIndex((n) => n.id === prevId);
        if (i >= 0) selected = i;
      }
      buildGrid();
      if (!W) resize();
      else {
        if (!moved) fitNow();
        draw();
      }
    },
    select(id) {
      if (!layout) return false;
      const i = id == null ? -1 : layout.nodes.findIndex((n) => n.id === id);
      selected = i >= 0 ? i : null;
      draw();
      return i >= 0;
    },
    fit() { moved = false; fitNow(); draw(); },
    destroy() {
      if (ro) ro.disconnect();
      wrap.remove();
    },
  };
}
