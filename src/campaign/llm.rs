//! LLM agents through an OpenAI-compatible chat-completions endpoint with tool calling. The tools
//! are the Experiment OS actions with the same JSON Schemas the MCP face serves, filtered by the
//! agent's role; every tool call goes through `Study::call` — the one code path every face uses.

use super::{AgentSpec, ReviewTask, ReviewerAgent, WorkerAgent, WorkerTask};
use crate::api::schema::ACTIONS;
use crate::model::Caller;
use crate::os::Execute;
use crate::os::Study;
use crate::util::error::{Error, ErrorKind, Result};
use serde_json::{Value, json};
use std::time::Duration;

pub const WORKER_PROMPT: &str = include_str!("../../prompts/worker.md");
pub const REVIEWER_PROMPT: &str = include_str!("../../prompts/reviewer.md");

/// Most model turns in one task before the agent is stopped.
const MAX_TURNS: usize = 40;

pub struct LlmAgent {
    url: String,
    model: String,
    key: Option<String>,
    agent: ureq::Agent,
}

impl LlmAgent {
    pub fn new(spec: &AgentSpec) -> Result<LlmAgent> {
        let AgentSpec::Llm {
            url,
            model,
            key_env,
        } = spec
        else {
            return Err(Error::internal("LlmAgent needs an llm agent spec"));
        };
        let key = key_env.as_ref().and_then(|k| std::env::var(k).ok());
        let config = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(300)))
            .http_status_as_error(false)
            .build();
        Ok(LlmAgent {
            url: url.trim_end_matches('/').to_string(),
            model: model.clone(),
            key,
            agent: config.into(),
        })
    }

    /// Check the endpoint answers at all (a TCP connection, no tokens spent), so an unreachable
    /// URL is one clear error before the campaign starts.
    pub fn preflight(&self) -> Result<()> {
        let rest = self.url.split_once("://").map(|x| x.1).unwrap_or(&self.url);
        let hostport = rest.split('/').next().unwrap_or(rest);
        let with_port = if hostport
            .rsplit_once(':')
            .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
        {
            hostport.to_string()
        } else if self.url.starts_with("https://") {
            format!("{hostport}:443")
        } else {
            format!("{hostport}:80")
        };
        use std::net::ToSocketAddrs;
        let addrs = with_port.to_socket_addrs().map_err(|e| {
            Error::invalid(format!(
                "LLM endpoint {}: cannot resolve {with_port}: {e}",
                self.url
            ))
        })?;
        for a in addrs {
            if std::net::TcpStream::connect_timeout(&a, Duration::from_secs(5)).is_ok() {
                return Ok(());
            }
        }
        Err(Error::invalid(format!(
            "LLM endpoint {} is unreachable (no connection to {with_port}); check the URL or start the server",
            self.url
        )))
    }

    fn chat(&self, messages: &[Value], tools: &[Value]) -> Result<Value> {
        let body = json!({
            "model": self.model,
            "messages": messages,
            "tools": tools,
            "tool_choice": "auto",
        });
        let mut req = self
            .agent
            .post(format!("{}/chat/completions", self.url))
            .header("content-type", "application/json");
        if let Some(k) = &self.key {
            req = req.header("authorization", format!("Bearer {k}"));
        }
        let mut resp = req
            .send(serde_json::to_vec(&body)?.as_slice())
            .map_err(|e| Error::internal(format!("LLM endpoint {}: {e}", self.url)))?;
        let status = resp.status().as_u16();
        let text = resp
            .body_mut()
            .with_config()
            .limit(16 << 20)
            .read_to_string()
            .map_err(|e| {
                Error::internal(format!(
                    "LLM endpoint {}: reading the answer: {e}",
                    self.url
                ))
            })?;
        if status != 200 {
            let snippet: String = text.chars().take(300).collect();
            return Err(Error::internal(format!(
                "LLM endpoint {} answered HTTP {status}: {snippet}",
                self.url
            )));
        }
        serde_json::from_str(&text).map_err(|e| {
            Error::internal(format!(
                "LLM endpoint {}: the answer is not JSON: {e}",
                self.url
            ))
        })
    }

    /// Run the tool-calling loop until the model stops calling tools. `allow` limits tool calls
    /// (e.g. the training runs a task may spend); it returns an error message to give the model.
    fn converse(
        &self,
        study: &Study,
        caller: &Caller,
        system: &str,
        user: String,
        mut allow: impl FnMut(&str) -> std::result::Result<(), String>,
        mut after: impl FnMut(&str, &Result<Value>),
    ) -> Result<()> {
        let tools = tools_for(caller);
        let mut messages = vec![
            json!({"role": "system", "content": system}),
            json!({"role": "user", "content": user}),
        ];
        for _ in 0..MAX_TURNS {
            let resp = self.chat(&messages, &tools)?;
            let msg = resp.pointer("/choices/0/message").cloned().ok_or_else(|| {
                Error::internal(format!(
                    "LLM endpoint {}: the answer has no choices[0].message",
                    self.url
                ))
            })?;
            let calls = msg
                .get("tool_calls")
                .and_then(|c| c.as_array())
                .cloned()
                .unwrap_or_default();
            messages.push(msg);
            if calls.is_empty() {
                return Ok(());
            }
            for c in calls {
                let id = c
                    .get("id")
                    .and_then(|v| v.as_str())
                    .unwrap_or("")
                    .to_string();
                let name = c
                    .pointer("/function/name")
                    .and_then(|v| v.as_str())
                    .unwrap_or("")
                    .to_string();
                let args_text = c
                    .pointer("/function/arguments")
                    .and_then(|v| v.as_str())
                    .unwrap_or("{}");
                let content = match serde_json::from_str::<Value>(args_text) {
                    Err(e) => {
                        json!({"error": "invalid", "message": format!("arguments are not JSON: {e}")})
                    }
                    Ok(args) => match allow(&name) {
                        Err(m) => json!({"error": "budget", "message": m}),
                        Ok(()) => {
                            let r = study.call(caller, &name, args);
                            after(&name, &r);
                            match r {
                                Ok(v) => v,
                                Err(e) => json!({"error": e.kind, "message": e.message}),
                            }
                        }
                    },
                };
                // Results carry text other agents wrote (titles, hypotheses, findings, reviews):
                // the whole result is fenced as data from the record.
                messages.push(json!({
                    "role": "tool",
                    "tool_call_id": id,
                    "content": crate::util::text::fence(&format!("rsim {name} result"), &content.to_string()),
                }));
            }
        }
        Err(Error::internal(format!(
            "the LLM agent used its {MAX_TURNS} turns without finishing"
        )))
    }
}

