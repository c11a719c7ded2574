// Helpers shared by the editor's browser-driven scripts (e2e.test.mjs, paint.mjs): a free port for
// code-server, polling until a condition holds, and running a command from VS Code's palette.
import { createServer } from "node:net";

/** A TCP port free on loopback right now. */
export function freePort() {
  return new Promise((res) => {
    const s = createServer().listen(0, "127.0.0.1", () => {
      const p = s.address().port;
      s.close(() => res(p));
    });
  });
}

/** Poll `fn` every 300 ms until it returns something truthy (returned), or fail after `ms` naming
 * `what` and the last value or error; `onTimeout` runs first (e.g. a screenshot). */
export async function until(what, fn, ms = 60000, onTimeout = async () => {}) {
  const t0 = Date.now();
  let last;
  while (Date.now() - t0 < ms) {
    try {
      last = await fn();
      if (last) return last;
    } catch (e) {
      last = e;
    }
    await new Promise((r) => setTimeout(r, 300));
  }
  await onTimeout().catch(() => {});
  throw new Error(`timed out: ${what} (last: ${last})`);
}

/** Run a command by its title from VS Code's command palette. */
export async function paletteCommand(page, title) {
  await page.keyboard.press("F1");
  const input = page.locator(".quick-input-widget input");
  await input.waitFor({ state: "visible" });
  await input.fill(`>${title}`);
  await page.locator(".quick-input-list .monaco-list-row").first().waitFor();
  await page.keyboard.press("Enter");
}
