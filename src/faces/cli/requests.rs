//! The JSON request of each command that is one action or query: the same request an MCP client
//! sends, so the OS validates both alike.

use serde_json::{Value, json};

use super::Command;

/// The action (or query) a command runs and its request; None for a command that is not one.
pub fn action(cmd: &Command) -> Option<(&'static str, Value)> {
    Some(match cmd {
        Command::Branch {
            parents,
            title,
            hypothesis,
        } => (
            "branch",
            json!({ "parents": parents, "title": title, "hypothesis": hypothesis }),
        ),
        Command::RunSft {
            node,
            base,
            datasets,
            learning_rate,
            steps,
            batch_size,
            warmup_steps,
            schedule,
            seed,
            eval_every,
            eval_task,
        } => {
            let mut req = json!({
                "node": node, "base": base, "datasets": datasets, "learning_rate": learning_rate,
                "steps": steps, "batch_size": batch_size, "warmup_steps": warmup_steps,
                "schedule": schedule, "seed": seed,
            });
            if *eval_every > 0 {
                req["eval_every"] = json!(eval_every);
            }
            if let Some(t) = eval_task {
                req["eval_task"] = json!(t);
            }
            ("run_sft", req)
        }
        Command::Evaluate {
            node,
            checkpoint,
            task,
            split,
        } => (
            "evaluate",
            json!({ "node": node, "checkpoint": checkpoint, "task": task, "split": split }),
        ),
        Command::Compare {
            node,
            nodes,
            task,
            split,
            metric,
        } => (
            "compare",
            json!({ "node": node, "nodes": nodes, "task": task, "split": split, "metric": metric }),
        ),
        Command::Log {
            node,
            limit,
            max_tokens,
            cursor,
        } => {
            let mut req = json!({ "limit": limit });
            if let Some(n) = node {
                req["node"] = json!(n);
            }
            if let Some(m) = max_tokens {
                req["max_tokens"] = json!(m);
            }
            if let Some(c) = cursor {
                req["cursor"] = json!(c);
            }
            ("log", req)
        }
        Command::Show { node } => ("get_node", json!({ "node": node })),
        Command::Diff { a, b } => ("diff", json!({ "a": a, "b": b })),
        _ => return None,
    })
}

/// The `dag` query's request of `rsim dag` (its format is the face's affair); None for another
/// command.
pub fn dag(cmd: &Command) -> Option<Value> {
    let Command::Dag {
        format: _,
        view,
        node,
        task,
        metric,
        checkpoint,
        max_tokens,
        cursor,
    } = cmd
    else {
        return None;
    };
    let mut req = json!({ "view": view });
    for (k, v) in [
        ("node", node),
        ("task", task),
        ("metric", metric),
        ("checkpoint", checkpoint),
        ("cursor", cursor),
    ] {
        if let Some(v) = v {
            req[k] = json!(v);
        }
    }
    if let Some(m) = max_tokens {
        req["max_tokens"] = json!(m);
    }
    Some(req)
}
