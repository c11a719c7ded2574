//! The page itself: its HTML (served, sign-in, and the static snapshot), its embedded assets, and
//! the JSON a view reads (a node's panel, the overview), assembled from the OS's queries.

use std::collections::BTreeSet;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::faces::dagview::{self, LayoutOptions};
use crate::model::Caller;
use crate::os::Study;
use crate::util::error::Result;

/// The served page's policy: only its own script, style and connections.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// The DAG view the VS Code extension bundles too.
pub const DAG_JS: &str = include_str!("../../../editors/dag/dag.js");
pub const APP_JS: &str = include_str!("app.js");
pub const APP_CSS: &str = include_str!("app.css");

/// Nodes whose panels the static snapshot carries (the best path, the frontier, the best
/// scored; others show their summary from the DAG).
const STATIC_PANELS: usize = 300;

/// An embedded asset by name; nothing else is ever read (no path from the URL reaches a file).
pub fn asset(name: &str) -> Option<(&'static str, &'static str)> {
    match name {
        "dag.js" => Some(("text/javascript; charset=utf-8", DAG_JS)),
        "app.js" => Some(("text/javascript; charset=utf-8", APP_JS)),
        "app.css" => Some(("text/css; charset=utf-8", APP_CSS)),
        _ => None,
    }
}

/// Text for HTML (element content and quoted attributes): markup characters escaped, and
/// bidirectional controls shown as `?` so agent text cannot reorder what is shown around it.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            '\u{202a}'..='\u{202e}'
            | '\u{2066}'..='\u{2069}'
            | '\u{200e}'
            | '\u{200f}'
            | '\u{061c}' => out.push('?'),
            c => out.push(c),
        }
    }
    out
}

/// JSON to put inside `<script type="application/json">`: no `<` can close the element, and
/// the line separators JavaScript once treated as newlines are escaped too.
pub fn script_json(v: &Value) -> String {
    v.to_string()
        .replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026")
        .replace('\u{2028}', "\\u2028")
        .replace('\u{2029}', "\\u2029")
}

const BODY: &str = r#"<header class="top">
  <h1><span id="study">__STUDY__</span></h1>
  <span id="counts" class="muted"></span>
  <span id="live" class="live">connecting…</span>
  <span id="me" class="muted"></span>
  <form id="logout" method="post" action="/logout" hidden><button type="submit">sign out</button></form>
</header>
<div id="error" class="error" role="alert" hidden></div>
<main>
  <section class="dag-pane">
    <div class="toolbar">
      <button id="fit" type="button">fit</button>
      <span class="legend"><i class="k promising"></i>promising <i class="k needs_more_seeds"></i>needs more seeds <i class="k still_learning"></i>still learning <i class="k dead_end"></i>dead end <i class="k open"></i>open <i class="k concluded"></i>concluded <i class="k best"></i>best path <span class="muted">▪ +N collapsed (click to expand)</span></span>
    </div>
    <div id="dag" class="dag"></div>
  </section>
  <section id="panel" class="panel">
    <p class="muted">Click a node to see its hypothesis, recipe, actions, reviews, jobs and learning curves.</p>
  </section>
</main>
<section class="lower">
  <div class="card"><h2>Comparison <span class="muted">(dev, mean with 95% interval)</span></h2><div id="compare"><p class="muted">Add nodes with “compare” in their panel.</p></div></div>
  <div class="card"><h2>Learning curves</h2><div id="curves"><p class="muted">Training loss per logged step of the compared nodes' runs (several seeds: mean with a band).</p></div></div>
  <div class="card"><h2>Budget and lock-in over time</h2><div id="timeline"></div></div>
  <div class="card"><h2>Audit</h2><div id="audit"></div></div>
</section>"#;

/// The page `rsim serve` serves at `/`.
pub fn served_page(study: &str) -> String {
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>rsim · {t}</title><link rel=\"stylesheet\" href=\"/assets/app.css\"><script type=\"module\" src=\"/assets/app.js\"></script></head><body>{b}</body></html>\n",
        t = esc(study),
        b = BODY.replace("__STUDY__", &esc(study))
    )
}

/// The sign-in page (a server with tokens, before a browser has one).
pub fn sign_in(message: Option<&str>) -> String {
    let msg = message
        .map(|m| format!("<p class=\"error\" role=\"alert\">{}</p>", esc(m)))
        .unwrap_or_default();
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>rsim · sign in</title><link rel=\"stylesheet\" href=\"/assets/app.css\"></head><body class=\"signin\"><h1>rsim</h1>{msg}<form method=\"post\" action=\"/login\"><label>Token <input type=\"password\" name=\"token\" autocomplete=\"current-password\" required></label> <button type=\"submit\">sign in</button></form><p class=\"muted\">Use the token the study owner gave you (the server's --tokens file). It is kept in an HttpOnly cookie for this site only.</p></body></html>\n"
    )
}

fn sha256_b64(s: &str) -> String {
    base64(&Sha256::digest(s.as_bytes()))
}

