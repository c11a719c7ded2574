//! Bounded answers: every query whose answer grows with the study (`list_nodes`, `log`, `dag`)
//! stops at a size bound in tokens — estimated as the answer's JSON bytes / 4, the usual rule of
//! thumb for English and JSON with BPE tokenizers — and hands back a cursor for the next page.
//!
//! A cursor is `c1.<query>.<fingerprint>.<position>`: the fingerprint is the first 8 hex digits
//! of the sha256 of the query's other fields, so a cursor passed to another query (or to the same
//! query with another filter) is refused instead of silently paging something else. The position
//! is either a count of items already given (`list_nodes`, `dag`: their order only grows at the
//! end) or, for `log` (newest first, so new actions arrive at the front), `k` and the hex of the
//! last item's sort key: the next page starts strictly after that item, whatever was recorded
//! between the pages.

use serde::Serialize;
use serde_json::Value;

use crate::api::types::DEFAULT_MAX_TOKENS;
use crate::util::error::{Error, Result};
use crate::util::hash::sha256_hex;

/// Estimated tokens of `bytes` bytes of JSON.
pub fn tokens_of(bytes: usize) -> u64 {
    (bytes as u64).div_ceil(4)
}

/// The `tokens` field of an answer whose JSON is `len_with_zero` bytes while that field is `0`:
/// the estimate counts its own digits.
pub fn tokens_field(len_with_zero: usize) -> u64 {
    let mut t = tokens_of(len_with_zero);
    for _ in 0..4 {
        let next = tokens_of(len_with_zero - 1 + t.to_string().len());
        if next == t {
            break;
        }
        t = next;
    }
    t
}

/// The fingerprint of a request: its fields but the paging ones.
fn fingerprint(request: &Value) -> String {
    let mut v = request.clone();
    if let Some(m) = v.as_object_mut() {
        for k in ["cursor", "max_tokens", "offset"] {
            m.remove(k);
        }
    }
    sha256_hex(v.to_string().as_bytes())[..8].to_string()
}

/// Where this page starts: the cursor's position (checked to belong to this query), else
/// `offset`.
pub fn start(query: &str, request: &Value, cursor: Option<&str>, offset: u64) -> Result<u64> {
    let Some(c) = cursor else {
        // A position a cursor could hold (ten digits): past it no study has items, and the
        // answer's next position (start + items) must not overflow.
        if offset > MAX_POSITION {
            return Err(Error::invalid(format!(
                "offset: {offset} is past the largest position ({MAX_POSITION})"
            )));
        }
        return Ok(offset);
    };
    let parts: Vec<&str> = c.split('.').collect();
    let [_, q, fp, pos] = parts[..] else {
        return Err(Error::invalid(format!("cursor: {c:?} is not a cursor")));
    };
    if q != query {
        return Err(Error::invalid(format!(
            "cursor: this cursor pages a {q} answer, not {query}; pass it back to the query that returned it"
        )));
    }
    if fp != fingerprint(request) {
        return Err(Error::invalid(
            "cursor: this cursor belongs to another query (its filters differ); page with the same fields as the answer that returned it",
        ));
    }
    pos.parse()
        .map_err(|_| Error::invalid(format!("cursor: {c:?} is not a cursor")))
}

/// The largest position an offset or a cursor names (a cursor's position is at most ten digits).
pub const MAX_POSITION: u64 = 9_999_999_999;

/// Where a keyset-paged answer (`log`) starts: after the item whose sort key the cursor holds,
/// or at the top without a cursor.
pub fn start_after(query: &str, request: &Value, cursor: Option<&str>) -> Result<Option<Value>> {
    let Some(c) = cursor else {
        return Ok(None);
    };
    let bad = || Error::invalid(format!("cursor: {c:?} is not a cursor"));
    let parts: Vec<&str> = c.split('.').collect();
    let [_, q, fp, pos] = parts[..] else {
        return Err(bad());
    };
    if q != query {
        return Err(Error::invalid(format!(
            "cursor: this cursor pages a {q} answer, not {query}; pass it back to the query that returned it"
        )));
    }
    if fp != fingerprint(request) {
        return Err(Error::invalid(
            "cursor: this cursor belongs to another query (its filters differ); page with the same fields as the answer that returned it",
        ));
    }
    let key = pos.strip_prefix('k').ok_or_else(bad)?;
    let bytes = hex::decode(key).map_err(|_| bad())?;
    serde_json::from_slice(&bytes).map(Some).map_err(|_| bad())
}

