//! External CLI agents (Claude Code, Codex CLI, any command): the orchestrator starts one MCP
//! server for the campaign (`rsim serve` on loopback, a bearer token per agent identity) and runs
//! the command once per task, with its role prompt, task and MCP endpoint in the environment.
//! The agent acts only through MCP tools — the same Experiment OS actions — and is stopped when
//! it runs past its turn or starts more training runs than its task allows.
//!
//! What an agent gets from the machine: the environment variables the owner names in
//! `[agents] env` (rsim.toml) and its own `RSIM_*` ones — nothing else is inherited; a private
//! working directory outside the study, made for its turn and removed after it, holding only its
//! own MCP config; and only its own token (the server's token file is deleted as soon as the
//! server has read it). Unless the study turns the sandbox off (`[policy] sandbox`), it runs
//! under `rsim job sandbox` (Landlock, `jobs::sandbox::all_but`): no access to the study
//! directory, to other agents' private directories, or to other processes' `/proc` entries.

use super::{ReviewTask, ReviewerAgent, WorkerAgent, WorkerTask};
use crate::model::{ActionName, Caller};
use crate::os::Execute;
use crate::os::Study;
use crate::util::error::{Error, Result};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The campaign's MCP server: a child `rsim serve` process, stopped when dropped.
struct Server {
    child: Child,
    url: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub struct CommandAgent {
    /// A shell command line, run with `sh -c`.
    command: String,
    root: PathBuf,
    tokens: BTreeMap<String, (String, String)>,
    server: Mutex<Option<Server>>,
    timeout: Duration,
}

/// Is the command's program installed? (The first word, looked up like the shell would.)
pub fn check_installed(command: &str) -> Result<()> {
    let prog = command
        .split_whitespace()
        .find(|w| !w.contains('='))
        .ok_or_else(|| Error::invalid("agent command is empty"))?;
    let found = if prog.contains('/') {
        Path::new(prog).is_file()
    } else {
        std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).any(|d| d.join(prog).is_file()))
            .unwrap_or(false)
    };
    if found {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "agent command {command:?}: `{prog}` is not installed (not found on PATH)"
        )))
    }
}

fn token() -> String {
    format!("{:032x}", rand::random::<u128>())
}

impl CommandAgent {
    /// `identities`: every (agent name, role) the campaign may run this command as.
    pub fn new(
        command: &str,
        root: &Path,
        identities: &[(String, String)],
        timeout: Duration,
    ) -> Result<CommandAgent> {
        check_installed(command)?;
        Ok(CommandAgent {
            command: command.to_string(),
            root: root.to_path_buf(),
            tokens: identities
                .iter()
                .map(|(n, r)| (n.clone(), (r.clone(), token())))
                .collect(),
            server: Mutex::new(None),
            timeout,
        })
    }

