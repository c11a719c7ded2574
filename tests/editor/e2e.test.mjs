// The extension end to end in a real VS Code: code-server (from npm) driven through headless
// Chromium by playwright-core. Installs the .vsix, opens a study while `rsim run` works in it,
// checks that the Research view and the DAG webview show the nodes and update live, that a wrong
// key in rsim.toml gets its diagnostic, and that a clone of the study made by a reader without its
// key (`rsim clone`, another HOME, a second code-server) opens read-only: marked in the status bar,
// the Research view and the DAG's bar, and a write from the palette refused, nothing recorded.
// Saves screenshots to test-output/editor/ (or $EDITOR_OUT).
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

let d, study, env, run, browser, page;
const servers = [];

const until = (what, fn, ms = 60000) =>
  untilOr(what, fn, ms, () => shot(`timeout-${what.replace(/[^a-z0-9]+/gi, "-")}`));

async function shot(name) {
  await page.screenshot({ path: join(OUT, `${name}.png`) });
  log("screenshot", join(OUT, `${name}.png`));
}

const command = (title) => paletteCommand(page, title);

const branch = (title) =>
  execFileSync(RSIM, ["-C", study, "--json", "branch", "--from", "n0", "--title", title], { env });

/** A user's environment with its own HOME (made) under the test's temporary folder. */
function userEnv(home) {
  mkdirSync(home, { recursive: true });
  return {
    ...process.env,
    HOME: home,
    XDG_CONFIG_HOME: join(home, ".config"),
    XDG_DATA_HOME: join(home, ".local/share"),
    XDG_CACHE_HOME: join(home, ".cache"),
    TMPDIR: d,
  };
}

/** code-server as the user of `env`, its settings and extensions under `root`, the .vsix installed,
 * opening `folder`; resolves to its port once it answers. */
async function startCode(env, root, folder) {
  const user = join(root, "user");
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
  const cfg = join(root, "cfg.yaml");
  writeFileSync(cfg, `bind-addr: 127.0.0.1:${port}\nauth: none\ncert: false\n`);
  const dirs = ["--config", cfg, "--user-data-dir", user, "--extensions-dir", join(root, "ext")];
  execFileSync(CODE, [...dirs, "--install-extension", VSIX], { env, stdio: "ignore" });
  const server = spawn(
    CODE,
    [...dirs, "--disable-telemetry", "--disable-update-check", "--disable-workspace-trust",
      "--disable-getting-started-override", folder],
    { env, detached: true, stdio: ["ignore", "ignore", "pipe"] },
  );
  server.stderr.on("data", () => {});
  servers.push(server);
  await until("code-server listening", async () => (await fetch(`http://127.0.0.1:${port}/healthz`)).ok);
  return port;
}

/** A browser page on code-server at `port` with `folder` open, once the workbench is there. */
async function openPage(port, folder) {
  const p = await browser.newPage({ viewport: { width: 1500, height: 900 } });
  await p.goto(`http://127.0.0.1:${port}/?folder=${encodeURIComponent(folder)}`);
  await p.locator(".monaco-workbench").waitFor({ timeout: 90000 });
  return p;
}

before(async () => {
  mkdirSync(OUT, { recursive: true });
  d = mkdtempSync(join(tmpdir(), "rsim-e2e-"));
  env = userEnv(join(d, "home"));
  study = join(d, "study");
  execFileSync(RSIM, ["init", study, "--example", "tiny-arith-ngram"], { env, stdio: "ignore" });
  const port = await startCode(env, d, study);
  // The campaign works in the study while the editor watches it.
  run = spawn(RSIM, ["-C", study, "run", "--experiments", "6", "--steps", "400", "--seeds-per-node", "1"], {
    env, detached: true, stdio: "ignore",
  });
  browser = await chromium.launch({
    executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
    args: ["--no-sandbox", "--disable-dev-shm-usage"],
  });
  page = await openPage(port, study);
});

