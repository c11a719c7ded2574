//! `rsim dag` as a listing: the summary view's counts and best path, the nodes of any other
//! view as a table, a lineage's checkpoints, and where the next page starts.

use serde_json::Value;

use super::{s, table};

/// A `dag` answer (other than the full view's drawing) for a person.
pub fn listing(out: &Value) {
    if let Some(sm) = out.get("summary") {
        println!(
            "{} nodes, {} edges; frontier {} open node(s)",
            sm["nodes"], sm["edges"], sm["frontier"]
        );
        for (what, key) in [
            ("status", "by_status"),
            ("outcome", "by_outcome"),
            ("verdict", "by_verdict"),
        ] {
            let counts: Vec<String> = sm[key]
                .as_object()
                .into_iter()
                .flatten()
                .map(|(k, v)| format!("{k} {v}"))
                .collect();
            println!("by {what}: {}", counts.join(", "));
        }
        if let Some(b) = sm.get("best") {
            println!(
                "best: {} ({}) via {}",
                s(&b["id"]),
                b["value"],
                sm["best_path"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(s)
                    .collect::<Vec<_>>()
                    .join(" → ")
            );
        }
        println!("frontier:");
    }
    let mut t = table(&["node", "status", "title", "value / relation"]);
    for n in out["nodes"].as_array().into_iter().flatten() {
        let extra = n["value"]
            .as_f64()
            .map(|v| format!("{v:.4}"))
            .or_else(|| n["relation"].as_str().map(str::to_string))
            .map(|e| {
                if n["suspect"] == true {
                    format!("{e}, SUSPECT")
                } else {
                    e
                }
            })
            .or_else(|| (n["suspect"] == true).then(|| "SUSPECT".to_string()));
        t.add_row(vec![
            s(&n["id"]),
            s(&n["status"]),
            s(&n["title"]),
            extra.unwrap_or_default(),
        ]);
    }
    println!("{t}");
    for step in out["lineage"].as_array().into_iter().flatten() {
        println!(
            "{}  {}",
            s(&step["checkpoint"]),
            step["node"]
                .as_str()
                .map_or("base model".to_string(), |n| format!(
                    "run_sft on {n} #{}",
                    step["seq"]
                ))
        );
    }
    if let Some(c) = out["next_cursor"].as_str() {
        println!(
            "{} of {} node(s) shown; next page: --cursor {c}",
            out["nodes"].as_array().map_or(0, Vec::len),
            out["total"]
        );
    }
}
