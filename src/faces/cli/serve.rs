//! The serving commands: one MCP client over stdio (`rsim mcp`), an editor over stdio
//! (`rsim lsp`), many MCP clients and the web page over HTTP (`rsim serve`), and the client
//! configuration that connects a coding agent (`rsim mcp-config`).

use std::path::{Path, PathBuf};

use super::{Cli, McpClient, agent_role, caller, mcp_options};
use crate::model::Caller;
use crate::util::error::{Error, Result};

/// `rsim mcp`: one client over stdio, as --agent (default mcp-<pid>) in --role (default worker).
pub fn mcp_stdio(cli: &Cli, dir: &Path, job_wait: f64) -> Result<()> {
    let who = Caller::new(
        cli.agent
            .clone()
            .unwrap_or_else(|| format!("mcp-{}", std::process::id())),
        agent_role(cli)?,
    );
    crate::faces::mcp::serve_stdio(dir, who, mcp_options(job_wait)?)
}

/// `rsim lsp`: the study is -C or $RSIM_STUDY, else the editor's workspace.
pub fn lsp(cli: &Cli) -> Result<()> {
    let root = cli
        .study
        .clone()
        .or_else(|| std::env::var_os("RSIM_STUDY").map(PathBuf::from));
    crate::faces::lsp::serve_stdio(crate::faces::lsp::Options {
        root,
        caller: caller(cli)?,
    })
}

/// `rsim serve --http ADDR`: MCP at /mcp and the web page at /.
pub fn http(
    cli: &Cli,
    dir: &Path,
    addr: &str,
    tokens: Option<&Path>,
    job_wait: f64,
    agents: &[String],
) -> Result<()> {
    crate::faces::mcp::http::serve(
        dir,
        crate::faces::mcp::http::HttpOptions {
            addr: addr.to_string(),
            tokens: tokens.map(Path::to_path_buf),
            role: agent_role(cli)?,
            agent: cli.agent.clone().unwrap_or_else(|| "http".to_string()),
            agents: agents.to_vec(),
        },
        mcp_options(job_wait)?,
    )
}

/// `rsim mcp-config`: the snippet a client's configuration takes.
pub fn mcp_config(cli: &Cli, dir: &Path, client: McpClient, name: &str) -> Result<()> {
    use crate::faces::mcp::config::{Client, Connection, snippet};
    let c = match client {
        McpClient::Claude => Client::Claude,
        McpClient::Codex => Client::Codex,
        McpClient::Gemini => Client::Gemini,
    };
    if cli.json && c == Client::Codex {
        return Err(Error::invalid(
            "--json: Codex's configuration is TOML; run without --json (Claude Code's and Gemini CLI's are JSON already)",
        ));
    }
    let role = agent_role(cli)?;
    let conn = Connection {
        name,
        role: role.as_str(),
        agent: cli.agent.as_deref(),
    };
    print!("{}", snippet(c, dir, &conn)?);
    Ok(())
}
