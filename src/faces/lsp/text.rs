//! Text positions and node references: LSP positions (UTF-16 code units) to byte offsets and
//! back, node ids (`n12`) under the cursor, the `rsim://node/<id>` documents' URIs.

pub use crate::model::is_node_id;
use tower_lsp_server::ls_types::{Position, Range};

/// The byte offset of an LSP position (UTF-16 columns); clamped to the line's end and the text's.
pub fn offset_of(text: &str, pos: Position) -> usize {
    let mut line_start = 0;
    for _ in 0..pos.line {
        match text[line_start..].find('\n') {
            Some(i) => line_start += i + 1,
            None => return text.len(),
        }
    }
    let line_end = text[line_start..]
        .find('\n')
        .map_or(text.len(), |i| line_start + i);
    let mut units = 0u32;
    for (i, c) in text[line_start..line_end].char_indices() {
        if units >= pos.character {
            return line_start + i;
        }
        units += c.len_utf16() as u32;
    }
    line_end
}

/// The LSP position of a byte offset (clamped to the text, and back to a character boundary).
pub fn position_of(text: &str, offset: usize) -> Position {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &text[..offset];
    let line = before.matches('\n').count() as u32;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let character = before[line_start..].encode_utf16().count() as u32;
    Position { line, character }
}

pub fn range_of(text: &str, span: std::ops::Range<usize>) -> Range {
    Range {
        start: position_of(text, span.start),
        end: position_of(text, span.end.max(span.start)),
    }
}

/// A node id at `offset` (`n` then 1 to 9 digits, not inside a longer word): its text and span.
pub fn node_id_at(text: &str, offset: usize) -> Option<(String, std::ops::Range<usize>)> {
    let bytes = text.as_bytes();
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let offset = offset.min(bytes.len());
    let mut start = offset;
    while start > 0 && word(bytes[start - 1]) {
        start -= 1;
    }
    let mut end = offset;
    while end < bytes.len() && word(bytes[end]) {
        end += 1;
    }
    let w = &text[start..end];
    is_node_id(w).then(|| (w.to_string(), start..end))
}

/// The URI of a node's read-only document.
pub fn node_uri(id: &str) -> String {
    format!("rsim://node/{id}")
}

/// The node a `rsim://node/<id>` URI names; anything else (other schemes, paths, `..`, queries,
/// fragments, encoded characters) is not a node document.
pub fn node_of_uri(uri: &str) -> Option<&str> {
    let id = uri.strip_prefix("rsim://node/")?;
    is_node_id(id).then_some(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_count_utf16_units_and_round_trip() {
        let t = "a = 1\né😀 = \"x\"\nlast";
        let p = Position {
            line: 1,
            character: 3,
        };
        let off = offset_of(t, p);
        assert_eq!(&t[off..off + 1], " ");
        assert_eq!(position_of(t, off), p);
        // Past the end of a line or the text: clamped.
        assert_eq!(
            offset_of(
                t,
                Position {
                    line: 0,
                    character: 99
                }
            ),
            5
        );
        assert_eq!(
            offset_of(
                t,
                Position {
                    line: 9,
                    character: 0
                }
            ),
            t.len()
        );
        // Inside a multi-byte character: the character's start.
        assert_eq!(position_of(t, 9).character, 1);
    }

    #[test]
    fn node_ids_are_whole_words_and_node_uris_admit_nothing_else() {
        let t = "see n12, not xn3 or n04 or n1a; (n0)";
        assert_eq!(node_id_at(t, 5).map(|x| x.0), Some("n12".into()));
        assert_eq!(node_id_at(t, 14), None);
        assert_eq!(node_id_at(t, 21), None);
        assert_eq!(node_id_at(t, 28), None);
        assert_eq!(node_id_at(t, 34).map(|x| x.0), Some("n0".into()));
        assert_eq!(node_of_uri("rsim://node/n12"), Some("n12"));
        for bad in [
            "rsim://node/../..",
            "rsim://node/n1/../../etc",
            "rsim://node/n1?x",
            "rsim://node/%6e1",
            "file:///etc/passwd",
            "rsim://node/n1234567890",
            "rsim://node/",
        ] {
            assert_eq!(node_of_uri(bad), None, "{bad}");
        }
    }
}
