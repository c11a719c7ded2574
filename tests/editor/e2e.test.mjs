// The extension end to end in a real VS Code: code-server (from npm) driven through headless
// Chromium by playwright-core. Installs the .vsix, opens a study while `rsim run` works in it,
// checks that the Research view and the DAG webview show the nodes and update live, that a wrong
// key in rsim.toml gets its diagnostic, and saves screenshots to tests/editor/out/.
//
// RSIM_BIN: the rsim binary; VSIX: the packaged extension; CHROMIUM: the browser
// (default /usr/bin/chromium). Everything code-server writes goes under a temporary HOME.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn, execFileSync } from "node:child_process";
import { mkdtempSync, mkdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { chromium } from "playwright-core";
import { freePort, paletteCommand, until as untilOr } from "./harness.mjs";

const HERE = import.meta.dirname;
const ROOT = resolve(HERE, "../..");
const RSIM = resolve(process.env.RSIM_BIN ?? join(ROOT, "target/debug/rsim"));
const VSIX = resolve(process.env.VSIX ?? join(ROOT, "editors/vscode/rsim.vsix"));
const CODE = join(HERE, "node_modules/.bin/code-server");
const OUT = resolve(process.env.EDITOR_OUT ?? join(ROOT, "test-output/editor"));
const log = (...a) => console.error("[e2e]", ...a);

let d, study, env, server, run, browser, page;

const until = (what, fn, ms = 60000) =>
  untilOr(what, fn, ms, () => shot(`timeout-${what.replace(/[^a-z0-9]+/gi, "-")}`));

async function shot(name) {
  await page.screenshot({ path: join(OUT, `${name}.png`) });
  log("screenshot", join(OUT, `${name}.png`));
}

const command = (title) => paletteCommand(page, title);

const branch = (title) =>
  execFileSync(RSIM, ["-C", study, "--json", "branch", "--from", "n0", "--title", title], { env });

before(async () => {
  mkdirSync(OUT, { recursive: true });
  d = mkdtempSync(join(tmpdir(), "rsim-e2e-"));
  const home = join(d, "home");
  mkdirSync(home);
  env = {
    ...process.env,
    HOME: home,
    XDG_CONFIG_HOME: join(home, ".config"),
    XDG_DATA_HOME: join(home, ".local/share"),
    XDG_CACHE_HOME: join(home, ".cache"),
    TMPDIR: d,
  };
  study = join(d, "study");
  execFileSync(RSIM, ["init", study, "--example", "tiny-arith-ngram"], { env, stdio: "ignore" });
  const user = join(d, "user");
  mkdirSync(join(user, "User"), { recursive: true });
  writeFileSync(
    join(user, "User/settings.json"),
    JSON.stringify({
      "rsim.path": RSIM,
      "chat.disableAIFeatures": true,
      "workbench.secondarySideBar.defaultVisibility": "hidden",
      "workbench.startupEditor": "none",
      "workbench.tips.enabled": false,
      "security.workspace.trust.enabled": false,
      "extensions.autoCheckUpdates": false,
      "telemetry.telemetryLevel": "off",
    }),
  );
  const port = await freePort();
  const cfg = join(d, "cfg.yaml");
  writeFileSync(cfg, `bind-addr: 127.0.0.1:${port}\nauth: none\ncert: false\n`);
  const dirs = ["--config", cfg, "--user-data-dir", user, "--extensions-dir", join(d, "ext")];
  execFileSync(CODE, [...dirs, "--install-extension", VSIX], { env, stdio: "ignore" });
  server = spawn(
    CODE,
    [...dirs, "--disable-telemetry", "--disable-update-check", "--disable-workspace-trust",
      "--disable-getting-started-override", study],
    { env, detached: true, stdio: ["ignore", "ignore", "pipe"] },
  );
  server.stderr.on("data", () => {});
  // The campaign works in the study while the editor watches it.
  run = spawn(RSIM, ["-C", study, "run", "--experiments", "6", "--steps", "400", "--seeds-per-node", "1"], {
    env, detached: true, stdio: "ignore",
  });
  await until("code-server listening", async () => (await fetch(`http://127.0.0.1:${port}/healthz`)).ok);
  browser = await chromium.launch({
    executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
    args: ["--no-sandbox", "--disable-dev-shm-usage"],
  });
  page = await browser.newPage({ viewport: { width: 1500, height: 900 } });
  await page.goto(`http://127.0.0.1:${port}/?folder=${encodeURIComponent(study)}`);
  await page.locator(".monaco-workbench").waitFor({ timeout: 90000 });
});

after(async () => {
  for (const p of [run, server]) {
    try {
      process.kill(-p.pid, "SIGTERM");
    } catch {}
  }
  await browser?.close();
  if (process.env.KEEP) log("kept", d);
  else rmSync(d, { recursive: true, force: true });
});

test("the Research view lists the study's nodes and updates live", async () => {
  // The extension is active once its status bar item shows the study.
  await until("the rsim status bar item", async () =>
    (await page.locator(".statusbar-item").allTextContents()).some((t) => /rsim \d+\/\d+ nodes/.test(t)), 90000);
  const rows = page.locator(".pane-body .monaco-list-row");
  const frontier = async () => (await rows.allTextContents()).some((t) => t.startsWith("Frontier"));
  await until("the Frontier group", async () => {
    if (!(await frontier())) await command("View: Show rsim");
    return frontier();
  });
  const live = "e2e live node";
  branch(live);
  await until("the new node in the tree", async () =>
    (await rows.allTextContents()).some((t) => t.includes(live)), 30000);
  await shot("research-view");
});

test("the DAG webview draws the nodes and follows the record", async () => {
  await command("rsim: Open the research DAG");
  const frame = page.frameLocator("iframe.webview").frameLocator("#active-frame");
  const dag = frame.locator("#dag");
  const shown = async () => Number(await dag.getAttribute("data-total"));
  const before = await until("the DAG drawn", async () => (await shown()) >= 2 && (await shown()));
  branch("e2e node seen by the DAG");
  await until("the DAG updated", async () => (await shown()) > before, 30000);
  await until("the bar says how many nodes", async () => /nodes/.test(await frame.locator("#bar").textContent()));
  // A node's panel: its title, dev score, actions with their commits, the loss-curve section.
  await frame.locator("#goto").fill("n0");
  await frame.locator("#goto").press("Enter");
  await until("the node panel", async () => /^n0 — /.test(await frame.locator(".node-title").textContent()));
  assert.match(await frame.locator("#side").textContent(), /Training loss/);
  await shot("dag-view");
});

test("a wrong key in rsim.toml gets its diagnostic", async () => {
  await command("View: Show Explorer");
  const item = page.locator('.explorer-item:has-text("rsim.toml")');
  await item.first().click();
  const editor = page.locator(".monaco-editor .view-lines").first();
  await editor.waitFor();
  await editor.click();
  await page.keyboard.press("Control+Home");
  await page.keyboard.type("colour = 3\n");
  await until("an error squiggle", async () => (await page.locator(".monaco-editor .squiggly-error").count()) > 0, 30000);
  await command("View: Focus Problems (Errors, Warnings, Infos)");
  await until("the problem listed", async () =>
    (await page.locator(".markers-panel .monaco-list-row").allTextContents()).some((t) => t.includes("unknown field `colour`")), 20000);
  await shot("diagnostic");
});
