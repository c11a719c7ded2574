//! The canonical scan text: what the contamination gate compares, one function for every row and
//! every protected item. It starts from `model::data::training_text` — the very text the trainers
//! learn (prompt immediately followed by answer) — and folds every surface difference that does
//! not change what a model learns from it:
//!
//! 1. Unicode NFKC (full-width and mathematical letters, digits and operators, superscripts,
//!    ligatures, compatibility forms → their plain form);
//! 2. invisible characters removed: format characters (general category Cf: zero-width space and
//!    joiners, word joiner, soft hyphen, bidi controls, BOM, tags), combining marks (Mn, Me:
//!    variation selectors, combining grapheme joiner, diacritics added to digits), other default
//!    ignorables (Hangul fillers) and control characters that are not whitespace;
//! 3. decimal digits of every script (Nd: Arabic-Indic, Devanagari, Thai, …) → ASCII digits;
//! 4. look-alike operators (minus sign, dashes, ×, ÷, ∗, heavy plus …) → `+ - * / =`, and Cyrillic
//!    and Greek letters that look like Latin ones → the Latin letter;
//! 5. case folded (lowercase); whitespace folded to one space between word characters and none
//!    next to punctuation or operators (`12 + 34` → `12+34`).
//!
//! Rows are also read with digit-group separators removed (`join_digit_groups`: `1 2+3_4` →
//! `12+34`) and with letters read apart from digits (`split_letters_from_digits`: `r467` →
//! `r 467`), and scanned in every reading.
//!
//! The map is many-to-one on purpose: the gate must not be told apart from the trainer by a
//! character a reader (or a tokenizer) does not see, and a protected item goes through the same
//! function, so verbatim copies still match exactly.

use unicode_general_category::{GeneralCategory, get_general_category};
use unicode_normalization::UnicodeNormalization;

use crate::model::data::{Row, training_text};

/// The canonical scan text of a row: `canonical(training_text(row))`.
pub fn row_text(row: &Row) -> String {
    canonical(&training_text(row))
}

/// Tokens of a canonical text: word and number runs, and the operators that carry meaning in
/// arithmetic and code (`+ - * / = < > %`); other punctuation and whitespace only separate.
pub fn tokens(canonical_text: &str) -> Vec<String> {
    tokens_with(canonical_text, Marks::None)
}

/// Which marks `tokens_with` keeps beyond the operators: none (the n-grams' tokens), or the
/// forms' (`form_tokens`).
#[derive(Clone, Copy)]
enum Marks {
    None,
    Form { counts: bool },
}

/// The tokens a task's normal form reads: `tokens`, and the marks only a form reads (`is_form_only`):
/// brackets, which decide what a sign applies to (`46 - (0 - 12)` is `46 + 12`), `^` (a power),
/// a decimal point between two digits (`12.0` is `12`), and with `counts` `:` (a digit's count,
/// `0:1`, which only the digits form reads: a study without it never pays for the token). The
/// n-gram scans never see them, so a bracket or a `.0` inserted into a copy cannot break one of
/// its n-grams.
pub fn form_tokens(canonical_text: &str, counts: bool) -> Vec<String> {
    tokens_with(canonical_text, Marks::Form { counts })
}

/// Whether a form token is one only the normal forms read (see `form_tokens`).
pub fn is_form_only(t: &str) -> bool {
    matches!(t, "(" | ")" | "^" | "." | ":")
}

