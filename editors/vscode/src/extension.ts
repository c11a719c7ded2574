// The rsi-master extension: a client of `rsim lsp`. Everything it shows comes from the server's
// custom requests (the core's queries); everything it changes goes through the server's
// owner commands (the core's actions, validated, policy-checked and recorded). It keeps no
// state of the study of its own: on rsim/recordChanged it asks again.
import * as vscode from "vscode";
import { spawnSync } from "node:child_process";
import * as path from "node:path";
import {
  LanguageClient,
  LanguageClientOptions,
  ServerOptions,
} from "vscode-languageclient/node";

let client: LanguageClient | undefined;

type Json = any;

function settings() {
  const c = vscode.workspace.getConfiguration("rsim");
  const folder = vscode.workspace.workspaceFolders?.[0]?.uri.fsPath;
  let study = c.get<string>("studyFolder") || "";
  if (study && !path.isAbsolute(study) && folder) study = path.join(folder, study);
  return { rsim: c.get<string>("path") || "rsim", study: study || folder || "" };
}

/** Whether `rsim` runs at all; a message naming the setting to fix when it does not. */
function checkRsim(rsim: string): string | undefined {
  const r = spawnSync(rsim, ["--version"], { encoding: "utf8", timeout: 10000 });
  if (r.error || r.status !== 0) {
    const why = r.error ? r.error.message : (r.stderr || "").trim();
    return `rsim was not found or does not run at "${rsim}" (${why}). Set "rsim.path" to the rsim binary.`;
  }
  return undefined;
}

async function request<T = Json>(method: string, params: Json = {}): Promise<T> {
  if (!client) throw new Error("rsim lsp is not running");
  return client.sendRequest<T>(method, params);
}

/** Why the study is read-only (a clone without its private key), from `rsim/summary`,
 * `rsim/status` or `rsim/dag`; null when it is writable. */
function readOnlyReason(r: Json): string | null {
  const ro = r?.read_only;
  return typeof ro === "string" && ro ? ro : null;
}

function fmtScore(mean: number | null | undefined, ci?: number[] | null): string {
  if (mean === null || mean === undefined) return "–";
  if (ci && ci.length === 2) return `${mean.toFixed(3)} ± ${((ci[1] - ci[0]) / 2).toFixed(3)}`;
  return mean.toFixed(3);
}

// ---------------------------------------------------------------- Research view

const GROUPS: [string, string][] = [
  ["running", "Running jobs"],
  ["frontier", "Frontier"],
  ["promising", "Promising"],
  ["dead_end", "Dead ends"],
  ["concluded", "Concluded"],
];

class Item extends vscode.TreeItem {
  constructor(
    label: string,
    public readonly kind: "group" | "node" | "job",
    public readonly key: string,
    state: vscode.TreeItemCollapsibleState,
  ) {
    super(label, state);
  }
}

class ResearchTree implements vscode.TreeDataProvider<Item> {
  private changed = new vscode.EventEmitter<Item | undefined>();
  readonly onDidChangeTreeData = this.changed.event;
  summary: Json | undefined;

  refresh(summary: Json) {
    this.summary = summary;
    this.changed.fire(undefined);
  }

  getTreeItem(i: Item) {
    return i;
  }

  getChildren(parent?: Item): Item[] {
    const s = this.summary;
    if (!s) return [];
    if (!parent) {
      return GROUPS.map(([key, label]) => {
        const count = key === "running" ? s.jobs.length : s.groups?.[key] ?? 0;
        const it = new Item(
          `${label} (${count})`,
          "group",
          key,
          key === "concluded" || count === 0
            ? vscode.TreeItemCollapsibleState.Collapsed
            : vscode.TreeItemCollapsibleState.Expanded,
        );
        it.id = `group:${key}`;
        return it;
      });
    }
    if (parent.kind !== "group") return [];
    if (parent.key === "running") {
      return s.jobs.map((j: Json) => {
        const p = j.progress;
        const pct = p && p.total ? ` ${Math.round((100 * p.step) / p.total)}%` : "";
        const it = new Item(`${j.job}`, "job", j.job, vscode.TreeItemCollapsibleState.None);
        it.description = `${j.action} on ${j.node}${pct}${p && p.loss != null ? ` loss ${p.loss}` : ""}`;
        it.iconPath = new vscode.ThemeIcon("sync~spin");
        it.command = { command: "rsim.showJobLog", title: "Show job log", arguments: [j.job] };
        it.id = `job:${j.job}`;
        return it;
      });
    }
    return s.nodes
      .filter((n: Json) => n.group === parent.key)
      .map((n: Json) => {
        const it = new Item(`${n.id} ${n.title}`, "node", n.id, vscode.TreeItemCollapsibleState.None);
        it.description = [
          n.score != null ? `dev ${fmtScore(n.score)} (n=${n.evals})` : "",
          n.verdict ? n.verdict : n.status,
        ]
          .filter(Boolean)
          .join(" · ");
        it.tooltip = `${n.id}: ${n.title}`;
        it.contextValue = "rsimNode";
        it.command = { command: "rsim.openNode", title: "Open node", arguments: [n.id] };
        it.id = `node:${n.id}`;
        return it;
      });
  }
}