after(async () => {
  for (const p of [run, ...servers]) {
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

test("a write from the palette asks, is recorded and says so (the owner's study)", async () => {
  const title = "e2e node branched from the palette";
  await command("rsim: Branch from a node");
  const input = page.locator(".quick-input-widget input");
  await until("the node pick", async () => (await input.isVisible()) && /Nodes/.test(await input.getAttribute("placeholder")));
  await input.fill("n0");
  await page.locator(".quick-input-list .monaco-list-row", { hasText: "n0" }).first().waitFor();
  await page.keyboard.press("Enter");
  await until("the title box", async () => /Title of the new node under n0/.test(await page.locator(".quick-input-widget").textContent()));
  await input.fill(title);
  await page.keyboard.press("Enter");
  const toasts = page.locator(".notifications-toasts .notification-toast");
  await until("the success message", async () =>
    (await toasts.allTextContents()).some((t) => /rsim: branch recorded \([0-9a-f]{10}\)/.test(t)), 20000);
  const dag = JSON.parse(execFileSync(RSIM, ["-C", study, "--json", "dag"], { env }));
  assert.ok(dag.nodes.some((n) => n.title === title), "the node is in the record");
  await command("Notifications: Clear All Notifications");
});

test("a clone without the study's key opens read-only: marked everywhere, writes refused", async () => {
  // A reader: another HOME, no key; `rsim clone` takes the study with every node branch.
  const rootR = join(d, "reader");
  const envR = userEnv(join(rootR, "home"));
  const clone = join(d, "clone");
  execFileSync(RSIM, ["clone", study, clone], { env: envR, stdio: "ignore" });
  const total = () => JSON.parse(execFileSync(RSIM, ["-C", clone, "--json", "dag"], { env: envR })).total;
  const cloned = total();
  assert.ok(cloned >= 2, `the clone has the study's nodes (${cloned})`);
  const portR = await startCode(envR, rootR, clone);
  const owner = page;
  page = await openPage(portR, clone);
  try {
    // The status bar: a lock, "read-only", and the clone's nodes.
    const item = page.locator(".statusbar-item", { hasText: "rsim read-only" });
    await until("the read-only status bar item", async () =>
      (await page.locator(".statusbar-item").allTextContents()).some((t) =>
        new RegExp(`rsim read-only · ${cloned}/\\d+ nodes`).test(t)), 90000);
    assert.equal(await item.locator(".codicon-lock").count(), 1, "the item shows a lock");
    // Its tooltip gives the reason.
    await item.hover();
    await until("the status bar tooltip", async () =>
      /read-only clone: \S/.test((await page.locator(".monaco-hover").allTextContents()).join(" ")), 20000);
    await page.mouse.move(700, 450);
    // The Research view says why.
    await command("View: Show rsim");
    const message = page.locator(".pane-body .message", { hasText: /read-only clone: \S/ });
    await until("the Research view's read-only message", () => message.isVisible());
    // A write from the palette is refused with the reason, and nothing is recorded.
    await command("rsim: Branch from a node");
    const toasts = page.locator(".notifications-toasts .notification-toast");
    await until("the refusal", async () =>
      (await toasts.allTextContents()).some((t) => /branch: read-only clone: .*nothing was recorded/.test(t)), 20000);
    assert.ok(!(await toasts.allTextContents()).some((t) => /recorded \(/.test(t)), "no success message");
    assert.equal(total(), cloned, "nothing was recorded in the clone");
    await command("Notifications: Clear All Notifications");
    await until("the notifications cleared", async () => (await toasts.count()) === 0, 10000);
    // The DAG webview draws the clone's nodes, its bar marked read-only with the reason as tooltip.
    await command("rsim: Open the research DAG");
    const frame = page.frameLocator("iframe.webview").frameLocator("#active-frame");
    const dag = frame.locator("#dag");
    await until("the clone's DAG drawn", async () => Number(await dag.getAttribute("data-total")) === cloned);
    const bar = frame.locator("#bar");
    await until("the bar says read-only", async () => /^read-only clone · \d+ of \d+ nodes/.test(await bar.textContent()));
    assert.equal(await dag.getAttribute("data-read-only"), "true");
    assert.match(await bar.locator(".read-only").getAttribute("title"), /\S/, "the reason is the mark's tooltip");
    await frame.locator("#goto").fill("n0");
    await frame.locator("#goto").press("Enter");
    await until("the node panel", async () => /^n0 — /.test(await frame.locator(".node-title").textContent()));
    await shot("clone-read-only");
  } finally {
    await page.close().catch(() => {});
    page = owner;
  }
});
