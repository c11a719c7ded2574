//! `rsim.toml` in the editor: diagnostics from the core's own parser and checks
//! (`config::diagnose`), hover with each key's documentation and completion of keys and enum
//! values, both read from the config's JSON Schema (the one `rsim schemas` writes).

use serde_json::Value;
use tower_lsp_server::ls_types::{
    CompletionItem, CompletionItemKind, Diagnostic, DiagnosticSeverity, Documentation,
    MarkupContent, MarkupKind, Position,
};

use super::text::{offset_of, range_of};
use crate::config::{StudyConfig, diagnose};

/// The config's schema, resolved once.
pub struct Schema {
    root: Value,
}

impl Default for Schema {
    fn default() -> Schema {
        Schema {
            root: crate::util::schema::schema_of::<StudyConfig>().to_value(),
        }
    }
}

impl Schema {
    fn resolve<'a>(&'a self, mut s: &'a Value) -> &'a Value {
        for _ in 0..16 {
            match s.get("$ref").and_then(Value::as_str) {
                Some(r) => {
                    let name = r.rsplit('/').next().unwrap_or_default();
                    match self.root.get("$defs").and_then(|d| d.get(name)) {
                        Some(d) => s = d,
                        None => return s,
                    }
                }
                None => return s,
            }
        }
        s
    }

    /// The alternatives a schema stands for (`oneOf`/`anyOf` variants, or itself).
    fn variants<'a>(&'a self, s: &'a Value) -> Vec<&'a Value> {
        let s = self.resolve(s);
        let mut out = Vec::new();
        for k in ["oneOf", "anyOf", "allOf"] {
            for v in s.get(k).and_then(Value::as_array).into_iter().flatten() {
                out.extend(self.variants(v));
            }
        }
        if out.is_empty() || s.get("properties").is_some() {
            out.push(s);
        }
        out
    }

    /// The schema of a key path's value (map entries consume one segment: `tasks.<name>`).
    pub fn at(&self, path: &[String]) -> Option<&Value> {
        self.at_all(path).into_iter().next()
    }

    /// Every schema a key path's value may have (one per variant of a tagged table).
    fn at_all(&self, path: &[String]) -> Vec<&Value> {
        let mut here = vec![&self.root];
        for seg in path {
            let mut next = Vec::new();
            for s in here {
                for v in self.variants(s) {
                    if let Some(p) = v.get("properties").and_then(|p| p.get(seg.as_str())) {
                        next.push(p);
                    } else if let Some(items) = v.get("items")
                        && seg.parse::<usize>().is_ok()
                    {
                        next.push(items);
                    } else if let Some(ap) = v.get("additionalProperties").filter(|a| a.is_object())
                    {
                        next.push(ap);
                    }
                }
            }
            if next.is_empty() {
                return next;
            }
            here = next;
        }
        here
    }

    /// The keys a table at `path` takes, with their documentation.
    pub fn keys(&self, path: &[String]) -> Vec<(String, String)> {
        let Some(s) = self.at(path) else {
            return Vec::new();
        };
        let mut out: Vec<(String, String)> = Vec::new();
        for v in self.variants(s) {
            for (k, p) in v
                .get("properties")
                .and_then(Value::as_object)
                .into_iter()
                .flatten()
            {
                if !out.iter().any(|(o, _)| o == k) {
                    out.push((k.clone(), self.describe(p)));
                }
            }
        }
        out
    }

