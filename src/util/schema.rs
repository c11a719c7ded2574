//! JSON Schemas as hosts can use them. Every schema rsim publishes or validates with is made here:
//!
//! - schemars marks Rust integer and float types with `format` values (`uint64`, `int32`,
//!   `double`, …) that are not JSON Schema formats; hosts' validators warn about each one (Claude
//!   Code printed ~38 lines per connection). They are removed; an unsigned type keeps its meaning
//!   as `minimum: 0`.
//! - Some hosts (Codex) strip `pattern`, bounds, `default` and `format` before their model sees a
//!   schema, so the model never learns what a node id or a job id looks like. Every schema with a
//!   constraint says it in its `description` too ("Form: …").
//! - A schema of any value (`true`, from `serde_json::Value`) is written `{}`: hosts that map tool
//!   schemas onto a dialect of objects refuse a bare `true` (the MCP Inspector's `--strict`).

use schemars::{JsonSchema, Schema};
use serde_json::{Map, Value};

/// The schema of `T`, portable and self-describing (see the module).
pub fn schema_of<T: JsonSchema>() -> Schema {
    let mut bools = schemars::transform::ReplaceBoolSchemas::default();
    bools.skip_additional_properties = true;
    schemars::generate::SchemaSettings::draft2020_12()
        .with_transform(bools)
        .with_transform(schemars::transform::RecursiveTransform(portable))
        .into_generator()
        .into_root_schema_for::<T>()
}

/// Formats that are schemars' type annotations, not JSON Schema formats.
fn is_type_format(f: &str) -> bool {
    f == "double" || f == "float" || f.starts_with("uint") || f.starts_with("int")
}

fn portable(schema: &mut Schema) {
    let Some(obj) = schema.as_object_mut() else {
        return;
    };
    if let Some(f) = obj
        .get("format")
        .and_then(Value::as_str)
        .map(str::to_string)
        && is_type_format(&f)
    {
        obj.remove("format");
        if f.starts_with("uint") && !obj.contains_key("minimum") {
            obj.insert("minimum".into(), Value::from(0));
        }
    }
    if let Some(form) = form(obj) {
        let text = match obj.get("description").and_then(Value::as_str) {
            Some(d) if d.contains("Form: ") => return,
            Some(d) => format!("{} Form: {form}.", d.trim_end()),
            None => format!("Form: {form}."),
        };
        obj.insert("description".into(), Value::from(text));
    }
}

/// The constraints of one schema in words (`None` when it has none worth saying; `minimum: 0`
/// alone, an unsigned count, is not).
fn form(obj: &Map<String, Value>) -> Option<String> {
    let mut parts = Vec::new();
    if let Some(p) = obj.get("pattern").and_then(Value::as_str) {
        // The free-text pattern (`util::text`'s refusal of deceptive characters) in words.
        if p.contains("\\u2066-\\u2069") {
            parts.push(if p.starts_with("^(?!.*\\.\\.)") {
                "text without control, bidirectional-override or line-separator characters, and without `..`".to_string()
            } else {
                "text without control, bidirectional-override or line-separator characters".to_string()
            });
        } else {
            parts.push(format!("matches the regular expression {p}"));
        }
    }
    let num = |k: &str| obj.get(k).filter(|v| v.is_number()).map(Value::to_string);
    match (num("minimum"), num("maximum")) {
        (Some(lo), Some(hi)) => parts.push(format!("from {lo} to {hi}")),
        (Some(lo), None) if lo != "0" => parts.push(format!("at least {lo}")),
        (None, Some(hi)) => parts.push(format!("at most {hi}")),
        _ => {}
    }
    if let Some(lo) = num("exclusiveMinimum") {
        parts.push(format!("greater than {lo}"));
    }
    if let Some(hi) = num("exclusiveMaximum") {
        parts.push(format!("less than {hi}"));
    }
    for (lo, hi, what) in [
        ("minLength", "maxLength", "characters"),
        ("minItems", "maxItems", "items"),
    ] {
        match (num(lo), num(hi)) {
            (Some(a), Some(b)) => parts.push(format!("{a} to {b} {what}")),
            (Some(a), None) if a != "0" => parts.push(format!("at least {a} {what}")),
            (None, Some(b)) => parts.push(format!("at most {b} {what}")),
            _ => {}
        }
    }
    if let Some(values) = obj.get("enum").and_then(Value::as_array)
        && values.len() > 1
    {
        let list: Vec<String> = values.iter().map(Value::to_string).collect();
        parts.push(format!("one of {}", list.join(", ")));
    }
    if let Some(d) = obj.get("default") {
        parts.push(format!("default {d}"));
    }
    (!parts.is_empty()).then(|| parts.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(schemars::JsonSchema)]
    #[allow(dead_code)]
    struct Sample {
        /// A node.
        #[schemars(regex(pattern = r"^n[0-9]{1,9}$"))]
        node: String,
        #[schemars(range(min = 1, max = 100))]
        steps: u32,
        count: u64,
        rate: f64,
    }

    #[test]
    fn type_formats_go_and_every_constraint_is_in_words() {
        let v = schema_of::<Sample>().to_value();
        let text = v.to_string();
        for f in ["uint32", "uint64", "double"] {
            assert!(!text.contains(f), "{f} in {text}");
        }
        let p = &v["properties"];
        assert_eq!(p["count"]["minimum"], 0);
        assert_eq!(
            p["node"]["description"],
            "A node. Form: matches the regular expression ^n[0-9]{1,9}$."
        );
        assert_eq!(p["steps"]["description"], "Form: from 1 to 100.");
        assert!(p["count"].get("description").is_none(), "{}", p["count"]);
    }
}
