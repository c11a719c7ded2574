//! `rsim mcp-config --client claude|codex`: the snippet that connects a coding agent to a study.

use std::path::Path;

use crate::util::error::{Error, Result};

/// Which client's configuration to print.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Client {
    /// Claude Code: `.mcp.json` in the project directory.
    Claude,
    /// Codex CLI: `~/.codex/config.toml`.
    Codex,
}

/// The configuration text for `client`, launching `rsim mcp` (this executable) on `study` as `role`.
pub fn snippet(client: Client, study: &Path, role: &str) -> Result<String> {
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
    let args = vec![
        "mcp".to_string(),
        "--study".to_string(),
        study,
        "--role".to_string(),
        role.to_string(),
    ];
    Ok(match client {
        Client::Claude => {
            let v = serde_json::json!({
                "mcpServers": { "rsim": { "type": "stdio", "command": exe, "args": args, "env": {} } }
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
            servers.insert("rsim", Server { command: exe, args });
            let mut root = std::collections::BTreeMap::new();
            root.insert("mcp_servers", servers);
            toml::to_string(&root)
                .map_err(|e| Error::internal(format!("cannot write TOML: {e}")))?
        }
    })
}
