// Headless Chromium against a real `rsim serve` while a small campaign runs (tools/web.sh runs
// this): the DAG appears and grows, a node panel opens, a learning curve is drawn, live updates
// arrive, an observer cannot write, a wrong token is refused and a right one signs in, hostile
// titles and hypotheses do not execute (served page and static report). Screenshots go to $WEB_OUT.
//
// Env: RSIM_BIN (the rsim binary), WEB_OUT (screenshots), CHROMIUM (default /usr/bin/chromium).
import { chromium } from "playwright-core";
import { spawn, execFileSync } from "node:child_process";
import { mkdtempSync, mkdirSync, writeFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";

const RSIM = resolve(process.env.RSIM_BIN || "target/debug/rsim");
const OUT = resolve(process.env.WEB_OUT || "test-output/web");
mkdirSync(OUT, { recursive: true });
const tmp = mkdtempSync(join(tmpdir(), "rsim-web-"));
const study = join(tmp, "study");
const children = [];
let failures = 0;
const t0 = Date.now();

function log(...a) { console.error(`[web ${((Date.now() - t0) / 1000).toFixed(1)}s]`, ...a); }
function check(ok, what) {
  if (ok) log("ok  ", what);
  else { failures++; log("FAIL", what); }
}
function rsim(args, opts = {}) {
  return execFileSync(RSIM, ["-C", study, ...args], { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"], ...opts });
}
function serve(args) {
  return new Promise((res, rej) => {
    const p = spawn(RSIM, ["-C", study, "serve", "--http", "127.0.0.1:0", ...args], { stdio: ["ignore", "ignore", "pipe"], detached: true });
    children.push(p);
    let buf = "";
    const timer = setTimeout(() => rej(new Error("serve did not start: " + buf)), 20000);
    p.stderr.on("data", (d) => {
      buf += d;
      const m = buf.match(/the web page is at (http:\/\/\S+)\n/);
      if (m) { clearTimeout(timer); res(m[1]); }
    });
    p.on("exit", (c) => rej(new Error("serve exited " + c + ": " + buf)));
  });
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
async function until(f, ms, what) {
  const end = Date.now() + ms;
  for (;;) {
    try { const v = await f(); if (v) return v; } catch (_) { /* retry */ }
    if (Date.now() > end) throw new Error("timed out: " + what);
    await sleep(250);
  }
}

const HOSTILE_TITLE = `"><img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script>`;
const HOSTILE_HYP = `<script>window.__pwned=3</script> <a href="javascript:window.__pwned=4">click</a> <svg onload="window.__pwned=5">`;

let browser;
try {
  // A study of the tiny example, and a node with hostile text written through the CLI (a worker).
  execFileSync(RSIM, ["init", "--example", "tiny-arith", study], { stdio: "ignore" });
  rsim(["--role", "worker", "--agent", "mallory", "branch", "--from", "n0", "--title", HOSTILE_TITLE, "--hypothesis", HOSTILE_HYP]);
  let bidiRefused = false;
  try { rsim(["--role", "worker", "branch", "--from", "n0", "--title", "abc\u202Eexe.txt"]); } catch (_) { bidiRefused = true; }
  check(bidiRefused, "a title with a bidi override is refused by the API's text pattern");

  const url = await serve([]);
  log("observer page at", url);
  browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    args: ["--no-sandbox", "--disable-dev-shm-usage"],
  });
  const ctx = await browser.newContext({ viewport: { width: 1400, height: 1000 } });
  const page = await ctx.newPage();
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  // Refused requests the test makes on purpose are logged by Chromium as "Failed to load
  // resource"; any other console error is a failure.
  page.on("console", (m) => { if (m.type() === "error" && !m.text().startsWith("Failed to load resource")) errors.push(m.text()); });
  await page.goto(url);
  await page.waitForSelector("body[data-ready='1']", { timeout: 20000 });
  const first = Number(await page.getAttribute("body", "data-nodes"));
  check(first >= 2, `the DAG appears (${first} nodes)`);
  await page.screenshot({ path: join(OUT, "1-start.png") });

  // A campaign runs in the background; the page grows by server-sent events, no reload.
  const campaign = spawn(RSIM, ["-C", study, "run", "--experiments", "3", "--steps", "150", "--quiet"], { stdio: "ignore", detached: true });
  children.push(campaign);
  const grown = await until(async () => {
    const n = Number(await page.getAttribute("body", "data-nodes"));
    return n > first ? n : 0;
  }, 120000, "the DAG grows");
  check(grown > first, `the DAG grows live (${first} → ${grown} nodes)`);
  check(Number(await page.getAttribute("body", "data-tick")) > 0, "change events arrive");
  const live = await page.textContent("#live");
  check(live === "live", `the event stream is connected (${live})`);

  // Wait for the campaign to finish so a run has its loss curve recorded.
  await until(() => campaign.exitCode !== null, 240000, "the campaign ends");
  check(campaign.exitCode === 0, "the campaign ran to its end");
  await sleep(1200);
  await page.screenshot({ path: join(OUT, "2-grown.png") });

  // A node panel: a click on the canvas where a node is drawn.
  const layout = await page.evaluate(async () => (await fetch("/api/dag")).json());
  const withRun = layout.nodes.find((n) => n.id !== "n0" && n.score !== undefined);
  check(!!withRun, "a node has a mean dev score");
  await page.evaluate((id) => { location.hash = "#" + id; }, withRun.id);
  await page.waitForSelector("#node-title", { timeout: 10000 });
  const title = await page.textContent("#node-title");
  check(title.startsWith(withRun.id), `the node panel opens (${title})`);
  await page.waitForSelector("#panel svg.curve polyline", { timeout: 15000 });
  const pts = await page.$$eval("#panel svg.curve polyline", (ls) => ls.map((l) => l.getAttribute("points").split(" ").length));
  check(pts.length > 0 && pts.some((p) => p >= 2), `a learning curve is drawn (${pts.length} line(s))`);
  await page.screenshot({ path: join(OUT, "3-node-panel.png") });

  // Canvas click: find the node on screen from the layout the page drew.
  const box = await page.locator("#dag canvas").boundingBox();
  await page.mouse.click(box.x + box.width / 2, box.y + box.height / 2);
  check(errors.length === 0, "no script error after clicking the canvas");

  // Comparison with intervals.
  await page.click("#compare-toggle");
  await page.waitForSelector("#compare svg.intervals", { timeout: 10000 });
  check(true, "the comparison draws means with their intervals");

  // An observer cannot write: no write form, and a write is refused by the policy.
  check(await page.$("#readonly") !== null, "the observer's panel says read-only");
  const refused = await page.evaluate(async (id) => {
    const r = await fetch("/api/call/conclude", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ node: id, outcome: "positive", findings: "x" }) });
    return { status: r.status, body: await r.json() };
  }, withRun.id);
  check(refused.status === 403 && refused.body.rule === "role", `an observer's write is refused (${refused.status} ${refused.body.rule})`);

  // Hostile text is shown as text and never runs.
  const hostile = layout.nodes.find((n) => n.title === HOSTILE_TITLE);
  check(!!hostile, "the hostile title is in the layout verbatim");
  await page.evaluate((id) => { location.hash = "#" + id; }, hostile.id);
  await page.waitForFunction((t) => document.querySelector("#node-title")?.textContent.includes(t), HOSTILE_TITLE, { timeout: 10000 });
  const hyp = await page.textContent("#hypothesis");
  check(hyp === HOSTILE_HYP, "the hostile hypothesis is shown as text");
  check(await page.$("#panel img, #panel script, #panel a[href^='javascript']") === null, "no element was made from agent text");
  check(await page.evaluate(() => window.__pwned === undefined), "no hostile script ran");
  await page.screenshot({ path: join(OUT, "4-hostile.png") });

  // Unknown node: a clear answer, the page keeps working.
  await page.evaluate(() => { location.hash = "#n99999"; });
  await page.waitForFunction(() => document.querySelector("#panel .error")?.textContent.includes("no node"), null, { timeout: 10000 });
  check(true, "an unknown node in the URL is a clear error");
  check(errors.length === 0, `no script errors (${errors.join(" | ")})`);

  // The static report: the same page, one file, hashed inline script, no execution of agent text.
  const html = join(tmp, "report.html");
  rsim(["report", "--html", html]);
  const sp = await ctx.newPage();
  const serrors = [];
  sp.on("pageerror", (e) => serrors.push(String(e)));
  sp.on("console", (m) => { if (m.type() === "error" && !m.text().startsWith("Failed to load resource")) serrors.push(m.text()); });
  await sp.goto("file://" + html);
  await sp.waitForSelector("body[data-ready='1']", { timeout: 20000 });
  check(Number(await sp.getAttribute("body", "data-nodes")) >= grown, "the static report draws the DAG");
  check(await sp.evaluate(() => window.__pwned === undefined), "no hostile script ran in the static report");
  check(serrors.length === 0, `the static report runs under its CSP (${serrors.join(" | ")})`);
  await sp.screenshot({ path: join(OUT, "5-static-report.png") });

  // A refused live stream (a server at its stream limit answers 503, which closes an EventSource
  // for good) is retried with backoff until it is live.
  const rp = await ctx.newPage();
  let refusedStreams = 0;
  await rp.route("**/api/events", (route) => {
    if (refusedStreams < 2) {
      refusedStreams++;
      return route.fulfill({ status: 503, body: "too many event streams" });
    }
    return route.continue();
  });
  await rp.goto(url);
  await rp.waitForFunction(() => document.querySelector("#live")?.textContent === "live", null, { timeout: 30000 });
  check(refusedStreams === 2, `a refused event stream is retried until it is live (${refusedStreams} refused first)`);
  await rp.close();

  // Tokens: a wrong token is refused, the right one signs in (HttpOnly, SameSite=Strict cookie).
  const tokens = join(tmp, "tokens.toml");
  writeFileSync(tokens, `[[agent]]\nname = "lead"\nrole = "reviewer"\ntoken = "right-token-0123456789"\n`);
  const turl = await serve(["--tokens", tokens]);
  const tctx = await browser.newContext();
  const tp = await tctx.newPage();
  await tp.goto(turl);
  check(await tp.$("input[name=token]") !== null, "a server with tokens asks for one");
  const api = await tp.evaluate(async () => (await fetch("/api/dag")).status);
  check(api === 401, `the API without a token is refused (${api})`);
  await tp.fill("input[name=token]", "wrong-token-0123456789");
  const [resp] = await Promise.all([tp.waitForNavigation(), tp.click("button[type=submit]")]);
  check(resp.status() === 401 && (await tp.textContent("body")).includes("not valid"), `a wrong token is refused (${resp.status()})`);
  await tp.fill("input[name=token]", "right-token-0123456789");
  await Promise.all([tp.waitForNavigation(), tp.click("button[type=submit]")]);
  await tp.waitForSelector("body[data-ready='1']", { timeout: 20000 });
  const me = await tp.textContent("#me");
  check(me.includes("lead") && me.includes("reviewer"), `the right token signs in (${me})`);
  const cookies = await tctx.cookies();
  const c = cookies.find((k) => k.name === "rsim_token");
  check(c && c.httpOnly && c.sameSite === "Strict", "the token cookie is HttpOnly and SameSite=Strict");
  check(await tp.evaluate(() => document.cookie.includes("rsim_token")) === false, "the page's script cannot read the token");
  // Cross-site writes: the cookie is not enough without this page's Origin.
  const cross = await tp.request.post(turl + "api/call/conclude", { headers: { Origin: "http://evil.example", "Content-Type": "application/json" }, data: { node: "n1", outcome: "positive", findings: "x" } });
  check(cross.status() === 403, `a cross-origin write is refused (${cross.status()})`);
  await tp.screenshot({ path: join(OUT, "6-signed-in.png") });
} catch (e) {
  failures++;
  log("FAIL", e.stack || String(e));
} finally {
  if (browser) await browser.close().catch(() => {});
  for (const p of children) { try { process.kill(-p.pid, "SIGTERM"); } catch (_) { /* gone */ } }
  // Each server gets its 5 s of graceful shutdown and a little more; one still running then is
  // killed before its study is removed (a server left behind once outlived its study, polling
  // for it at full speed through the rest of the CI run).
  await Promise.all(children.map((p) => (p.exitCode !== null || p.signalCode !== null) ? null : new Promise((r) => {
    const t = setTimeout(() => { try { process.kill(-p.pid, "SIGKILL"); } catch (_) { /* gone */ } r(); }, 8000);
    p.on("exit", () => { clearTimeout(t); r(); });
  })));
  rmSync(tmp, { recursive: true, force: true });
}
log(failures ? `${failures} failure(s)` : "all web checks passed", "— screenshots in", OUT);
process.exit(failures ? 1 : 0);
