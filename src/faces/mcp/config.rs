//! `rsim mcp-config --client claude|codex|gemini`: the snippet that connects a coding agent to a
//! study, under a server name of the owner's choosing (a worker and a reviewer side by side need
//! two names: Codex refuses two `[mcp_servers.X]` tables of one name).

use std::path::Path;

use crate::util::error::{Error, Result};

/// Which client's configuration to print.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Client {
    /// Claude Code: `.mcp.json` in the project directory.
    Claude,
    /// Codex CLI: `~/.codex/config.toml`.
    Codex,
    /// Gemini CLI: `.gemini/settings.json` in the project directory (or `~/.gemini/`).
    Gemini,
}

/// What the snippet connects: a server `name` running `rsim mcp` on a study as an identity.
pub struct Connection<'a> {
    pub name: &'a str,
    pub role: &'a str,
    /// The agent name its commits carry (`rsim mcp --agent`); `None`: rsim's default.
    pub agent: Option<&'a str>,
}

/// The configuration text for `client`, launching `rsim mcp` (this executable) on `study` as the
/// connection's role and agent, under its server name.
pub fn snippet(client: Client, study: &Path, c: &Connection<'_>) -> Result<String> {
    let name = c.name;
    if name.is_empty()
        || name.len() > 64
        || !name
            .chars()
            .all(|ch| ch.is_ascii_alphanumeric() || ch == '-' || ch == '_')
    {
        return Err(Error::invalid(format!(
            "--name {name:?}: 1-64 letters, digits, '-' or '_' (hosts name tools mcp__<name>__<tool>)"
        )));
    }
    let study = study
        .canonicalize()
        .map_err(|e| Error::invalid(format!("--study {}: {e}", study.display())))?;
    if !study.join(crate::config::CONFIG_FILE).is_file() {
        return Err(Error::invalid(format!(
            "--study {}: not a study (no {}); create one with `rsim init`",
            study.display(),
            crate::config::CONFIG_FILE
        )));
    }
    let exe = std::env::current_exe()
        .map_err(|e| Error::internal(format!("cannot find the rsim executable: {e}")))?;
    let exe = exe.to_string_lossy().into_owned();
    let study = study.to_string_lossy().into_owned();
    let mut args = vec![
        "mcp".to_string(),
        "--study".to_string(),
        study,
        "--role".to_string(),
        c.role.to_string(),
    ];
    if let Some(agent) = c.agent {
        args.extend(["--agent".to_string(), agent.to_string()]);
    }
    Ok(match client {
        Client::Claude => {
            let v = serde_json::json!({
                "mcpServers": { name: { "type": "stdio", "command": exe, "args": args, "env": {} } }
            });
            serde_json::to_string_pretty(&v)? + "\n"
        }
        Client::Gemini => {
            let v = serde_json::json!({
                "mcpServers": { name: { "command": exe, "args": args } }
            });
            serde_json::to_string_pretty(&v)? + "\n"
        }
        Client::Codex => {
            #[derive(serde::Serialize)]
            struct Server {
                command: String,
                args: Vec<String>,
            }
            let mut servers = std::collections::BTreeMap::new();
            servers.insert(name, Server { command: exe, args });
            let mut root = std::collections::BTreeMap::new();
            root.insert("mcp_servers", servers);
            toml::to_string(&root)
                .map_err(|e| Error::internal(format!("cannot write TOML: {e}")))?
        }
    })
}
