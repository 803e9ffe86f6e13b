//! Plugin text on its way to an operator: which characters are escaped
//! before a log line or a terminal shows them, and which characters a file
//! name may not hold.
//!
//! A log or a terminal trusts what it prints: a C0/C1 control moves the
//! cursor or starts an escape sequence, a bidi override (U+202E) reorders
//! what follows so `exe.txt` reads as `txt.exe`, a zero-width or tag
//! character hides text. [`escape_for_operator`] is the one function that
//! makes plugin text safe to show; every path that forwards plugin text to
//! `tracing`, stderr or a terminal goes through it.

use std::fmt::Write;

/// The Unicode `Cf` (format) characters, Unicode 16, as inclusive ranges:
/// soft hyphen, Arabic number marks, the zero-width characters, the bidi
/// embeddings, overrides and isolates, invisible operators, the byte-order
/// mark, interlinear annotation, Egyptian hieroglyph and shorthand format
/// controls, musical symbol formatting and the whole tag block
/// (U+E0000..U+E007F, its unassigned points included).
const FORMAT: &[(u32, u32)] = &[
    (0x00AD, 0x00AD),
    (0x0600, 0x0605),
    (0x061C, 0x061C),
    (0x06DD, 0x06DD),
    (0x070F, 0x070F),
    (0x0890, 0x0891),
    (0x08E2, 0x08E2),
    (0x180E, 0x180E),
    (0x200B, 0x200F),
    (0x202A, 0x202E),
    (0x2060, 0x2064),
    (0x2066, 0x206F),
    (0xFEFF, 0xFEFF),
    (0xFFF9, 0xFFFB),
    (0x110BD, 0x110BD),
    (0x110CD, 0x110CD),
    (0x13430, 0x1343F),
    (0x1BCA0, 0x1BCA3),
    (0x1D173, 0x1D17A),
    (0xE0000, 0xE007F),
];

/// Characters that render as nothing or as a plain space but are not one
/// (a look-alike of another name): the non-ASCII spaces (`Zs` other than
/// U+0020), the Hangul fillers, the combining grapheme joiner, the
/// variation selectors and the Braille blank.
const INVISIBLE: &[(u32, u32)] = &[
    (0x00A0, 0x00A0),
    (0x034F, 0x034F),
    (0x115F, 0x1160),
    (0x1680, 0x1680),
    (0x2000, 0x200A),
    (0x202F, 0x202F),
    (0x205F, 0x205F),
    (0x2800, 0x2800),
    (0x3000, 0x3000),
    (0x3164, 0x3164),
    (0xFE00, 0xFE0F),
    (0xFFA0, 0xFFA0),
    (0xE0100, 0xE01EF),
];

fn in_ranges(c: char, ranges: &[(u32, u32)]) -> bool {
    let c = u32::from(c);
    ranges.iter().any(|&(lo, hi)| (lo..=hi).contains(&c))
}

/// A Unicode format (`Cf`) character: bidi controls, zero-width
/// characters, the BOM, tags.
pub fn is_format(c: char) -> bool {
    in_ranges(c, FORMAT)
}

/// What is escaped before an operator sees it: C0 and C1 controls and
/// DEL (`Cc`), format characters (`Cf`) and the line and paragraph
/// separators (U+2028, U+2029), which some terminals and editors break
/// lines on.
pub fn needs_escape(c: char) -> bool {
    if c.is_ascii() {
        return c.is_ascii_control();
    }
    c.is_control() || is_format(c) || c == '\u{2028}' || c == '\u{2029}'
}

/// What a file name may not hold: everything [`needs_escape`] escapes,
/// plus characters that look like a space or like nothing.
pub fn unsafe_in_name(c: char) -> bool {
    needs_escape(c) || in_ranges(c, INVISIBLE)
}

/// The first character of `s` a file name may not hold.
pub fn first_unsafe_in_name(s: &str) -> Option<char> {
    s.chars().find(|c| unsafe_in_name(*c))
}