/// A cursor that starts the next page after the item with this sort key.
pub fn key_cursor(query: &str, request: &Value, key: &Value) -> String {
    format!(
        "c1.{query}.{}.k{}",
        fingerprint(request),
        hex::encode(key.to_string())
    )
}

pub fn cursor(query: &str, request: &Value, position: u64) -> String {
    format!("c1.{query}.{}.{position}", fingerprint(request))
}

/// How many of `items` fit in the bound, given the size of the answer without them
/// (`overhead` bytes); at least one, so every page advances.
pub fn fit<T: Serialize>(items: &[T], max_tokens: Option<u64>, overhead: usize) -> Result<usize> {
    let budget = max_tokens.unwrap_or(DEFAULT_MAX_TOKENS) as usize * 4;
    let mut used = overhead;
    for (i, it) in items.iter().enumerate() {
        used += serde_json::to_vec(it)?.len() + 1;
        if used > budget && i > 0 {
            return Ok(i);
        }
    }
    Ok(items.len())
}

/// Room kept for the fields a page adds after it is measured (`next_cursor`, `tokens`, `total`).
pub const PAGE_FIELDS: usize = 96;

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn cursors_belong_to_their_query() {
        let req = json!({"status": "open", "limit": 100, "max_tokens": 500});
        let c = cursor("list_nodes", &req, 40);
        // The bound may change between pages; the filters may not.
        let same = json!({"status": "open", "limit": 100, "cursor": c});
        assert_eq!(start("list_nodes", &same, Some(&c), 0).expect("start"), 40);
        let e = start("log", &json!({"limit": 100}), Some(&c), 0).expect_err("other query");
        assert!(e.message.contains("not log"), "{}", e.message);
        let other = json!({"status": "concluded", "limit": 100});
        let e = start("list_nodes", &other, Some(&c), 0).expect_err("other filter");
        assert!(e.message.contains("another query"), "{}", e.message);
    }

    #[test]
    fn key_cursors_carry_the_last_item_and_belong_to_their_query() {
        let req = json!({"node": "n3", "limit": 100});
        let key = json!(["2026-12-01T11:56:38.812Z", "n3", 7]);
        let c = key_cursor("log", &req, &key);
        assert_eq!(
            start_after("log", &req, Some(&c)).expect("start"),
            Some(key)
        );
        assert_eq!(start_after("log", &req, None).expect("start"), None);
        let e = start_after("log", &json!({"node": "n4", "limit": 100}), Some(&c))
            .expect_err("other filter");
        assert!(e.message.contains("another query"), "{}", e.message);
        let positional = cursor("log", &req, 40);
        assert!(start_after("log", &req, Some(&positional)).is_err());
        let garbage = format!("{}.kzz", c.rsplit_once('.').expect("dots").0);
        let e = start_after("log", &req, Some(&garbage)).expect_err("garbage");
        assert!(e.message.contains("not a cursor"), "{}", e.message);
    }

    #[test]
    fn a_page_stops_before_the_bound_and_always_advances() {
        let items: Vec<String> = (0..100).map(|i| format!("{i:0>38}")).collect(); // 40 bytes each
        assert_eq!(fit(&items, Some(200), 0).expect("fit"), 19); // 800 bytes / 41
        assert_eq!(fit(&items, Some(200), 10_000).expect("fit"), 1);
        assert_eq!(fit(&items[..3], None, 0).expect("fit"), 3);
    }
}