/// The tools a caller's role may use, in the chat-completions `tools` format, with the same
/// input schemas the MCP face serves.
pub fn tools_for(caller: &Caller) -> Vec<Value> {
    ACTIONS
        .iter()
        .filter(|a| a.allows(caller.role))
        .map(|a| {
            let mut params = (a.input)().to_value();
            if let Some(o) = params.as_object_mut() {
                o.remove("$schema");
            }
            json!({
                "type": "function",
                "function": {"name": a.name, "description": a.description, "parameters": params},
            })
        })
        .collect()
}

impl WorkerAgent for LlmAgent {
    fn name(&self) -> &str {
        "llm"
    }

    fn work(&self, study: &Study, t: &WorkerTask) -> Result<()> {
        let node = study.get_node(
            &t.caller,
            crate::api::types::GetNodeRequest::new(t.node.clone()),
        )?;
        let runs = t.opts.seeds_per_node;
        let user = t.brief(&node);
        let budget = t.budget.clone();
        let mut started = 0u32;
        let result = self.converse(
            study,
            &t.caller,
            WORKER_PROMPT,
            user,
            |name| {
                if name == "run_sft" {
                    if started >= runs {
                        return Err(format!(
                            "this task allows {runs} training run(s); conclude now"
                        ));
                    }
                    if !budget.claim() {
                        return Err(
                            "the campaign's experiment budget is spent; conclude now".into()
                        );
                    }
                    started += 1;
                }
                Ok(())
            },
            |name, r| {
                if name == "run_sft" && r.as_ref().is_err_and(|e| e.kind != ErrorKind::Internal) {
                    t.budget.release();
                }
            },
        );
        t.close_if_open(study, &result, "LLM worker")?;
        result
    }
}

impl ReviewerAgent for LlmAgent {
    fn name(&self) -> &str {
        "llm"
    }

    fn review(&self, study: &Study, t: &ReviewTask) -> Result<()> {
        let user = t.brief();
        let mut reviewed = false;
        let mut last_error = String::new();
        self.converse(
            study,
            &t.caller,
            REVIEWER_PROMPT,
            user,
            |name| {
                // Directions are branched by the orchestrator from the review's proposals.
                if name == "branch" {
                    return Err(
                        "propose directions in your review; the orchestrator branches them".into(),
                    );
                }
                Ok(())
            },
            |name, r| {
                reviewed |= name == "review" && r.is_ok();
                if let Err(e) = r {
                    last_error = format!("{name}: {}", e.message);
                }
            },
        )?;
        if !reviewed {
            return Err(Error::invalid(format!(
                "the LLM reviewer finished without writing a review{}",
                if last_error.is_empty() {
                    String::new()
                } else {
                    format!(" (last tool error: {last_error})")
                }
            )));
        }
        Ok(())
    }
}