    /// The values an enum-like key takes (`enum`, `const` variants), as TOML literals.
    pub fn values(&self, path: &[String]) -> Vec<String> {
        let all = self.at_all(path);
        let mut out = Vec::new();
        let mut push = |v: &Value| {
            let lit = match v {
                Value::String(x) => format!("\"{x}\""),
                Value::Bool(b) => b.to_string(),
                Value::Number(n) => n.to_string(),
                _ => return,
            };
            if !out.contains(&lit) {
                out.push(lit);
            }
        };
        let mut stack = all;
        while let Some(v) = stack.pop() {
            let v = self.resolve(v);
            for e in v
                .get("enum")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                push(e);
            }
            if let Some(c) = v.get("const") {
                push(c);
            }
            if v.get("type").and_then(Value::as_str) == Some("boolean") {
                push(&Value::Bool(true));
                push(&Value::Bool(false));
            }
            for k in ["oneOf", "anyOf"] {
                stack.extend(v.get(k).and_then(Value::as_array).into_iter().flatten());
            }
        }
        out
    }

    /// Markdown documentation of a schema: description, type, default, allowed values.
    pub fn describe(&self, s: &Value) -> String {
        let r = self.resolve(s);
        let mut parts = Vec::new();
        let desc = s
            .get("description")
            .or_else(|| r.get("description"))
            .and_then(Value::as_str);
        if let Some(d) = desc {
            parts.push(d.to_string());
        }
        let ty = r
            .get("type")
            .map(|t| match t {
                Value::Array(a) => a
                    .iter()
                    .filter_map(Value::as_str)
                    .collect::<Vec<_>>()
                    .join(" or "),
                other => other.as_str().unwrap_or_default().to_string(),
            })
            .filter(|t| !t.is_empty());
        if let Some(t) = ty {
            parts.push(format!("Type: `{t}`"));
        }
        if let Some(d) = s.get("default") {
            let text = d.to_string();
            if text.len() <= 200 && !desc.is_some_and(|x| x.contains("default")) {
                parts.push(format!("Default: `{text}`"));
            }
        }
        parts.join("\n\n")
    }
}

/// The file `rsim.toml` (any folder): the documents this module serves.
pub fn is_config_uri(uri: &str) -> bool {
    uri.rsplit('/').next() == Some(crate::config::CONFIG_FILE)
}

/// The diagnostics of an `rsim.toml` text: the core's first problem, on its exact range.
pub fn diagnostics(text: &str) -> Vec<Diagnostic> {
    match diagnose(text) {
        None => Vec::new(),
        Some(p) => vec![Diagnostic {
            range: range_of(text, p.span),
            severity: Some(DiagnosticSeverity::ERROR),
            source: Some("rsim".into()),
            message: p.message,
            ..Diagnostic::default()
        }],
    }
}

/// The key path at a byte offset: the key under the cursor, or the key whose value it is in.
pub fn path_at(text: &str, offset: usize) -> Option<Vec<String>> {
    use toml::de::{DeTable, DeValue};
    fn walk(t: &DeTable<'_>, offset: usize, path: &mut Vec<String>) -> bool {
        for (k, v) in t.iter() {
            let ks = k.span();
            let key: &str = k.get_ref().as_ref();
            if ks.start <= offset && offset < ks.end.max(ks.start + 1) {
                path.push(key.to_string());
                return true;
            }
            let vs = v.span();
            let within = vs.start <= offset && offset < vs.end;
            match v.get_ref() {
                DeValue::Table(inner) => {
                    path.push(key.to_string());
                    if walk(inner, offset, path) {
                        return true;
                    }
                    path.pop();
                }
                DeValue::Array(items) if within => {
                    path.push(key.to_string());
                    for (i, item) in items.iter().enumerate() {
                        let is = item.span();
                        if is.start <= offset
                            && offset < is.end
                            && let DeValue::Table(inner) = item.get_ref()
                        {
                            path.push(i.to_string());
                            if walk(inner, offset, path) {
                                return true;
                            }
                            path.pop();
                        }
                    }
                    return true;
                }
                _ if within => {
                    path.push(key.to_string());
                    return true;
                }
                _ => {}
            }
        }
        false
    }
    let (root, _) = DeTable::parse_recoverable(text);
    let mut path = Vec::new();
    walk(root.get_ref(), offset, &mut path).then_some(path)
}

/// Hover text for the key at `pos`.
pub fn hover(schema: &Schema, text: &str, pos: Position) -> Option<(String, Vec<String>)> {
    let path = path_at(text, offset_of(text, pos))?;
    let s = schema.at(&path)?;
    let doc = schema.describe(s);
    Some((format!("**{}**\n\n{doc}", path.join(".")), path))
}

/// The table a line is in: the last `[header]` or `[[header]]` above it (dotted, unquoted).
fn table_above(text: &str, offset: usize) -> Vec<String> {
    let before = &text[..offset.min(text.len())];
    for line in before.lines().rev().skip(1) {
        let l = line.trim();
        if l.starts_with('[') {
            let inner = l.trim_start_matches('[');
            let inner = inner.split(']').next().unwrap_or_default();
            return inner
                .split('.')
                .map(|s| s.trim().trim_matches('"').to_string())
                .filter(|s| !s.is_empty())
                .collect();
        }
    }
    Vec::new()
}

