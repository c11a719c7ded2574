//! Human output of actions and queries (`rsim branch`, `run-sft`, `evaluate`, `compare`, `log`,
//! `show`, `diff`) and of each reproduction.

use serde_json::Value;

use super::{s, short, table};
use crate::util::error::Result;

/// An action's or query's result for a person; JSON for one without a layout of its own.
pub fn human(action: &str, out: &Value) -> Result<()> {
    match action {
        "branch" => println!(
            "created {} (branch {}, commit {})",
            s(&out["node"]),
            s(&out["branch"]),
            &s(&out["commit"])[..12.min(s(&out["commit"]).len())]
        ),
        "run_sft" => {
            println!(
                "job {}: {} in {:.1} s",
                s(&out["job"]["id"]),
                s(&out["job"]["state"]),
                out["job"]["duration_s"].as_f64().unwrap_or(0.0)
            );
            if let Some(e) = out["job"]["error"].as_str() {
                println!("error: {e}");
            }
            if let Some(c) = out["checkpoint"].as_str() {
                println!("checkpoint {c}");
            }
            for (k, v) in out["train_metrics"].as_object().into_iter().flatten() {
                println!("  {k} = {v}");
            }
        }
        "evaluate" => {
            println!(
                "job {}: {} — {}/{} on {} items",
                s(&out["job"]["id"]),
                s(&out["job"]["state"]),
                s(&out["task"]),
                s(&out["split"]),
                out["n_items"]
            );
            if let Some(e) = out["job"]["error"].as_str() {
                println!("error: {e}");
            }
            for (k, v) in out["metrics"].as_object().into_iter().flatten() {
                println!("  {k} = {:.4}", v.as_f64().unwrap_or(f64::NAN));
            }
        }
        "diff" => diff(out),
        "compare" => {
            let mut t = table(&["node", "title", "n", "mean", "95% interval", "best"]);
            for r in out["rows"].as_array().into_iter().flatten() {
                let f = |v: &Value| {
                    v.as_f64()
                        .map(|x| format!("{x:.4}"))
                        .unwrap_or_else(|| "-".into())
                };
                let ci = r["ci95"]
                    .as_array()
                    .map(|a| format!("[{}, {}]", f(&a[0]), f(&a[1])))
                    .unwrap_or_else(|| "-".into());
                t.add_row(vec![
                    s(&r["node"]),
                    s(&r["title"]),
                    s(&r["n"]),
                    f(&r["mean"]),
                    ci,
                    f(&r["best"]),
                ]);
            }
            println!(
                "{} on {}/{}",
                s(&out["metric"]),
                s(&out["task"]),
                s(&out["split"])
            );
            println!("{t}");
        }
        "log" => {
            let mut t = table(&[
                "when", "node", "#", "action", "decision", "agent", "summary",
            ]);
            for a in out["actions"].as_array().into_iter().flatten() {
                let dec = decision_cell(a);
                t.add_row(vec![
                    s(&a["at"]),
                    s(&a["node"]),
                    s(&a["seq"]),
                    s(&a["action"]),
                    dec,
                    s(&a["agent"]),
                    s(&a["summary"]),
                ]);
            }
            println!("{t}");
            if let Some(c) = out["next_cursor"].as_str() {
                println!("next page: --cursor {c}");
            }
        }
        "get_node" => {
            println!("{}  {}", s(&out["id"]), s(&out["title"]));
            println!("branch:     {}", s(&out["branch"]));
            println!(
                "status:     {}{}",
                s(&out["status"]),
                out["outcome"]
                    .as_str()
                    .map(|o| format!(" ({o})"))
                    .unwrap_or_default()
            );
            println!(
                "parents:    {}",
                out["parents"]
                    .as_array()
                    .map(|a| a.iter().map(s).collect::<Vec<_>>().join(", "))
                    .unwrap_or_default()
            );
            println!(
                "children:   {}",
                out["children"]
                    .as_array()
                    .map(|a| a.iter().map(s).collect::<Vec<_>>().join(", "))
                    .unwrap_or_default()
            );
            println!(
                "created:    {} by {}",
                s(&out["created_at"]),
                s(&out["created_by"])
            );
            if !s(&out["hypothesis"]).is_empty() {
                println!("hypothesis: {}", s(&out["hypothesis"]));
            }
            let mut t = table(&["#", "action", "decision", "agent", "summary"]);
            for a in out["actions"].as_array().into_iter().flatten() {
                let dec = decision_cell(a);
                t.add_row(vec![
                    s(&a["seq"]),
                    s(&a["action"]),
                    dec,
                    s(&a["agent"]),
                    s(&a["summary"]),
                ]);
            }
            println!("{t}");
            let metrics = out["metrics"].as_array().cloned().unwrap_or_default();
            if !metrics.is_empty() {
                let mut t = table(&["task", "split", "metric", "value", "checkpoint"]);
                for m in metrics {
                    t.add_row(vec![
                        s(&m["task"]),
                        s(&m["split"]),
                        s(&m["name"]),
                        format!("{:.4}", m["value"].as_f64().unwrap_or(f64::NAN)),
                        s(&m["checkpoint"]).chars().take(12).collect(),
                    ]);
                }
                println!("{t}");
            }
            if let Some(n) = out["notes"].as_str() {
                println!("{}", crate::util::text::display(n));
            }
        }
        _ => super::json(out)?,
    }
    Ok(())
}