fn base64(bytes: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for ch in bytes.chunks(3) {
        let b = [ch[0], *ch.get(1).unwrap_or(&0), *ch.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            if i <= ch.len() {
                out.push(char::from(T[((n >> shift) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The page's script with `dag.js` inlined (one module, for the static file).
fn inline_script() -> String {
    let dag = DAG_JS.replace("export function ", "function ");
    let app: String = APP_JS
        .lines()
        .filter(|l| !l.starts_with("import "))
        .collect::<Vec<_>>()
        .join("\n");
    format!("{dag}\n{app}\n")
}

/// The whole page as one self-contained file: the same markup, style and script inline (their
/// hashes in the Content-Security-Policy), the study's data embedded as JSON.
pub fn static_page(study: &Study) -> Result<String> {
    let name = study
        .root()
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "study".into());
    let overview = study.dag_overview(None)?;
    let layout = dagview::layout(&overview, &LayoutOptions::default());
    let caller = Caller::new("report", crate::model::Role::Observer);
    // Panels for the nodes a reader looks at first.
    let mut pick: BTreeSet<String> = layout.best_path.iter().cloned().collect();
    pick.extend(layout.frontier.iter().take(STATIC_PANELS / 3).cloned());
    let mut scored: Vec<&dagview::LaidNode> =
        layout.nodes.iter().filter(|n| n.score.is_some()).collect();
    scored.sort_by(|a, b| b.score.unwrap_or(0.0).total_cmp(&a.score.unwrap_or(0.0)));
    for n in scored {
        if pick.len() >= STATIC_PANELS {
            break;
        }
        pick.insert(n.id.clone());
    }
    if layout.nodes.len() <= STATIC_PANELS {
        pick.extend(layout.nodes.iter().map(|n| n.id.clone()));
    }
    let mut panels = serde_json::Map::new();
    for id in pick.iter().take(STATIC_PANELS) {
        panels.insert(id.clone(), node_panel(study, &caller, id)?);
    }
    // The comparison a snapshot shows: the best-scored nodes.
    let mut top: Vec<&dagview::LaidNode> =
        layout.nodes.iter().filter(|n| n.score.is_some()).collect();
    top.sort_by(|a, b| b.score.unwrap_or(0.0).total_cmp(&a.score.unwrap_or(0.0)));
    let top: Vec<String> = top.iter().take(6).map(|n| n.id.clone()).collect();
    let mut overview = overview_data(study)?;
    if !top.is_empty() {
        overview["compare"] = serde_json::to_value(study.compare_nodes(&top, None)?)?;
    }
    let data = json!({
        "study": name,
        "layout": layout,
        "overview": overview,
        "panels": panels,
    });
    let script = inline_script();
    let csp = format!(
        "default-src 'none'; script-src 'sha256-{}'; style-src 'sha256-{}'; img-src data:; base-uri 'none'; form-action 'none'",
        sha256_b64(&script),
        sha256_b64(APP_CSS)
    );
    Ok(format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><meta http-equiv=\"Content-Security-Policy\" content=\"{csp}\"><meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>rsim report · {t}</title><style>{css}</style></head><body>{b}<script type=\"application/json\" id=\"rsim-data\">{data}</script><script type=\"module\">{script}</script></body></html>\n",
        t = esc(&name),
        css = APP_CSS,
        b = BODY.replace("__STUDY__", &esc(&name)),
        data = script_json(&data),
    ))
}

/// A node's panel: the node (hypothesis, recipe lines, actions with commit ids, metrics,
/// notes), reviews of it with their verdicts and reasons, its jobs (recorded and running), its
/// loss curves and its dev values with their interval.
pub fn node_panel(study: &Study, caller: &Caller, id: &str) -> Result<Value> {
    let node = study.call(caller, "get_node", json!({ "node": id }))?;
    let reviews = study.reviews_of(id)?;
    let curves = study.loss_curves(id)?;
    let running = study.open_jobs(id);
    let stats = study
        .compare_nodes(&[id.to_string()], None)?
        .nodes
        .into_iter()
        .next();
    Ok(json!({
        "node": node,
        "reviews": reviews,
        "curves": curves,
        "running": running,
        "stats": stats,
    }))
}

/// Budget and lock-in over time, and the audit in counts.
pub fn overview_data(study: &Study) -> Result<Value> {
    let timeline = study.timeline()?;
    let a = crate::os::audit::audit(study)?;
    let checks: Vec<Value> = a
        .checks
        .iter()
        .map(|c| {
            json!({
                "name": c.name,
                "what": c.what,
                "checked": c.checked,
                "violations": c.violations.len(),
                "examples": c.violations.iter().take(5).collect::<Vec<_>>(),
                "counts": c.counts,
            })
        })
        .collect();
    Ok(json!({
        "timeline": timeline,
        "audit": {
            "attempts": a.attempts,
            "accepted": a.accepted,
            "rejected": a.rejected,
            "rejections_by_rule": a.rejections_by_rule,
            "got_through": a.got_through,
            "checks": checks,
        },
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_leaves_no_markup_and_no_bidi_override() {
        let hostile = "\"><img src=x onerror=alert(1)><script>alert(2)</script>\u{202e}gnp.exe javascript:alert(3) '";
        let e = esc(hostile);
        assert!(!e.contains('<') && !e.contains('>') && !e.contains('"') && !e.contains('\''));
        assert!(!e.contains('\u{202e}'));
        let j = script_json(&json!({ "t": "</script><script>alert(1)</script>\u{2028}" }));
        assert!(!j.contains("</script"));
        assert!(!j.contains('\u{2028}'));
        let back: Value = serde_json::from_str(&j).expect("still JSON");
        assert_eq!(back["t"], "</script><script>alert(1)</script>\u{2028}");
    }

    #[test]
    fn base64_matches_the_standard() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
    }

    #[test]
    fn only_embedded_assets_are_served() {
        assert!(asset("dag.js").is_some());
        for bad in ["../Cargo.toml", "dag.js/..", "", "app.js%00", "/etc/passwd"] {
            assert!(asset(bad).is_none(), "{bad}");
        }
        assert!(served_page("<b>").contains("&lt;b&gt;"));
        assert!(!served_page("x").contains("<script>"));
    }

    #[test]
    fn the_inline_script_has_no_imports_or_exports() {
        let s = inline_script();
        assert!(!s.lines().any(|l| l.starts_with("import ")));
        assert!(!s.contains("export function"));
        assert!(s.contains("function mountDag"));
    }
}