/// Completion at `pos`: after `key =`, the key's enum values; elsewhere the keys of the table.
pub fn complete(schema: &Schema, text: &str, pos: Position) -> Vec<CompletionItem> {
    let offset = offset_of(text, pos);
    let line_start = text[..offset].rfind('\n').map_or(0, |i| i + 1);
    let line = &text[line_start..offset];
    let mut table = table_above(text, offset);
    if line.trim_start().starts_with('[') {
        // Completing a header: the top-level tables.
        return schema
            .keys(&[])
            .into_iter()
            .map(|(k, d)| item(k, d, CompletionItemKind::MODULE))
            .collect();
    }
    if let Some((key, _)) = line.split_once('=') {
        table.extend(key.trim().split('.').map(|s| s.trim().to_string()));
        return schema
            .values(&table)
            .into_iter()
            .map(|v| item(v, String::new(), CompletionItemKind::ENUM_MEMBER))
            .collect();
    }
    schema
        .keys(&table)
        .into_iter()
        .map(|(k, d)| item(k, d, CompletionItemKind::PROPERTY))
        .collect()
}

fn item(label: String, doc: String, kind: CompletionItemKind) -> CompletionItem {
    CompletionItem {
        label,
        kind: Some(kind),
        documentation: (!doc.is_empty()).then_some(Documentation::MarkupContent(MarkupContent {
            kind: MarkupKind::Markdown,
            value: doc,
        })),
        ..CompletionItem::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "[study]\nname = \"t\"\n[base_model]\nname = \"base\"\npath = \"models/base\"\n[tasks.add]\ndev = { path = \"eval/dev.jsonl\" }\ntest = { path = \"eval/test.jsonl\" }\n[jobs]\nsft = [\"true\"]\nevaluate = [\"true\"]\n[policy]\nsandbox = \"off\"\n";

    fn pos(text: &str, needle: &str) -> Position {
        let off = text.find(needle).expect("needle");
        super::super::text::position_of(text, off)
    }

    #[test]
    fn an_unknown_key_gets_one_error_on_exactly_that_key() {
        assert!(diagnostics(GOOD).is_empty());
        let bad = GOOD.replace("[jobs]\n", "[jobs]\nsfft = 1\n");
        let d = diagnostics(&bad);
        assert_eq!(d.len(), 1);
        let at = pos(&bad, "sfft");
        assert_eq!(d[0].range.start, at);
        assert_eq!(d[0].range.end.character, at.character + 4);
        assert!(
            d[0].message.contains("unknown field `sfft`"),
            "{}",
            d[0].message
        );
    }

    #[test]
    fn hover_documents_keys_in_tables_maps_and_inline_tables() {
        let s = Schema::default();
        let (h, path) = hover(&s, GOOD, pos(GOOD, "sandbox")).expect("hover");
        assert_eq!(path, ["policy", "sandbox"]);
        assert!(h.contains("**policy.sandbox**") && h.len() > 40, "{h}");
        let (_, path) = hover(&s, GOOD, pos(GOOD, "eval/dev")).expect("hover");
        assert_eq!(path, ["tasks", "add", "dev", "path"]);
        assert!(s.at(&path).is_some());
        assert_eq!(hover(&s, GOOD, pos(GOOD, "\n[jobs]")), None);
    }

    #[test]
    fn completion_offers_the_tables_keys_and_an_enums_values() {
        let s = Schema::default();
        let text = format!("{GOOD}\n");
        let end = super::super::text::position_of(&text, text.len());
        let keys: Vec<String> = complete(&s, &text, end)
            .into_iter()
            .map(|i| i.label)
            .collect();
        assert!(keys.contains(&"sandbox".to_string()), "{keys:?}");
        assert!(keys.contains(&"max_parents".to_string()), "{keys:?}");
        let text = format!("{GOOD}sandbox = ");
        let end = super::super::text::position_of(&text, text.len());
        let values: Vec<String> = complete(&s, &text, end)
            .into_iter()
            .map(|i| i.label)
            .collect();
        assert!(values.contains(&"\"required\"".to_string()), "{values:?}");
        let text = format!("{GOOD}[backend]\nkind = ");
        let end = super::super::text::position_of(&text, text.len());
        let values: Vec<String> = complete(&s, &text, end)
            .into_iter()
            .map(|i| i.label)
            .collect();
        assert!(values.contains(&"\"slurm\"".to_string()), "{values:?}");
    }
}
