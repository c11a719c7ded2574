//! JSON Schemas: the validator that checks incoming JSON against an action's input schema before
//! serde sees it (errors name the field and the rule), and the files under `schemas/`. The
//! registry itself is `actions.rs`.

use std::sync::OnceLock;

use schemars::{JsonSchema, Schema};
use serde_json::Value;

use super::types::*;

pub use super::actions::{ACTIONS, ActionSpec, spec};
use crate::util::error::{Error, Result};

fn schema<T: JsonSchema>() -> Schema {
    crate::util::schema::schema_of::<T>()
}

/// The compiled input validator of `action`, built the first time that action is validated in
/// this process (a CLI process runs one action: it compiles one schema, not every action's).
fn validator(action: &str) -> Result<&'static jsonschema::Validator> {
    type Compiled = OnceLock<std::result::Result<jsonschema::Validator, String>>;
    static V: OnceLock<Vec<Compiled>> = OnceLock::new();
    let cells = V.get_or_init(|| ACTIONS.iter().map(|_| OnceLock::new()).collect());
    let i = ACTIONS
        .iter()
        .position(|a| a.name == action)
        .ok_or_else(|| {
            Error::invalid(format!(
                "unknown action {action:?}; actions are: {}",
                names()
            ))
        })?;
    let a = &ACTIONS[i];
    cells[i]
        .get_or_init(|| {
            jsonschema::validator_for(&(a.input)().to_value()).map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| {
            Error::internal(format!(
                "the input schema of {action} does not compile: {e}"
            ))
        })
}

/// Validate `args` against the input schema of `action`; the error names each field and the rule it broke.
#[tracing::instrument(level = "trace", name = "validate", skip_all)]
pub fn validate(action: &str, args: &Value) -> Result<()> {
    validate_with(action, validator(action)?, args)
}

/// Compile the JSON Schema of a request type that is not an action (e.g. a face's own tool).
pub fn validator_for<T: JsonSchema>() -> Result<jsonschema::Validator> {
    jsonschema::validator_for(&schema::<T>().to_value())
        .map_err(|e| Error::internal(format!("schema does not compile: {e}")))
}

/// Validate `args` of request `what` against a compiled schema, with the same readable errors as actions.
pub fn validate_with(what: &str, v: &jsonschema::Validator, args: &Value) -> Result<()> {
    let action = what;
    let mut problems: Vec<String> = Vec::new();
    for e in v.iter_errors(args) {
        let path = e.instance_path().to_string();
        let field = if path.is_empty() {
            "(request)".to_string()
        } else {
            path.trim_start_matches('/').replace('/', ".")
        };
        let msg = match e.kind() {
            jsonschema::error::ValidationErrorKind::Pattern { pattern } => {
                match describe_pattern(pattern) {
                    Some(d) => format!("{} is not {d}", short(e.instance())),
                    None => e.to_string(),
                }
            }
            // The value is quoted short: an agent's 8 MB string is not sent back to it whole.
            _ => e.masked_with(short(e.instance())).to_string(),
        };
        // An unexpected property's name is quoted by the validator whole, and a field path holds
        // the request's own keys: both are bounded and cleaned of control characters, so a 16 MB
        // key or an escape sequence is not sent back to the agent (or to a terminal).
        problems.push(format!(
            "{}: {}",
            crate::util::text::sanitize_line_within(&field, 200),
            crate::util::text::sanitize_line_within(&msg, 600)
        ));
        if problems.len() >= 8 {
            break;
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "invalid {action} request: {}",
            problems.join("; ")
        )))
    }
}

/// A value as an error quotes it: at most about 80 characters, and a large array or object only
/// by its size (nothing larger is serialised).
fn short(v: &Value) -> String {
    let s = match v {
        Value::String(t) if t.len() > 80 => {
            let mut cut = 80;
            while !t.is_char_boundary(cut) {
                cut -= 1;
            }
            let q = Value::String(t[..cut].to_string()).to_string();
            return format!("{}…\" ({} bytes)", &q[..q.len() - 1], t.len());
        }
        Value::Array(a) if a.len() > 16 => return format!("an array of {} items", a.len()),
        Value::Object(o) if o.len() > 16 => return format!("an object of {} keys", o.len()),
        _ => v.to_string(),
    };
    if s.len() > 80 {
        let mut cut = 80;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        format!("{}…", &s[..cut])
    } else {
        s
    }
}

pub fn names() -> String {
    ACTIONS
        .iter()
        .map(|a| a.name)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_oversized_value_is_quoted_short_in_the_error() {
        let big = "x".repeat(1 << 20);
        let args = serde_json::json!({"node": "n1", "findings": big, "outcome": "positive"});
        let e = validate("conclude", &args).expect_err("too long");
        assert!(e.message.len() < 600, "{} bytes", e.message.len());
        assert!(
            e.message.contains("findings") && e.message.contains("1048576 bytes"),
            "{}",
            e.message
        );
        let many: Vec<Value> = (0..100_000).map(|i| serde_json::json!(i)).collect();
        let args = serde_json::json!({"node": "n1", "findings": many, "outcome": "positive"});
        let e = validate("conclude", &args).expect_err("not a string");
        assert!(
            e.message.len() < 600 && e.message.contains("an array of 100000 items"),
            "{}",
            e.message
        );
    }
}