// ---------------------------------------------------------------- the DAG webview

class DagPanel {
  static current: DagPanel | undefined;
  private panel: vscode.WebviewPanel;
  private selected: string | undefined;
  private logTimer: NodeJS.Timeout | undefined;

  static show(ctx: vscode.ExtensionContext) {
    if (DagPanel.current) {
      DagPanel.current.panel.reveal();
      return DagPanel.current;
    }
    DagPanel.current = new DagPanel(ctx);
    return DagPanel.current;
  }

  private constructor(ctx: vscode.ExtensionContext) {
    const dist = vscode.Uri.joinPath(ctx.extensionUri, "dist");
    this.panel = vscode.window.createWebviewPanel("rsimDag", "Research DAG", vscode.ViewColumn.Active, {
      enableScripts: true,
      retainContextWhenHidden: true,
      localResourceRoots: [dist],
    });
    const script = this.panel.webview.asWebviewUri(vscode.Uri.joinPath(dist, "dagview.js"));
    const nonce = Math.random().toString(36).slice(2) + Date.now().toString(36);
    const csp = this.panel.webview.cspSource;
    this.panel.webview.html = `<!DOCTYPE html><html><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; img-src ${csp} data:; style-src ${csp} 'unsafe-inline'; script-src 'nonce-${nonce}';">
<style>
 body{margin:0;padding:0;font-family:var(--vscode-font-family);color:var(--vscode-foreground);display:flex;height:100vh;overflow:hidden}
 #dag{flex:1;min-width:0;position:relative} #side{width:380px;overflow:auto;border-left:1px solid var(--vscode-panel-border);padding:8px;font-size:12px}
 #side h2{font-size:14px;margin:4px 0} table{border-collapse:collapse} td,th{padding:2px 6px;text-align:left;vertical-align:top}
 pre{white-space:pre-wrap;max-height:240px;overflow:auto;background:var(--vscode-textCodeBlock-background);padding:4px}
 #top{position:absolute;top:4px;left:8px;z-index:2;font-size:12px;background:var(--vscode-editor-background);padding:2px 6px;opacity:.95}
 #bar .read-only{font-weight:600;color:var(--vscode-editorWarning-foreground,#b58900)}
 #goto{width:90px;margin-right:8px;background:var(--vscode-input-background);color:var(--vscode-input-foreground);border:1px solid var(--vscode-input-border,#888)}
</style></head><body><div id="dag"><div id="top"><input id="goto" placeholder="node id ⏎" aria-label="Open a node by id"><span id="bar"></span></div></div><div id="side"><p>Click a node.</p></div>
<script nonce="${nonce}" src="${script}"></script></body></html>`;
    this.panel.webview.onDidReceiveMessage((m) => this.onMessage(m));
    this.panel.onDidDispose(() => {
      DagPanel.current = undefined;
      if (this.logTimer) clearInterval(this.logTimer);
    });
  }

  private async onMessage(m: Json) {
    if (m.type === "ready") await this.refresh();
    if (m.type === "select" && typeof m.id === "string") {
      this.selected = m.id;
      await this.showNode(m.id);
    }
    if (m.type === "expand" && typeof m.id === "string") await this.refresh([m.id]);
    if (m.type === "commit" && typeof m.commit === "string") showCommit(m.commit);
  }

  private expanded = new Set<string>();

  async refresh(expand: string[] = []) {
    for (const e of expand) this.expanded.add(e);
    try {
      const layout = await request("rsim/dag", { expand: [...this.expanded] });
      this.panel.webview.postMessage({ type: "layout", layout });
      if (this.selected) await this.showNode(this.selected);
    } catch (e: any) {
      this.panel.webview.postMessage({ type: "error", message: String(e.message ?? e) });
    }
  }

