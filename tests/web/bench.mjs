// The web page's benchmark (not a timed test; tools/web-bench.sh runs it): first paint in
// headless Chromium of a made-up DAG of 1k, 10k and 100k nodes served by `rsim bench --web N`
// (navigation start → the frame after the DAG is drawn: page, assets, the layout computed by
// the server, JSON, canvas), the median of several loads cold (a fresh server computes the
// layout) and warm (the layout cached for the record's state); and the server's memory with
// 100 open pages (each: the page, its assets, /api/me, /api/dag, /api/overview and an open event
// stream, as a browser tab holds them).
//
// Env: RSIM_BIN, CHROMIUM, RUNS (loads per size, default 5), SIZES (default 1000,10000,100000).
import { chromium } from "playwright-core";
import { spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { resolve } from "node:path";
import http from "node:http";

const RSIM = resolve(process.env.RSIM_BIN || "target/debug/rsim");
const RUNS = Number(process.env.RUNS || 5);
const SIZES = (process.env.SIZES || "1000,10000,100000").split(",").map(Number);

function serve(n) {
  return new Promise((res, rej) => {
    const p = spawn(RSIM, ["bench", "--web", String(n), "--http", "127.0.0.1:0"], { stdio: ["ignore", "ignore", "pipe"], detached: true });
    let buf = "";
    p.stderr.on("data", (d) => {
      buf += d;
      const m = buf.match(/the web page is at (http:\/\/\S+)\n/);
      if (m) res({ p, url: m[1] });
    });
    p.on("exit", (c) => rej(new Error("bench --web exited " + c + ": " + buf)));
  });
}
const rssMiB = (pid) => Number(readFileSync(`/proc/${pid}/status`, "utf8").match(/VmRSS:\s+(\d+)/)[1]) / 1024;
const median = (xs) => { const s = [...xs].sort((a, b) => a - b); return s[Math.floor(s.length / 2)]; };
const get = (url) => new Promise((res, rej) => http.get(url, (r) => { r.resume(); r.on("end", res); }).on("error", rej));

const browser = await chromium.launch({ executablePath: process.env.CHROMIUM || "/usr/bin/chromium", args: ["--no-sandbox", "--disable-dev-shm-usage"] });
const rows = [];
let memory = null;
async function firstPaint(url) {
  const ctx = await browser.newContext({ viewport: { width: 1400, height: 900 } });
  const page = await ctx.newPage();
  await page.goto(url);
  await page.waitForSelector("body[data-first-paint]", { timeout: 120000 });
  const ms = Number(await page.getAttribute("body", "data-first-paint"));
  const shown = Number(await page.getAttribute("body", "data-nodes"));
  await ctx.close();
  return { ms, shown };
}

for (const n of SIZES) {
  // Cold: a fresh server, so the page waits for the layout (as after every change of the
  // record); warm: the next page, served the layout cached for that change.
  const cold = [], warm = [];
  let shown = 0;
  for (let i = 0; i < RUNS; i++) {
    const { p, url } = await serve(n);
    const c = await firstPaint(url);
    cold.push(c.ms);
    shown = c.shown;
    warm.push((await firstPaint(url)).ms);
    if (n === 10000 && i === 0) {
      // 100 pages as a tab holds them, against the 10k server.
      const before = rssMiB(p.pid);
      const streams = [];
      for (let k = 0; k < 100; k++) {
        for (const a of ["", "assets/app.js", "assets/dag.js", "assets/app.css", "api/me", "api/dag", "api/overview"]) await get(url + a);
        streams.push(await new Promise((res, rej) => {
          const r = http.get(url + "api/events", (resp) => { resp.once("data", () => res(r)); });
          r.on("error", rej);
        }));
      }
      await new Promise((r) => setTimeout(r, 1000));
      const after = rssMiB(p.pid);
      memory = { pages: 100, nodes: n, rss_before_mib: +before.toFixed(1), rss_after_mib: +after.toFixed(1) };
      console.error(`server RSS with 100 open pages (10k nodes): ${after.toFixed(1)} MiB (${before.toFixed(1)} MiB with one page before)`);
      for (const s of streams) s.destroy();
    }
    try { process.kill(-p.pid, "SIGTERM"); } catch (_) { /* gone */ }
    await new Promise((r) => setTimeout(r, 300));
  }
  rows.push({ nodes: n, shown, cold_ms: median(cold), warm_ms: median(warm), cold_runs: cold, warm_runs: warm });
  console.error(`${n} nodes (${shown} drawn): first paint cold ${median(cold)} ms (${cold.join(", ")}), warm ${median(warm)} ms (${warm.join(", ")})`);
}
await browser.close();
console.log(JSON.stringify({ rows, memory }, null, 2));
