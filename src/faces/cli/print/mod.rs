//! What a person reads: the human output of every command (tables, listings), apart from the
//! routing and the calls. JSON output is `json`, the same for every command.

pub mod actions;
pub mod dag;
pub mod reports;

use comfy_table::{Table, presets::UTF8_FULL_CONDENSED};
use serde_json::Value;

use crate::util::error::Result;

/// A JSON answer as the command prints it with --json.
pub fn json(v: &Value) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

/// A field as a person reads it in a table or a listing (agent text made safe to display).
pub fn s(v: &Value) -> String {
    match v {
        Value::String(s) => crate::util::text::display(s),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// The first 12 characters of a hash.
pub fn short(v: &Value) -> String {
    s(v).chars().take(12).collect()
}

pub fn table(header: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_style(UTF8_FULL_CONDENSED);
    t.set_header(header.to_vec());
    t
}
