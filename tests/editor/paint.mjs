// Benchmark (prints figures, asserts nothing): the DAG webview's first paint in VS Code (code-server
// through headless Chromium) on studies of N nodes grown through rsim lsp's own rsim.branch command:
// first_paint_ms from the webview's script start to the first frame after dag.js drew the layout
// (asking for it, rsim laying it out, sending it included), since_frame_ms the same from the
// webview frame's own start (its loading of the script included), and command_to_drawn_ms from the
// command palette to the drawing seen from outside (VS Code's own UI and this script's polling
// included).
//   node tests/editor/paint.mjs [N ...]        (default 1000 10000; 3 openings each)
// RSIM_BIN, VSIX, CHROMIUM as for e2e.test.mjs.
import { spawn, execFileSync } from "node:child_process";
import { mkdtempSync, mkdirSync, rmSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { chromium } from "playwright-core";
import { freePort, paletteCommand, until } from "./harness.mjs";
import * as rpc from "vscode-jsonrpc/node";
import * as lsp from "vscode-languageserver-protocol/node";

const HERE = import.meta.dirname;
const ROOT = resolve(HERE, "../..");
const RSIM = resolve(process.env.RSIM_BIN ?? join(ROOT, "target/debug/rsim"));
const VSIX = resolve(process.env.VSIX ?? join(ROOT, "editors/vscode/rsim.vsix"));
const CODE = join(HERE, "node_modules/.bin/code-server");
const SIZES = process.argv.slice(2).map(Number).filter((n) => n > 1);
let page;

const command = (title) => paletteCommand(page, title);

async function grow(study, n) {
  const cfg = join(study, "rsim.toml");
  writeFileSync(cfg, readFileSync(cfg, "utf8").replace(/max_nodes = \d+/, `max_nodes = ${n + 10}`));
  execFileSync("git", ["-C", study, "-c", "user.name=owner", "-c", "user.email=owner@localhost",
    "-c", "commit.gpgsign=false", "commit", "-q", "-am", "room for the benchmark"]);
  const server = spawn(RSIM, ["-C", study, "lsp"], { stdio: ["pipe", "pipe", "inherit"] });
  const conn = rpc.createMessageConnection(new rpc.StreamMessageReader(server.stdout), new rpc.StreamMessageWriter(server.stdin));
  conn.listen();
  await conn.sendRequest(lsp.InitializeRequest.type, { processId: process.pid, rootUri: null, capabilities: {} });
  for (let i = 1; i < n; i++) {
    const parent = i < 10 ? "n0" : `n${1 + Math.floor(Math.random() * (i - 1))}`;
    await conn.sendRequest(lsp.ExecuteCommandRequest.type, { command: "rsim.branch", arguments: [{ parents: [parent], title: `direction ${i}` }] });
  }
  await conn.sendRequest(lsp.ShutdownRequest.type);
  conn.dispose();
  server.kill();
}

const results = [];
for (const n of SIZES.length ? SIZES : [1000, 10000]) {
  const d = mkdtempSync(join(tmpdir(), "rsim-paint-"));
  const home = join(d, "home");
  mkdirSync(home);
  const env = { ...process.env, HOME: home, XDG_CONFIG_HOME: join(home, ".config"), XDG_DATA_HOME: join(home, ".local/share"), XDG_CACHE_HOME: join(home, ".cache"), TMPDIR: d };
  const study = join(d, "study");
  execFileSync(RSIM, ["init", study, "--example", "tiny-arith-ngram"], { env, stdio: "ignore" });
  await grow(study, n);
  const user = join(d, "user");
  mkdirSync(join(user, "User"), { recursive: true });
  writeFileSync(join(user, "User/settings.json"), JSON.stringify({
    "rsim.path": RSIM, "chat.disableAIFeatures": true, "workbench.secondarySideBar.defaultVisibility": "hidden",
    "workbench.startupEditor": "none", "security.workspace.trust.enabled": false,
  }));
  const port = await freePort();
  const cfg = join(d, "cfg.yaml");
  writeFileSync(cfg, `bind-addr: 127.0.0.1:${port}\nauth: none\ncert: false\n`);
  const dirs = ["--config", cfg, "--user-data-dir", user, "--extensions-dir", join(d, "ext")];
  execFileSync(CODE, [...dirs, "--install-extension", VSIX], { env, stdio: "ignore" });
  const server = spawn(CODE, [...dirs, "--disable-telemetry", "--disable-update-check", "--disable-workspace-trust", study],
    { env, detached: true, stdio: "ignore" });
  await until("code-server", async () => (await fetch(`http://127.0.0.1:${port}/healthz`)).ok);
  const browser = await chromium.launch({ executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium", args: ["--no-sandbox", "--disable-dev-shm-usage"] });
  page = await browser.newPage({ viewport: { width: 1500, height: 900 } });
  await page.goto(`http://127.0.0.1:${port}/?folder=${encodeURIComponent(study)}`);
  await until("the extension", async () =>
    (await page.locator(".statusbar-item").allTextContents()).some((t) => /rsim \d+\/\d+ nodes/.test(t)), 120000);
  const times = [];
  for (let k = 0; k < 3; k++) {
    const t0 = Date.now();
    await command("rsim: Open the research DAG");
    const frame = page.frameLocator("iframe.webview").frameLocator("#active-frame");
    await until("drawn", async () => Number(await frame.locator("#dag").getAttribute("data-total", { timeout: 1000 })) === n, 120000);
    const paint = await until("painted", async () => Number(await frame.locator("#dag").getAttribute("data-first-paint-ms", { timeout: 1000 })));
    const frameMs = Number(await frame.locator("#dag").getAttribute("data-since-frame-ms", { timeout: 1000 }));
    times.push({ first_paint_ms: paint, since_frame_ms: frameMs, command_to_drawn_ms: Date.now() - t0 });
    await command("View: Close All Editors");
    await page.waitForTimeout(500);
  }
  const med = (k) => times.map((t) => t[k]).sort((a, b) => a - b)[1];
  results.push({ nodes: n, runs: times, median_first_paint_ms: med("first_paint_ms"), median_since_frame_ms: med("since_frame_ms"), median_command_to_drawn_ms: med("command_to_drawn_ms") });
  await browser.close();
  try { process.kill(-server.pid, "SIGTERM"); } catch {}
  rmSync(d, { recursive: true, force: true });
}
console.log(JSON.stringify({ binary: RSIM, results }, null, 2));