/// What differs between two nodes: parameters, datasets, environment, metrics with intervals.
fn diff(out: &Value) {
    let (a, b) = (s(&out["a"]), s(&out["b"]));
    let f = |v: &Value| {
        v.as_f64()
            .map(|x| format!("{x:.4}"))
            .unwrap_or_else(|| "-".into())
    };
    println!(
        "diff {a} → {b}: {} parameter(s) differ, {} equal",
        out["params"].as_array().map_or(0, Vec::len),
        out["params_same"]
    );
    let mut t = table(&["parameter", "where", &a, &b]);
    for p in out["params"].as_array().into_iter().flatten() {
        t.add_row(vec![s(&p["key"]), s(&p["side"]), s(&p["a"]), s(&p["b"])]);
    }
    println!("{t}");
    let mut t = table(&["dataset", "where", "rows", "sha256"]);
    for d in out["datasets"].as_array().into_iter().flatten() {
        let sha = s(&d["sha256"]);
        t.add_row(vec![
            s(&d["name"]),
            s(&d["side"]),
            s(&d["rows"]),
            sha[..12.min(sha.len())].to_string(),
        ]);
    }
    println!("{t}");
    println!(
        "environment: {} ({a}: {}; {b}: {})",
        if out["env_same"].as_bool() == Some(true) {
            "same"
        } else {
            "differs"
        },
        out["env_a"].as_array().map_or(0, Vec::len),
        out["env_b"].as_array().map_or(0, Vec::len)
    );
    let mut t = table(&[
        "task/split/metric",
        "n A",
        "n B",
        "mean A",
        "mean B",
        "B − A",
        "95% interval",
        "method",
    ]);
    for m in out["metrics"].as_array().into_iter().flatten() {
        let ci = m["ci95"]
            .as_array()
            .map(|c| format!("[{}, {}]", f(&c[0]), f(&c[1])))
            .unwrap_or_else(|| "-".into());
        t.add_row(vec![
            format!("{}/{}/{}", s(&m["task"]), s(&m["split"]), s(&m["metric"])),
            s(&m["n_a"]),
            s(&m["n_b"]),
            f(&m["mean_a"]),
            f(&m["mean_b"]),
            f(&m["difference"]),
            ci,
            s(&m["method"]),
        ]);
    }
    println!("{t}");
}

/// One reproduction: verdict, checkpoints, job, and each metric recorded against reproduced.
pub fn reproduced(node: &str, seq: u32, r: &Value) {
    println!(
        "{node} #{seq} {}: {} ({}; job {} in {:.1} s)",
        s(&r["action"]),
        s(&r["verdict"]),
        match r["checkpoint"].as_str() {
            Some(c) => format!(
                "recorded {}, reproduced {}",
                short(&r["recorded_checkpoint"]),
                &c[..12.min(c.len())]
            ),
            None if r["action"] == "evaluate" => format!(
                "checkpoint {} on {}/{}",
                short(&r["recorded_checkpoint"]),
                s(&r["task"]),
                s(&r["split"])
            ),
            None => format!("recorded {}, none made", short(&r["recorded_checkpoint"])),
        },
        s(&r["job"]["id"]),
        r["job"]["duration_s"].as_f64().unwrap_or(0.0)
    );
    let metrics = r["train_metrics"]
        .as_array()
        .into_iter()
        .chain(r["metrics"].as_array())
        .flatten();
    for m in metrics {
        println!(
            "  {} recorded {} reproduced {} difference {}",
            s(&m["name"]),
            m["recorded"],
            m["reproduced"],
            m["difference"]
        );
    }
}

/// An action's decision as a table shows it: "accepted", or "rejected (RULE)".
fn decision_cell(a: &Value) -> String {
    match a["rule"].as_str() {
        Some(r) => format!("rejected ({r})"),
        None => s(&a["decision"]),
    }
}