  private async showNode(id: string) {
    try {
      const panel = await request("rsim/node", { node: id });
      this.panel.webview.postMessage({ type: "node", panel });
      if (this.logTimer) clearInterval(this.logTimer);
      const job = panel.running?.[0]?.job;
      if (job) {
        const poll = async () => {
          try {
            const log = await request("rsim/jobLog", { job, max_bytes: 8192 });
            this.panel.webview.postMessage({ type: "log", job, log });
            if (!log.running && this.logTimer) clearInterval(this.logTimer);
          } catch {}
        };
        await poll();
        this.logTimer = setInterval(poll, 1000);
      }
    } catch (e: any) {
      this.panel.webview.postMessage({ type: "error", message: String(e.message ?? e) });
    }
  }
}

function showCommit(commit: string) {
  const { study } = settings();
  if (!/^[0-9a-f]{7,64}$/.test(commit)) return;
  const t = vscode.window.createTerminal({ name: `rsim: commit ${commit.slice(0, 10)}`, cwd: study });
  t.show();
  t.sendText(`git --no-pager show --stat ${commit}`);
}

// ---------------------------------------------------------------- activation

export async function activate(ctx: vscode.ExtensionContext) {
  const out = vscode.window.createOutputChannel("rsim", { log: true });
  ctx.subscriptions.push(out);
  const { rsim, study } = settings();
  const missing = checkRsim(rsim);
  if (missing) {
    out.error(missing);
    vscode.window.showErrorMessage(missing, "Open Settings").then((c) => {
      if (c) vscode.commands.executeCommand("workbench.action.openSettings", "rsim.path");
    });
    return;
  }
  const args = study ? ["-C", study, "lsp"] : ["lsp"];
  const serverOptions: ServerOptions = { command: rsim, args };
  // The server's commands (rsim.branch, rsim.conclude, rsim.compare, rsim.cancelJob) are made VS
  // Code commands by the language client itself, at every start; a second registration of those
  // ids is refused ("command already exists"). So this extension's own handlers (pick a node, ask
  // for a title, …) are all kept here, and the client's commands run them through its
  // executeCommand middleware; only the ids the server does not own are registered directly.
  const handlers = new Map<string, (...a: any[]) => unknown>();
  const clientOptions: LanguageClientOptions = {
    documentSelector: [
      { scheme: "file", pattern: "**/rsim.toml" },
      { scheme: "file", language: "markdown" },
      { scheme: "file", language: "plaintext" },
      { scheme: "rsim" },
    ],
    outputChannel: out,
    middleware: {
      executeCommand: (name, cmdArgs, next) => {
        const h = handlers.get(name);
        return h ? h(...cmdArgs) : next(name, cmdArgs);
      },
    },
  };
  const tree = new ResearchTree();
  const view = vscode.window.createTreeView("rsimResearch", { treeDataProvider: tree });
  ctx.subscriptions.push(view);
  const status = vscode.window.createStatusBarItem(vscode.StatusBarAlignment.Left, 10);
  status.command = "rsim.openDag";
  ctx.subscriptions.push(status);

  client = new LanguageClient("rsim", "rsim", serverOptions, clientOptions);
  try {
    await client.start();
  } catch (e: any) {
    view.message = `rsim lsp did not start: ${e.message ?? e} (see the "rsim" output; settings rsim.path, rsim.studyFolder)`;
    return;
  }

  // Read-only node documents.
  const docs = new (class implements vscode.TextDocumentContentProvider {
    changed = new vscode.EventEmitter<vscode.Uri>();
    onDidChange = this.changed.event;
    async provideTextDocumentContent(uri: vscode.Uri) {
      const r = await request("rsim/nodeDocument", { uri: uri.toString() });
      return r.text as string;
    }
  })();
  ctx.subscriptions.push(vscode.workspace.registerTextDocumentContentProvider("rsim", docs));

  let pending: NodeJS.Timeout | undefined;
  const refresh = async () => {
    try {
      const s = await request("rsim/summary", {});
      tree.refresh(s);
      const best = s.nodes.find((n: Json) => n.id === s.best);
      const used = s.budgets.compute_seconds;
      const pct = used.limit ? Math.round((100 * used.used) / used.limit) : 0;
      // A clone without the study's private key: every view works, every write is refused.
      const ro = readOnlyReason(s);
      status.text = `${ro ? "$(lock) rsim read-only ·" : "$(graph) rsim"} ${s.summary?.nodes ?? 0}/${
        s.budgets.max_nodes
      } nodes · best ${best ? `${best.id} ${fmtScore(best.score)}` : "–"} · compute ${pct}%${
        s.jobs.length ? ` · $(sync~spin) ${s.jobs.length}` : ""
      }`;
      status.tooltip =
        (ro ? `rsim: read-only clone: ${ro}\n\n` : "") +
        "rsim: nodes / max_nodes · best dev score · compute budget used · running jobs";
      status.show();
      view.message = ro ? `read-only clone: ${ro}` : undefined;
      view.description = ro ? "read-only" : undefined;
    } catch (e: any) {
      status.text = "$(warning) rsim";
      status.tooltip = String(e.message ?? e);
      status.show();
      view.message = String(e.message ?? e);
    }
    await DagPanel.current?.refresh();
  };
  client.onNotification("rsim/recordChanged", () => {
    // Changes come in bursts (a job's claim, its record): look again once they settle.
    if (pending) clearTimeout(pending);
    pending = setTimeout(refresh, 150);
  });
  // Running jobs' progress is not a record change: poll while any runs.
  const progress = setInterval(() => {
    if (tree.summary?.jobs?.length) refresh();
  }, 2000);
  ctx.subscriptions.push({ dispose: () => clearInterval(progress) });
  await refresh();

  const nodeIds = async (many: boolean) => {
    const s = tree.summary ?? (await request("rsim/summary", {}));
    const picks = s.nodes.map((n: Json) => ({ label: n.id, description: n.title }));
    const r = await vscode.window.showQuickPick(picks, { canPickMany: many, placeHolder: "Nodes" });
    if (!r) return [];
    return (Array.isArray(r) ? r : [r]).map((p: Json) => p.label as string);
  };
  // A write is refused in a read-only clone: say so before asking anything, with the server's
  // reason (asked again, not the summary's: the study's key may have been put back since).
  const refuseReadOnly = async (what: string): Promise<boolean> => {
    let ro: string | null = null;
    try {
      ro = readOnlyReason(await request("rsim/status", {}));
    } catch {
      return false; // the write itself says what is wrong
    }
    if (!ro) return false;
    vscode.window.showErrorMessage(`rsim: ${what}: read-only clone: ${ro}; nothing was recorded`);
    return true;
  };
  const command = async (name: string, arg: Json): Promise<Json | undefined> => {
    try {
      const r: Json = await client!.sendRequest("workspace/executeCommand", { command: name, arguments: [arg] });
      vscode.window.showInformationMessage(`rsim: ${name.replace("rsim.", "")} recorded${r?.commit ? ` (${String(r.commit).slice(0, 10)})` : ""}`);
      return r;
    } catch (e: any) {
      // The server's reason as it is ("read-only clone: …", a policy refusal, a bad argument).
      const msg = `rsim: ${name.replace("rsim.", "")} failed: ${e.message ?? e}`;
      out.error(msg);
      vscode.window.showErrorMessage(msg);
      return undefined;
    }
  };

  const serverCommands = new Set(client.initializeResult?.capabilities.executeCommandProvider?.commands ?? []);
  const register = (id: string, fn: (...a: any[]) => unknown): vscode.Disposable => {
    handlers.set(id, fn);
    return serverCommands.has(id) ? new vscode.Disposable(() => handlers.delete(id)) : vscode.commands.registerCommand(id, fn);
  };

  ctx.subscriptions.push(
    register("rsim.openDag", () => DagPanel.show(ctx)),
    register("rsim.refresh", refresh),
    register("rsim.openNode", async (id?: string) => {
      const node = id ?? (await nodeIds(false))[0];
      if (!node) return;
      const doc = await vscode.workspace.openTextDocument(vscode.Uri.parse(`rsim://node/${node}`));
      await vscode.window.showTextDocument(doc, { preview: true });
    }),
    register("rsim.compare", async () => {
      const nodes = await nodeIds(true);
      if (nodes.length === 0) return;
      const c = await request("rsim/compare", { nodes });
      const panel = vscode.window.createWebviewPanel("rsimCompare", "Compare nodes", vscode.ViewColumn.Active, {});
      const esc = (s: string) => String(s).replace(/[&<>"']/g, (ch) => `&#${ch.charCodeAt(0)};`);
      const ci = (x: number[] | null) => (x ? `[${x[0].toFixed(4)}, ${x[1].toFixed(4)}]` : "–");
      const rows = c.nodes
        .map(
          (r: Json) =>
            `<tr><td>${esc(r.node)}</td><td>${r.values.length}</td><td>${
              r.mean == null ? "–" : r.mean.toFixed(4)
            }</td><td>${ci(r.ci95)}</td></tr>`,
        )
        .join("");
      const diffs = c.diffs
        .map((d: Json) => `<tr><td>${esc(d.b)} − ${esc(d.a)}</td><td>${d.diff.toFixed(4)}</td><td>${ci(d.ci95)}</td></tr>`)
        .join("");
      panel.webview.html = `<!DOCTYPE html><html><body><h3>${esc(c.metric ?? "")} on ${esc(c.task ?? "")} (dev)</h3>
<table><tr><th>node</th><th>n</th><th>mean</th><th>95% CI</th></tr>${rows}</table>
<h3>Differences (Welch 95% CI)</h3><table><tr><th>pair</th><th>difference</th><th>95% CI</th></tr>${diffs}</table></body></html>`;
    }),
    register("rsim.recordCompare", async () => {
      if (await refuseReadOnly("record a comparison")) return;
      const nodes = await nodeIds(true);
      if (nodes.length === 0) return;
      await command("rsim.compare", { node: nodes[0], nodes });
    }),
    register("rsim.branch", async (item?: Item) => {
      if (await refuseReadOnly("branch")) return;
      const parent = item?.key ?? (await nodeIds(false))[0];
      if (!parent) return;
      const title = await vscode.window.showInputBox({ prompt: `Title of the new node under ${parent}` });
      if (!title) return;
      await command("rsim.branch", { parents: [parent], title });
    }),
    register("rsim.conclude", async (item?: Item) => {
      if (await refuseReadOnly("conclude")) return;
      const node = item?.key ?? (await nodeIds(false))[0];
      if (!node) return;
      const outcome = await vscode.window.showQuickPick(["positive", "negative", "inconclusive"], {
        placeHolder: `Outcome of ${node}`,
      });
      if (!outcome) return;
      const findings = await vscode.window.showInputBox({ prompt: "Findings" });
      if (findings === undefined) return;
      await command("rsim.conclude", { node, outcome, findings });
    }),
    register("rsim.cancelJob", async (item?: Item | string) => {
      if (await refuseReadOnly("cancel a job")) return;
      const job =
        typeof item === "string"
          ? item
          : item?.key ?? (await vscode.window.showQuickPick((tree.summary?.jobs ?? []).map((j: Json) => j.job)));
      if (!job) return;
      await command("rsim.cancelJob", { job });
    }),
    register("rsim.showJobLog", async (jobArg?: string | Item) => {
      const job =
        typeof jobArg === "string"
          ? jobArg
          : jobArg?.key ??
            (await vscode.window.showInputBox({
              prompt: "Job id",
              value: tree.summary?.jobs?.[0]?.job ?? "",
            }));
      if (!job) return;
      const ch = vscode.window.createOutputChannel(`rsim job ${job}`);
      ch.show(true);
      let shown = "";
      const poll = async () => {
        try {
          const r = await request("rsim/jobLog", { job, max_bytes: 65536 });
          if (r.log !== shown) {
            ch.replace(r.log);
            shown = r.log;
          }
          return r.running;
        } catch (e: any) {
          ch.appendLine(`error: ${e.message ?? e}`);
          return false;
        }
      };
      if (await poll()) {
        const t = setInterval(async () => {
          if (!(await poll())) clearInterval(t);
        }, 1000);
      }
    }),
    register("rsim.startRun", async () => {
      if (await refuseReadOnly("rsim run")) return;
      const { rsim: bin, study: dir } = settings();
      const t = vscode.window.createTerminal({ name: "rsim run", cwd: dir });
      t.show();
      t.sendText(`${JSON.stringify(bin)} -C ${JSON.stringify(dir)} run`);
    }),
    register("rsim.showCommit", async () => {
      const node = (await nodeIds(false))[0];
      if (!node) return;
      const log = await request("rsim/log", { node, limit: 200 });
      const pick = await vscode.window.showQuickPick(
        log.actions.map((a: Json) => ({ label: `${a.seq} ${a.action}`, description: a.summary, commit: a.commit })),
        { placeHolder: "Action" },
      );
      if (pick) showCommit((pick as Json).commit);
    }),
  );
}

export async function deactivate() {
  await client?.stop();
}