fn tokens_with(canonical_text: &str, marks: Marks) -> Vec<String> {
    let (form, counts) = match marks {
        Marks::None => (false, false),
        Marks::Form { counts } => (true, counts),
    };
    let mut out = Vec::new();
    let mut cur = String::new();
    for (i, c) in canonical_text.char_indices() {
        if c.is_alphanumeric() || c == '_' {
            cur.push(c);
        } else {
            // a decimal point: a digit either side (`.` is one byte)
            let point = c == '.'
                && cur.ends_with(|d: char| d.is_ascii_digit())
                && canonical_text[i + 1..].starts_with(|d: char| d.is_ascii_digit());
            if !cur.is_empty() {
                out.push(std::mem::take(&mut cur));
            }
            if matches!(c, '+' | '-' | '*' | '/' | '=' | '<' | '>' | '%')
                || (form && (matches!(c, '(' | ')' | '^') || point))
                || (counts && c == ':')
            {
                out.push(c.to_string());
            }
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// The canonical form of any text (see the module's list).
pub fn canonical(text: &str) -> String {
    let mut folded = String::with_capacity(text.len());
    if text.is_ascii() {
        // ASCII is its own NFKC, has no format characters, marks, other digits or look-alikes.
        for c in text.chars() {
            if c.is_ascii_whitespace() {
                folded.push(' ');
            } else if !c.is_ascii_control() {
                folded.push(c.to_ascii_lowercase());
            }
        }
        return fold_spaces(&folded);
    }
    for c in text.nfkc() {
        if c.is_whitespace() {
            folded.push(' ');
            continue;
        }
        if invisible(c) {
            continue;
        }
        if let Some(d) = decimal_digit(c) {
            folded.push(d);
            continue;
        }
        for l in c.to_lowercase() {
            folded.push(look_alike(l));
        }
    }
    fold_spaces(&folded)
}

/// Characters a reader does not see: format, combining, other default-ignorable and control
/// characters (whitespace was handled before).
fn invisible(c: char) -> bool {
    use GeneralCategory as G;
    matches!(
        get_general_category(c),
        G::Format | G::NonspacingMark | G::EnclosingMark | G::Control | G::Unassigned
    ) || matches!(
        c,
        '\u{115F}' | '\u{1160}' | '\u{3164}' | '\u{FFA0}' | '\u{180E}' | '\u{2800}'
    )
}

/// The ASCII digit of a decimal digit of any script, or of a CJK numeral from zero to nine. Unicode allocates every script's decimal
/// digits as one contiguous run from zero to nine, so a digit's value is its distance from the
/// start of its run (mod 10, for runs of several digit sets back to back).
fn decimal_digit(c: char) -> Option<char> {
    if c.is_ascii_digit() {
        return Some(c);
    }
    // The CJK numerals written as digits (`四六七二九七`), which are letters to Unicode.
    if let Some(d) = "〇一二三四五六七八九".chars().position(|x| x == c) {
        return char::from_digit(d as u32, 10);
    }
    if get_general_category(c) != GeneralCategory::DecimalNumber {
        return None;
    }
    let mut start = c as u32;
    while let Some(prev) = start.checked_sub(1).and_then(char::from_u32) {
        if get_general_category(prev) != GeneralCategory::DecimalNumber {
            break;
        }
        start -= 1;
    }
    char::from_digit((c as u32 - start) % 10, 10)
}

/// Operators and letters that look like (or mean) an ASCII one. Applied after lowercasing.
fn look_alike(c: char) -> char {
    match c {
        // minus and dashes
        '\u{2212}' | '\u{2010}' | '\u{2011}' | '\u{2012}' | '\u{2013}' | '\u{2014}'
        | '\u{2015}' | '\u{2043}' | '\u{FE63}' | '\u{FF0D}' | '\u{2796}' | '\u{02D7}'
        | '\u{2CBB}' => '-',
        // plus
        '\u{2795}' | '\u{FF0B}' | '\u{FE62}' | '\u{02D6}' | '\u{2214}' | '\u{16ED}' => '+',
        // times
        '\u{00D7}' | '\u{2715}' | '\u{2716}' | '\u{2A2F}' | '\u{2217}' | '\u{22C5}'
        | '\u{00B7}' | '\u{2219}' | '\u{2062}' => '*',
        // division
        '\u{00F7}' | '\u{2215}' | '\u{2044}' | '\u{2797}' | '\u{29F8}' => '/',
        // colon (ratio, modifier letter and triangular colons, Armenian full stop)
        '\u{2236}' | '\u{A789}' | '\u{02D0}' | '\u{0589}' | '\u{05C3}' => ':',
        // equals
        '\u{2550}' | '\u{A78A}' | '\u{2261}' | '\u{2263}' | '\u{2248}' | '\u{30A0}' => '=',
        // Cyrillic look-alikes of Latin letters
        'а' => 'a',
        'в' => 'b',
        'с' => 'c',
        'ԁ' => 'd',
        'е' | 'ё' => 'e',
        'һ' => 'h',
        'і' | 'ї' => 'i',
        'ј' => 'j',
        'к' => 'k',
        'м' => 'm',
        'н' => 'h',
        'о' => 'o',
        'р' => 'p',
        'ԛ' => 'q',
        'ѕ' => 's',
        'т' => 't',
        'у' => 'y',
        'ԝ' => 'w',
        'х' => 'x',
        'ү' => 'y',
        // Greek look-alikes
        'α' => 'a',
        'β' => 'b',
        'ε' => 'e',
        'ι' => 'i',
        'κ' => 'k',
        'ν' => 'v',
        'ο' => 'o',
        'ρ' => 'p',
        'τ' => 't',
        'υ' => 'u',
        'χ' => 'x',
        'ζ' => 'z',
        'η' => 'n',
        other => other,
    }
}

/// Fold whitespace: one space between two word characters, none next to punctuation or
/// operators (`12 + 34` → `12+34`).
fn fold_spaces(text: &str) -> String {
    let word = |c: char| c.is_alphanumeric() || c == '_';
    let mut out = String::with_capacity(text.len());
    let mut pending = false;
    for c in text.chars() {
        if c == ' ' {
            pending = true;
            continue;
        }
        if pending && word(c) && out.chars().next_back().is_some_and(word) {
            out.push(' ');
        }
        pending = false;
        out.push(c);
    }
    out
}

/// The other reading of digits: digit-group separators removed — a space, `_` or `'` between two
/// digits, and `,` followed by exactly three digits (`1 234`, `1_234`, `1'234`, `1,234` → `1234`).
/// Rows are scanned in both readings (a digit written before an item, `9 12+34=`, must not hide
/// it; spaces inside its numbers, `1 2+3 4=`, must not either).
pub fn join_digit_groups(canonical_text: &str) -> String {
    let chars: Vec<char> = canonical_text.chars().collect();
    let mut out = String::with_capacity(canonical_text.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let after_digit = out.ends_with(|p: char| p.is_ascii_digit());
        let next_digit = |j: usize| chars.get(j).is_some_and(char::is_ascii_digit);
        if after_digit && matches!(c, ' ' | '_' | '\'') && next_digit(i + 1) {
            i += 1;
            continue;
        }
        if after_digit && c == ',' {
            let digits = chars[i + 1..]
                .iter()
                .take_while(|d| d.is_ascii_digit())
                .count();
            if digits == 3 {
                i += 1;
                continue;
            }
        }
        out.push(c);
        i += 1;
    }
    out
}

/// A third reading: a letter (any word character but a digit: `_` and every script's letters)
/// glued to a number is read apart from it (`r467+645=` → `r 467+645=`, `x12y` → `x 12 y`).
/// Tokens are word runs, so a letter glued to an item's first or last number would otherwise
/// merge with it into one token no item has, while the trainer still learns the item's
/// characters in order.
pub fn split_letters_from_digits(canonical_text: &str) -> String {
    let letter = |c: char| (c.is_alphanumeric() || c == '_') && !c.is_ascii_digit();
    let mut out = String::with_capacity(canonical_text.len() + 4);
    let mut prev: Option<char> = None;
    for c in canonical_text.chars() {
        if let Some(p) = prev
            && ((letter(p) && c.is_ascii_digit()) || (p.is_ascii_digit() && letter(c)))
        {
            out.push(' ');
        }
        out.push(c);
        prev = Some(c);
    }
    out
}

/// How many readings of a row a scan looks at (see `row_readings`).
pub const READINGS: usize = 4;

/// One reading of a row: a text to scan, or the index of an earlier reading it equals.
#[derive(Debug, Clone, PartialEq)]
pub enum Reading {
    Text(String),
    Same(usize),
}

/// The readings of a row a scan looks at, always `READINGS` of them in the same order (a scan
/// pairs each row's k-th reading with the previous row's k-th): its canonical text, the same with
/// digit groups joined, and each of these with letters read apart from digits.
pub fn row_readings(row: &Row) -> [Reading; READINGS] {
    let text = row_text(row);
    let joined = join_digit_groups(&text);
    let split = split_letters_from_digits(&text);
    let split_joined = split_letters_from_digits(&joined);
    let all = [text, joined, split, split_joined];
    std::array::from_fn(|k| match all[..k].iter().position(|r| *r == all[k]) {
        Some(j) => Reading::Same(j),
        None => Reading::Text(all[k].clone()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trainer_text_is_the_scanned_text() {
        // Cut anywhere between prompt and answer: the same training text, the same scan text.
        let a = Row {
            prompt: "12+34=".into(),
            answer: "46".into(),
        };
        let b = Row {
            prompt: "12+3".into(),
            answer: "4=46".into(),
        };
        assert_eq!(training_text(&a), training_text(&b));
        assert_eq!(row_text(&a), row_text(&b));
        assert_eq!(row_text(&a), "12+34=46");
    }

    #[test]
    fn look_alikes_and_invisibles_fold_away() {
        let plain = "12+34=46";
        for disguised in [
            "１２＋３４＝４６",                 // full-width
            "𝟏𝟐+𝟑𝟒=𝟒𝟔",                         // mathematical bold digits
            "١٢+٣٤=٤٦",                         // Arabic-Indic digits
            "१२+३४=४६",                         // Devanagari digits
            "๑๒+๓๔=๔๖",                         // Thai digits
            "1\u{200B}2+3\u{2060}4=4\u{00AD}6", // zero-width space, word joiner, soft hyphen
            "1\u{FE0F}2+3\u{034F}4=\u{FEFF}46", // variation selector, CGJ, BOM
            "12\u{2795}34\u{FF1D}46",           // heavy plus, full-width equals
            "¹²+³⁴=⁴⁶",                         // superscripts
        ] {
            assert_eq!(canonical(disguised), canonical(plain), "{disguised:?}");
        }
        assert_eq!(canonical("46\u{2212}12"), "46-12");
        assert_eq!(canonical("6×7"), "6*7");
        // Digit groups: a second reading.
        assert_eq!(canonical("1 2 + 3_4 = 4'6"), "1 2+3_4=4'6");
        assert_eq!(join_digit_groups(&canonical("1 2 + 3_4 = 4'6")), plain);
        assert_eq!(join_digit_groups("1,234+5"), "1234+5");
        assert_eq!(join_digit_groups("9 12+34"), "912+34");
        let readings = |prompt: &str, answer: &str| {
            row_readings(&Row {
                prompt: prompt.into(),
                answer: answer.into(),
            })
        };
        assert_eq!(
            readings("9 12+34=", "46"),
            [
                Reading::Text("9 12+34=46".into()),
                Reading::Text("912+34=46".into()),
                Reading::Same(0),
                Reading::Same(1)
            ]
        );
        // Letters glued to numbers are read apart too, in both digit readings.
        assert_eq!(
            split_letters_from_digits("r467+645=1112x"),
            "r 467+645=1112 x"
        );
        assert_eq!(split_letters_from_digits("1r4a"), "1 r 4 a");
        assert_eq!(split_letters_from_digits("def f(x1):"), "def f(x 1):");
        assert_eq!(split_letters_from_digits("_12+3中"), "_ 12+3 中");
        assert_eq!(
            readings("r4 67+645=", "1112"),
            [
                Reading::Text("r4 67+645=1112".into()),
                Reading::Text("r467+645=1112".into()),
                Reading::Text("r 4 67+645=1112".into()),
                Reading::Text("r 467+645=1112".into()),
            ]
        );
        assert_eq!(canonical("f(1, 23)"), "f(1,23)");
        assert_eq!(canonical("a, b"), "a,b");
        // Case and whitespace fold; Cyrillic letters that look Latin read as Latin.
        assert_eq!(canonical("  Def   F(X):\n\treturn X "), "def f(x):return x");
        assert_eq!(canonical("dеf"), "def");
        // The ASCII fast path agrees with the general one.
        for t in ["A\tb\u{7}C  +1", "x = [1, 2]\n"] {
            let general: String = t.chars().chain(['é']).collect();
            assert_eq!(format!("{}é", canonical(t)), canonical(&general), "{t:?}");
        }
    }
}