    /// Start the campaign's MCP server once, on a free loopback port.
    fn url(&self) -> Result<String> {
        let mut guard = self
            .server
            .lock()
            .map_err(|_| Error::internal("MCP server lock poisoned"))?;
        if let Some(s) = guard.as_ref() {
            return Ok(s.url.clone());
        }
        // The server reads its tokens at start-up; the file lives in a private directory outside
        // the study and is gone before any agent runs.
        let dir = private_dir("rsim-tokens")?;
        let tokens_path = dir.join("agent-tokens.toml");
        let mut toml = String::new();
        for (name, (role, tok)) in &self.tokens {
            toml.push_str(&format!(
                "[[agent]]\nname = \"{name}\"\nrole = \"{role}\"\ntoken = \"{tok}\"\n\n"
            ));
        }
        write_private(&tokens_path, &toml)?;
        let exe = crate::os::current_rsim()?;
        let mut child = Command::new(exe)
            .arg("serve")
            .args(["--http", "127.0.0.1:0", "--study"])
            .arg(&self.root)
            .arg("--tokens")
            .arg(&tokens_path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| Error::internal(format!("cannot start the MCP server: {e}")))?;
        let stderr = child
            .stderr
            .take()
            .ok_or_else(|| Error::internal("MCP server has no stderr"))?;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut sent = false;
            for line in BufReader::new(stderr).lines().map_while(|l| l.ok()) {
                if !sent && let Some(u) = line.split("listening on ").nth(1) {
                    let _ = tx.send(u.trim().to_string());
                    sent = true;
                } else {
                    tracing::debug!(target: "rsim::mcp_server", "{line}");
                }
            }
        });
        let url = rx.recv_timeout(Duration::from_secs(30));
        let _ = std::fs::remove_dir_all(&dir);
        let url = url.map_err(|_| {
            let _ = child.kill();
            Error::internal("the MCP server did not report its address within 30 s")
        })?;
        *guard = Some(Server {
            child,
            url: url.clone(),
        });
        Ok(url)
    }

    /// Run the command as `caller` with `prompt`; stop it past its turn or when `over_budget`
    /// says so (checked every second against the record).
    fn run_turn(
        &self,
        study: &Study,
        caller: &Caller,
        role_prompt: &str,
        task: &str,
        node: Option<&str>,
        over_budget: &dyn Fn(&Study) -> Option<String>,
    ) -> Result<()> {
        let url = self.url()?;
        let (_, tok) = self
            .tokens
            .get(&caller.agent)
            .ok_or_else(|| Error::internal(format!("no MCP token for agent {}", caller.agent)))?;
        // The turn's own working directory, outside the study, removed when the turn ends.
        let work = TurnDir(private_dir("rsim-agent")?);
        let dir = &work.0;
        // A ready-made MCP config for clients that take one (Claude Code's --mcp-config).
        let mcp_config = dir.join(format!("{}.mcp.json", caller.agent));
        write_private(
            &mcp_config,
            &serde_json::to_string_pretty(&serde_json::json!({
                "mcpServers": {"rsim": {"type": "http", "url": url,
                    "headers": {"Authorization": format!("Bearer {tok}")}}}
            }))?,
        )?;
        // The agent's output is kept with the study (the agent itself cannot see the other logs).
        let logs = self.root.join(crate::os::STATE_DIR).join("agents");
        std::fs::create_dir_all(&logs)
            .map_err(|e| Error::internal(format!("{}: {e}", logs.display())))?;
        let log_path = logs.join(format!("{}.log", caller.agent));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| Error::internal(format!("{}: {e}", log_path.display())))?;
        let log2 = log
            .try_clone()
            .map_err(|e| Error::internal(format!("{}: {e}", log_path.display())))?;
        let prompt = format!("{role_prompt}\n\n## Your task\n\n{task}\n");
        // The sandbox's description lives in its own private directory, removed with the turn.
        let sandbox_dir = TurnDir(private_dir("rsim-sandbox")?);
        let mut cmd = self.sandboxed_sh(study, dir, &sandbox_dir.0)?;
        cmd.env_clear();
        for name in &study.config().agents.env {
            if let Some(v) = std::env::var_os(name) {
                cmd.env(name, v);
            }
        }
        cmd.arg("-c")
            .arg(&self.command)
            .current_dir(dir)
            .env("RSIM_MCP_URL", &url)
            .env("RSIM_MCP_TOKEN", tok)
            .env("RSIM_MCP_CONFIG", &mcp_config)
            .env("RSIM_AGENT", &caller.agent)
            .env("RSIM_ROLE", caller.role.as_str())
            .env("RSIM_PROMPT", &prompt)
            .env("RSIM_NODE", node.unwrap_or(""))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2);
        {
            use std::os::unix::process::CommandExt;
            cmd.process_group(0);
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| Error::invalid(format!("agent command {:?}: {e}", self.command)))?;
        let started = Instant::now();
        let stop = |child: &mut Child| {
            let pgid = nix::unistd::Pid::from_raw(child.id() as i32);
            let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
            let _ = child.wait();
        };
        loop {
            match child.try_wait() {
                Ok(Some(status)) => {
                    return if status.success() {
                        Ok(())
                    } else {
                        Err(Error::internal(format!(
                            "agent command {:?} exited with {status} (log: {})",
                            self.command,
                            log_path.display()
                        )))
                    };
                }
                Ok(None) => {}
                Err(e) => return Err(Error::internal(format!("agent command: {e}"))),
            }
            if started.elapsed() > self.timeout {
                stop(&mut child);
                return Err(Error::internal(format!(
                    "agent command {:?} ran past its {} s turn and was stopped",
                    self.command,
                    self.timeout.as_secs()
                )));
            }
            if let Some(why) = over_budget(study) {
                stop(&mut child);
                return Err(Error::internal(format!(
                    "agent command {:?} was stopped: {why}",
                    self.command
                )));
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

impl CommandAgent {
    /// `sh`, or — unless the study turned the sandbox off — `rsim job sandbox FILE -- sh`: the
    /// agent may use the machine but not the study directory, nor the other rsim directories
    /// under the temporary directory (other agents' turns, the server's tokens), nor any other
    /// process's `/proc` entries (their environments), nor disks and memory devices.
    fn sandboxed_sh(&self, study: &Study, own: &Path, sandbox_dir: &Path) -> Result<Command> {
        use crate::config::SandboxMode;
        use crate::jobs::sandbox;
        let mode = study.config().policy.sandbox;
        if mode == SandboxMode::Off {
            return Ok(Command::new("sh"));
        }
        if mode == SandboxMode::Required
            && let Err(why) = sandbox::landlock_abi()
        {
            return Err(Error::invalid(format!(
                "agent command {:?}: the study requires a sandbox (policy.sandbox = \"required\") and this machine cannot apply one: {why}",
                self.command
            )));
        }
        let mut deny = vec![self.root.clone()];
        if let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) {
            deny.extend(
                entries
                    .flatten()
                    .filter(|e| e.file_name().to_string_lossy().starts_with("rsim-"))
                    .map(|e| e.path())
                    .filter(|p| p != own),
            );
        }
        let mut sb = sandbox::all_but(&deny, mode == SandboxMode::Required);
        sb.tmp = Some(own.to_path_buf());
        let file = sandbox_dir.join(sandbox::SANDBOX_FILE);
        sandbox::write(&sb, &file)?;
        let mut cmd = Command::new(crate::os::current_rsim()?);
        cmd.args(["job", "sandbox"]).arg(&file).args(["--", "sh"]);
        Ok(cmd)
    }
}

/// A fresh directory only this user can enter, under the system's temporary directory.
fn private_dir(prefix: &str) -> Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let p = std::env::temp_dir().join(format!("{prefix}-{:016x}", rand::random::<u64>()));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&p)
        .map_err(|e| Error::internal(format!("{}: {e}", p.display())))?;
    Ok(p)
}