/// Escapes plugin bytes for an operator: at most `max` bytes are kept
/// (then `…`), every character of [`needs_escape`] is written as
/// `\u{hex}`, every byte that is not UTF-8 as `\xhh`.
pub fn escape_for_operator(bytes: &[u8], max: usize) -> String {
    let cut = &bytes[..bytes.len().min(max)];
    let mut out = String::with_capacity(cut.len() + 8);
    for chunk in cut.utf8_chunks() {
        let valid = chunk.valid();
        if valid.bytes().all(|b| (0x20..0x7f).contains(&b)) {
            out.push_str(valid);
        } else {
            escape_chars(valid, &mut out);
        }
        for b in chunk.invalid() {
            let _ = write!(out, "\\x{b:02x}");
        }
    }
    if bytes.len() > max {
        out.push('…');
    }
    out
}

fn escape_chars(valid: &str, out: &mut String) {
    for c in valid.chars() {
        if needs_escape(c) {
            let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
        } else {
            out.push(c);
        }
    }
}

/// [`escape_for_operator`] on a whole string.
pub fn escape_text(s: &str) -> String {
    escape_for_operator(s.as_bytes(), usize::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_format_and_bidi_characters_are_escaped() {
        let cases: &[(&str, &str)] = &[
            ("a\x1b[31mb", "a\\u{1b}[31mb"),
            ("tab\there", "tab\\u{9}here"),
            ("c1\u{9b}31m", "c1\\u{9b}31m"),
            ("del\x7f", "del\\u{7f}"),
            ("invoice\u{202e}fdp.exe", "invoice\\u{202e}fdp.exe"),
            ("\u{2066}iso\u{2069}", "\\u{2066}iso\\u{2069}"),
            ("zero\u{200b}width\u{200d}", "zero\\u{200b}width\\u{200d}"),
            ("\u{feff}bom", "\\u{feff}bom"),
            ("arabic\u{61c}mark", "arabic\\u{61c}mark"),
            ("soft\u{ad}hyphen", "soft\\u{ad}hyphen"),
            ("tag\u{e0041}\u{e007f}", "tag\\u{e0041}\\u{e007f}"),
            ("line\u{2028}sep\u{2029}", "line\\u{2028}sep\\u{2029}"),
            ("plain é 漢字 🙂 ok", "plain é 漢字 🙂 ok"),
        ];
        for (raw, escaped) in cases {
            assert_eq!(escape_text(raw), *escaped, "{raw:?}");
            assert!(!escape_text(raw).chars().any(needs_escape), "{raw:?}");
        }
        assert_eq!(escape_for_operator(b"a\xffb", 200), "a\\xffb");
        assert_eq!(escape_for_operator(b"abcdef", 3), "abc…");
    }

    #[test]
    fn the_format_table_is_sorted_and_covers_the_named_characters() {
        for t in [FORMAT, INVISIBLE] {
            assert!(t.windows(2).all(|w| w[0].1 < w[1].0));
            assert!(t.iter().all(|(lo, hi)| lo <= hi));
        }
        for c in [
            '\u{200b}',
            '\u{200e}',
            '\u{200f}',
            '\u{202a}',
            '\u{202e}',
            '\u{2066}',
            '\u{2069}',
            '\u{feff}',
            '\u{61c}',
            '\u{ad}',
            '\u{e0000}',
            '\u{e0001}',
            '\u{e007f}',
        ] {
            assert!(is_format(c), "{c:?}");
        }
        assert!(!is_format('a') && !is_format(' ') && !is_format('é'));
    }

    #[test]
    fn names_refuse_look_alike_blanks_but_not_letters() {
        for c in [
            '\u{a0}', '\u{3000}', '\u{3164}', '\u{fe0f}', '\u{34f}', '\u{202e}', '\n',
        ] {
            assert!(unsafe_in_name(c), "{c:?}");
        }
        assert_eq!(first_unsafe_in_name("report.txt"), None);
        assert_eq!(first_unsafe_in_name("résumé 漢字.md"), None);
        assert_eq!(first_unsafe_in_name("a\u{202e}txt.exe"), Some('\u{202e}'));
    }
}
