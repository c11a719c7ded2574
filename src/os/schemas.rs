//! The files under `schemas/`: every action's input and output, `rsim.toml`, the record's files.
//! Written by `rsim schemas`; a test fails when the committed files are stale.

use schemars::{JsonSchema, Schema};

use crate::api::actions::ACTIONS;
use crate::model::{ActionRecord, NodeMeta};

fn schema<T: JsonSchema>() -> Schema {
    crate::util::schema::schema_of::<T>()
}

/// Every schema file under `schemas/`: (relative path, pretty JSON).
pub fn all_schema_files() -> Vec<(String, String)> {
    let mut out = Vec::new();
    let pretty = |s: Schema| serde_json::to_string_pretty(&s.to_value()).unwrap_or_default() + "\n";
    for a in ACTIONS {
        out.push((
            format!("actions/{}.input.json", a.name),
            pretty((a.input)()),
        ));
        out.push((
            format!("actions/{}.output.json", a.name),
            pretty((a.output)()),
        ));
    }
    out.push((
        "rsim.toml.json".to_string(),
        pretty(schema::<crate::config::StudyConfig>()),
    ));
    out.push((
        "action-record.json".to_string(),
        pretty(schema::<ActionRecord>()),
    ));
    out.push(("node.toml.json".to_string(), pretty(schema::<NodeMeta>())));
    // The job protocol: what job programs read (spec.json) and write (out/).
    for (rel, s) in crate::jobs::protocol::schema_files() {
        out.push((rel, pretty(s)));
    }
    out
}