/// An agent's working directory for one turn, removed when the turn ends.
struct TurnDir(PathBuf);

impl Drop for TurnDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn write_private(path: &Path, text: &str) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| Error::internal(format!("{}: {e}", path.display())))?;
    f.write_all(text.as_bytes())
        .map_err(|e| Error::internal(format!("{}: {e}", path.display())))
}

fn run_sft_count(study: &Study, node: &str) -> usize {
    study
        .node_actions(node)
        .map(|a| {
            a.iter()
                .filter(|r| r.action == ActionName::RunSft && r.decision.accepted())
                .count()
        })
        .unwrap_or(0)
}

impl WorkerAgent for CommandAgent {
    fn name(&self) -> &str {
        "command"
    }

    fn work(&self, study: &Study, t: &WorkerTask) -> Result<()> {
        let node = study.get_node(
            &t.caller,
            crate::api::types::GetNodeRequest::new(t.node.clone()),
        )?;
        let before = run_sft_count(study, &t.node);
        let allowed = t.opts.seeds_per_node as usize;
        let task = t.brief(&node);
        let node_id = t.node.clone();
        let result = self.run_turn(
            study,
            &t.caller,
            super::llm::WORKER_PROMPT,
            &task,
            Some(&t.node),
            &|s: &Study| {
                let n = run_sft_count(s, &node_id) - before;
                (n > allowed)
                    .then(|| format!("it started {n} training runs; its task allows {allowed}"))
            },
        );
        // Charge the campaign budget with what the agent really ran.
        let ran = run_sft_count(study, &t.node).saturating_sub(before);
        for _ in 0..ran {
            if !t.budget.claim() {
                break;
            }
        }
        t.close_if_open(study, &result, "agent command")?;
        result
    }
}

impl ReviewerAgent for CommandAgent {
    fn name(&self) -> &str {
        "command"
    }

    fn review(&self, study: &Study, t: &ReviewTask) -> Result<()> {
        let task = t.brief();
        self.run_turn(
            study,
            &t.caller,
            super::llm::REVIEWER_PROMPT,
            &task,
            None,
            &|_| None,
        )
    }
}
