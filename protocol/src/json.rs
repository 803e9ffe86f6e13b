//! Writing JSON text by hand on the per-call path: a string quoted and
//! escaped, and its length, byte for byte as `serde_json` writes them.
//!
//! `serde_json` escapes every string one byte at a time, struct keys
//! included, and a tool call writes about a hundred short strings (two
//! audit records, its events, its answer). The records that are written
//! on every call build their lines with these: constant keys as literal
//! bytes, values through [`write_str`], which copies the runs that need no
//! escape whole. Each such writer is tested to produce exactly what
//! `serde_json` produces for the same value, so a reader cannot tell them
//! apart.

/// `b` repeated in every byte of a word.
const fn splat(b: u8) -> u64 {
    u64::from_ne_bytes([b; 8])
}

const LOW_BITS: u64 = splat(0x01);
const HIGH_BITS: u64 = splat(0x80);

/// Whether any byte of `w` needs escaping: a control (below 0x20), `"` or
/// `\`. Bytes of 0x80 and above never do (UTF-8 continuation and lead
/// bytes are copied as they are, as serde_json does).
///
/// One mask for the three tests: in a byte below 0x80, `b - 0x20` borrows
/// for a control, and `(b ^ c) - 1` for `c` itself; `b ^ c` keeps `b`'s
/// high bit, so `!w` masks all three to the bytes below 0x80. A borrow
/// only carries into higher bytes from a byte that is a hit, so the mask
/// is non-zero exactly when some byte is one (which byte is found by the
/// byte-by-byte rescan).
const fn word_needs_escape(w: u64) -> bool {
    escape_mask(w) != 0
}

/// The mask of [`word_needs_escape`]: the high bit of each byte flagged.
/// Its lowest flagged byte is exactly the lowest byte that needs escaping
/// (no borrow reaches it from below), so in a word read little-endian
/// `trailing_zeros / 8` is that byte's index.
pub(crate) const fn escape_mask(w: u64) -> u64 {
    let control = w.wrapping_sub(splat(0x20));
    let quote = (w ^ splat(b'"')).wrapping_sub(LOW_BITS);
    let backslash = (w ^ splat(b'\\')).wrapping_sub(LOW_BITS);
    (control | quote | backslash) & !w & HIGH_BITS
}

/// The high bit of each byte of `w` that is zero. Its lowest flagged byte
/// is exactly the lowest zero byte (a borrow only starts at a zero byte),
/// so in a word read little-endian `trailing_zeros / 8` is its index;
/// bytes above it may be flagged falsely.
const fn zero_mask(w: u64) -> u64 {
    w.wrapping_sub(LOW_BITS) & !w & HIGH_BITS
}

/// The index of the first `b` in `bytes` (a reader looks for the `\n`
/// that ends a line this way). Sixteen bytes a step while there is none,
/// then the word that has it gives its index without a byte loop; a tail
/// of fewer than eight is read as the last eight bytes, which overlap
/// bytes already found clean.
pub fn find_byte(bytes: &[u8], b: u8) -> Option<usize> {
    let hit = |word: &[u8; 8]| zero_mask(u64::from_le_bytes(*word) ^ splat(b));
    let index = |at: usize, mask: u64| at + (mask.trailing_zeros() / 8) as usize;
    let (words, _) = bytes.as_chunks::<8>();
    let mut i = 0;
    while let Some(pair) = words.get(i..i + 2) {
        if hit(&pair[0]) | hit(&pair[1]) != 0 {
            break;
        }
        i += 2;
    }
    for (j, word) in words.iter().enumerate().skip(i) {
        let mask = hit(word);
        if mask != 0 {
            return Some(index(8 * j, mask));
        }
    }
    match bytes.last_chunk::<8>() {
        Some(last) => {
            let mask = hit(last);
            (mask != 0).then(|| index(bytes.len() - 8, mask))
        }
        None => bytes.iter().position(|x| *x == b),
    }
}

const fn byte_needs_escape(b: u8) -> bool {
    b < 0x20 || b == b'"' || b == b'\\'
}

/// The index of the first byte of `bytes` from `start` that needs escaping,
/// or `bytes.len()`. Eight bytes at a time while none does; the tail of
/// fewer than eight (a short string is all tail) is tested as one word
/// too, without a variable-length copy (a `memcpy` call per string): see
/// [`tail_word`]. A clean string is never looked at byte by byte.
/// Inlined: most strings are short, and a call's entry and exit cost as
/// much as their scan.
#[inline(always)]
fn next_escape(bytes: &[u8], start: usize) -> usize {
    let rest = bytes.get(start..).unwrap_or_default();
    let (words, tail) = rest.as_chunks::<8>();
    for (i, word) in words.iter().enumerate() {
        if word_needs_escape(u64::from_ne_bytes(*word)) {
            return first_escape(bytes, start + 8 * i);
        }
    }
    if tail.is_empty() {
        return bytes.len();
    }
    let at = bytes.len() - tail.len();
    if word_needs_escape(tail_word(bytes, at)) {
        first_escape(bytes, at)
    } else {
        bytes.len()
    }
}

/// A word holding every byte of `bytes[at..]` (one to seven bytes), the
/// rest of it bytes that need no escape, read with fixed-size loads only.
/// The byte lanes of the word are tested independently, so their order
/// does not matter and a byte may appear twice.
///
/// A string of eight bytes or more gives its last eight: that may take in
/// bytes before `at` (already written, or an escape just written), so a
/// hit there is a false one; the caller rescans from `at` one byte at a
/// time, which finds the real first escape or none. A shorter string is
/// read as two overlapping halves of four, two or one byte.
fn tail_word(bytes: &[u8], at: usize) -> u64 {
    if let Some(last) = bytes.last_chunk::<8>() {
        return u64::from_ne_bytes(*last);
    }
    let tail = bytes.get(at..).unwrap_or_default();
    // Lanes not filled below keep this byte, which needs no escape.
    let pad = splat(b'a');
    match (tail.first_chunk::<4>(), tail.last_chunk::<4>()) {
        (Some(head), Some(last)) => {
            u64::from(u32::from_ne_bytes(*head)) | u64::from(u32::from_ne_bytes(*last)) << 32
        }
        _ => match (tail.first_chunk::<2>(), tail.last_chunk::<2>()) {
            (Some(head), Some(last)) => {
                let low = u64::from(u16::from_ne_bytes(*head))
                    | u64::from(u16::from_ne_bytes(*last)) << 16;
                low | (pad & !0xFFFF_FFFF)
            }
            // One byte (fewer than two).
            _ => match tail.first() {
                Some(&b) => u64::from(b) | (pad & !0xFF),
                None => pad,
            },
        },
    }
}

/// The first byte from `at` that needs escaping, one at a time (a word
/// from `at` said there is one).
fn first_escape(bytes: &[u8], at: usize) -> usize {
    bytes[at..]
        .iter()
        .position(|b| byte_needs_escape(*b))
        .map_or(bytes.len(), |i| at + i)
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// The escape of one byte that needs it, as serde_json writes it.
fn escape(out: &mut Vec<u8>, b: u8) {
    let short = match b {
        b'"' => b'"',
        b'\\' => b'\\',
        0x08 => b'b',
        0x0C => b'f',
        b'\n' => b'n',
        b'\r' => b'r',
        b'\t' => b't',
        _ => {
            out.extend_from_slice(&[
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX[usize::from(b >> 4)],
                HEX[usize::from(b & 0xF)],
            ]);
            return;
        }
    };
    out.extend_from_slice(&[b'\\', short]);
}

/// The length of one byte's escape (the byte needs one).
const fn escape_len(b: u8) -> usize {
    match b {
        b'"' | b'\\' | 0x08 | 0x0C | b'\n' | b'\r' | b'\t' => 2,
        _ => 6,
    }
}

/// Writes `s` as a JSON string: quoted, escaped as serde_json escapes it.
///
/// Nearly every string a call writes needs no escape: one scan finds that,
/// and the string is copied whole between its quotes (a short one without
/// a `memcpy` call); a string with an escape is written out of line.
pub fn write_str(out: &mut Vec<u8>, s: &str) {
    let bytes = s.as_bytes();
    let first = next_escape(bytes, 0);
    if first < bytes.len() {
        write_escaped(out, bytes, first);
        return;
    }
    if bytes.len() <= SHORT {
        write_short(out, bytes);
        return;
    }
    out.reserve(bytes.len() + 2);
    out.push(b'"');
    out.extend_from_slice(bytes);
    out.push(b'"');
}

/// The longest string [`write_short`] writes.
const SHORT: usize = 32;

/// A clean string of at most [`SHORT`] bytes, without a `memcpy` call:
/// a block of quotes of fixed size is appended, the string copied over
/// its middle as the two ends of one fixed size (overlapping when
/// shorter than twice that), and the block cut back after the closing
/// quote, which was already there.
fn write_short(out: &mut Vec<u8>, bytes: &[u8]) {
    let at = out.len();
    out.extend_from_slice(&[b'"'; SHORT + 2]);
    let len = bytes.len();
    if let Some(body) = out.get_mut(at + 1..at + 1 + len) {
        let _ = copy_ends::<16>(body, bytes)
            || copy_ends::<8>(body, bytes)
            || copy_ends::<4>(body, bytes)
            || copy_ends::<2>(body, bytes)
            || copy_ends::<1>(body, bytes);
    }
    out.truncate(at + len + 2);
}

/// Copies `src` over `dst` (the same length) as its first and its last
/// `N` bytes, when it has at least `N`; whether it did.
#[inline(always)]
fn copy_ends<const N: usize>(dst: &mut [u8], src: &[u8]) -> bool {
    let (Some(head), Some(tail)) = (src.first_chunk::<N>(), src.last_chunk::<N>()) else {
        return false;
    };
    if let Some(d) = dst.first_chunk_mut::<N>() {
        *d = *head;
    }
    if let Some(d) = dst.last_chunk_mut::<N>() {
        *d = *tail;
    }
    true
}

/// [`write_str`] for a string whose first escape is at `first`.
#[cold]
#[inline(never)]
fn write_escaped(out: &mut Vec<u8>, bytes: &[u8], first: usize) {
    out.reserve(bytes.len() + 2);
    out.push(b'"');
    let (mut from, mut at) = (0, first);
    loop {
        out.extend_from_slice(&bytes[from..at]);
        let Some(&b) = bytes.get(at) else { break };
        escape(out, b);
        from = at + 1;
        at = next_escape(bytes, from);
    }
    out.push(b'"');
}

/// The length of [`write_str`]'s output for `s`, quotes included.
pub fn str_len(s: &str) -> usize {
    let bytes = s.as_bytes();
    let first = next_escape(bytes, 0);
    if first < bytes.len() {
        return escaped_len(bytes, first);
    }
    bytes.len() + 2
}

/// [`str_len`] for a string whose first escape is at `first`.
#[cold]
#[inline(never)]
fn escaped_len(bytes: &[u8], first: usize) -> usize {
    let mut len = bytes.len() + 2;
    let mut at = first;
    while let Some(&b) = bytes.get(at) {
        len += escape_len(b) - 1;
        at = next_escape(bytes, at + 1);
    }
    len
}

/// Constant text of up to [`Fragment::CAP`] bytes (a key with its
/// punctuation, an enum's name), copied as one block of that fixed size
/// and cut back to its length. A copy whose length is chosen at run time
/// (one of several `&'static str`) is a `memcpy` call; a fixed-size one is
/// a few moves, so a writer that picks one of several fragments pays the
/// same as for one literal.
pub struct Fragment {
    bytes: [u8; Fragment::CAP],
    len: usize,
}

impl Fragment {
    /// The longest fragment.
    pub const CAP: usize = 48;

    /// The parts one after the other. Evaluated at compile time where it
    /// is used in a constant; parts longer than [`Self::CAP`] together
    /// fail the build there.
    pub const fn of(parts: &[&str]) -> Self {
        let mut bytes = [0u8; Self::CAP];
        let mut len = 0;
        let mut p = 0;
        while p < parts.len() {
            let part = parts[p].as_bytes();
            let mut i = 0;
            while i < part.len() {
                bytes[len] = part[i];
                len += 1;
                i += 1;
            }
            p += 1;
        }
        Self { bytes, len }
    }

    /// The fragment's text.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }

    /// Appends the fragment to `out`.
    #[inline]
    pub fn write(&self, out: &mut Vec<u8>) {
        let at = out.len();
        out.extend_from_slice(&self.bytes);
        out.truncate(at + self.len);
    }
}

/// Writes `n` in decimal, as serde_json writes an unsigned integer (a
/// request id on every answer). The digits are counted first and written
/// from the left of a fixed-size block, which is appended whole and cut
/// back: no copy of a length chosen at run time.
pub fn write_u64(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let len = n.checked_ilog10().map_or(1, |log| log as usize + 1);
    for slot in digits[..len].iter_mut().rev() {
        *slot = b'0' + (n % 10) as u8;
        n /= 10;
    }
    let at = out.len();
    out.extend_from_slice(&digits);
    out.truncate(at + len);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ours(s: &str) -> String {
        let mut out = Vec::new();
        write_str(&mut out, s);
        String::from_utf8(out).unwrap()
    }

    fn check(s: &str) {
        let theirs = serde_json::to_string(s).unwrap();
        assert_eq!(ours(s), theirs, "for {s:?}");
        assert_eq!(str_len(s), theirs.len(), "length for {s:?}");
    }

    /// Every one-byte character, alone and inside runs long enough to take
    /// the eight-byte path at every alignment.
    #[test]
    fn every_ascii_character_is_written_as_serde_json_writes_it() {
        for c in (0u8..0x80).map(char::from) {
            check(&c.to_string());
            for pad in 0..17 {
                let run = "a".repeat(pad);
                check(&format!("{run}{c}{run}"));
                check(&format!("{c}{run}{c}"));
            }
        }
    }

    #[test]
    fn non_ascii_and_edge_strings_are_written_as_serde_json_writes_them() {
        for s in [
            "",
            "plain",
            "\u{2028}\u{2029}",
            "é\u{7f}\u{80}\u{ff}",
            "😀 tool \"quoted\" \\ back",
            "\u{0}\u{1f}\u{7f}",
            "line\nbreak\r\ttab\u{8}\u{c}",
            "\\\\\\\\\\\\\\\\\"\"\"\"\"\"\"\"",
            "ß\u{10ffff}\u{feff}\u{202e}",
        ] {
            check(s);
            check(&s.repeat(9));
        }
    }

    /// Strings drawn from a small alphabet of the cases that matter, at
    /// every length up to 40 (a fixed generator, so a failure replays).
    #[test]
    fn generated_strings_are_written_as_serde_json_writes_them() {
        let alphabet = ['a', '"', '\\', '\n', '\u{1}', 'é', '😀', ' ', '\u{1f}', '~'];
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for len in 0..40 {
            for _ in 0..50 {
                let s: String = (0..len)
                    .map(|_| {
                        state ^= state << 13;
                        state ^= state >> 7;
                        state ^= state << 17;
                        alphabet[(state % alphabet.len() as u64) as usize]
                    })
                    .collect();
                check(&s);
            }
        }
    }

    /// Strings of one to sixteen bytes with an escape at every position,
    /// alone and with a second one after it: the tail word must see the
    /// last byte, must not miss one in a short string's halves, and a hit
    /// in the eight-byte tail read that overlaps bytes before the rescan's
    /// start (the first escape, already written) must not end the scan.
    #[test]
    fn escapes_at_every_position_of_short_strings_are_found() {
        for len in 1..=16 {
            for first in 0..len {
                for second in (first..len).map(Some).chain([None]) {
                    for esc in [b'"', b'\\', b'\n', 0x01, 0x1f] {
                        let mut bytes = vec![b'a'; len];
                        bytes[first] = esc;
                        if let Some(second) = second {
                            bytes[second] = b'"';
                        }
                        check(std::str::from_utf8(&bytes).unwrap());
                    }
                }
            }
        }
    }

    /// The one-mask word test against the byte test: every value in every
    /// pair of lanes (the rest plain), so a borrow from one lane into the
    /// next can neither hide a hit nor make one.
    #[test]
    fn the_word_test_agrees_with_the_byte_test_for_every_pair_of_bytes() {
        for low in 0..8 {
            for high in low + 1..8 {
                for a in 0..=255u8 {
                    for b in 0..=255u8 {
                        let mut word = [b'a'; 8];
                        word[low] = a;
                        word[high] = b;
                        let want = word.iter().any(|&x| byte_needs_escape(x));
                        assert_eq!(
                            word_needs_escape(u64::from_ne_bytes(word)),
                            want,
                            "{word:?}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn clean_strings_of_every_short_length_need_no_escape() {
        for len in 0..=16 {
            for c in [b'a', b' ', b'~', 0x7f] {
                let s = String::from_utf8(vec![c; len]).unwrap();
                assert_eq!(next_escape(s.as_bytes(), 0), len, "{s:?}");
                check(&s);
            }
        }
    }

    #[test]
    fn find_byte_finds_the_first_at_every_alignment() {
        for len in 0..40 {
            for at in 0..=len {
                let mut bytes = vec![b'x'; len];
                if at < len {
                    bytes[at] = b'\n';
                    if at + 3 < len {
                        bytes[at + 3] = b'\n';
                    }
                }
                let want = (at < len).then_some(at);
                assert_eq!(find_byte(&bytes, b'\n'), want, "len {len}, at {at}");
            }
        }
    }

    /// A string is appended after what the buffer holds, whatever its
    /// capacity: the clean path copies it whole, the escaped path writes
    /// it out of line, and neither drops, repeats or overwrites a byte.
    #[test]
    fn strings_are_appended_after_what_the_buffer_holds() {
        let strings = [
            "",
            "a",
            "plain",
            "ab\"c",
            "\\",
            "clean and longer than eight",
            "é\n😀",
        ];
        for prefix in ["", "{", "[\"x\","] {
            for capacity in [0, 1, 3, 64] {
                for s in strings {
                    let mut out = Vec::with_capacity(capacity);
                    out.extend_from_slice(prefix.as_bytes());
                    write_str(&mut out, s);
                    let want = format!("{prefix}{}", serde_json::to_string(s).unwrap());
                    assert_eq!(String::from_utf8(out).unwrap(), want);
                }
            }
        }
    }

    /// Clean strings of every length around the short copy's bounds, each
    /// byte different from its neighbours (a copy that puts an end in the
    /// wrong place, or leaves a byte of the block of quotes, shows), in
    /// a buffer with and without room.
    #[test]
    fn clean_strings_of_every_length_are_copied_byte_for_byte() {
        let alphabet: Vec<char> = ('!'..='~').filter(|c| !matches!(c, '"' | '\\')).collect();
        for len in 0..=3 * SHORT {
            let s: String = alphabet.iter().cycle().skip(len).take(len).collect();
            for capacity in [0, len, 200] {
                let mut out = Vec::with_capacity(capacity);
                out.push(b'[');
                write_str(&mut out, &s);
                write_str(&mut out, &s);
                let quoted = serde_json::to_string(&s).unwrap();
                assert_eq!(
                    String::from_utf8(out).unwrap(),
                    format!("[{quoted}{quoted}")
                );
            }
        }
    }

    /// `find_byte` against a plain search, with the bytes that could fool
    /// a word test next to the one sought (one bit off it, with the high
    /// bit set, zero, 0xFF) at every position of every length up to 48:
    /// in the sixteen-byte steps, the single words and the overlapping
    /// last eight.
    #[test]
    fn find_byte_agrees_with_a_plain_search_next_to_hostile_bytes() {
        for b in [b'\n', 0x00, 0x7f, 0x80, 0xff, b'"'] {
            let decoys = [
                b ^ 1,
                b ^ 0x80,
                b.wrapping_add(1),
                b.wrapping_sub(1),
                0x00,
                0xff,
            ];
            for len in 0..48 {
                for at in 0..=len {
                    for decoy in decoys.iter().filter(|d| **d != b) {
                        let mut bytes = vec![*decoy; len];
                        if at < len {
                            bytes[at] = b;
                        }
                        let want = bytes.iter().position(|x| *x == b);
                        assert_eq!(find_byte(&bytes, b), want, "{b:#x} in {bytes:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn a_fragment_is_its_parts_appended_whole() {
        const PAIR: Fragment = Fragment::of(&["\",\"type\":\"", "tool.invoked"]);
        const EMPTY: Fragment = Fragment::of(&[]);
        const FULL: Fragment =
            Fragment::of(&["0123456789abcdef", "0123456789abcdef0123456789abcdef"]);
        for (fragment, text) in [
            (&PAIR, "\",\"type\":\"tool.invoked"),
            (&EMPTY, ""),
            (&FULL, "0123456789abcdef0123456789abcdef0123456789abcdef"),
        ] {
            assert_eq!(fragment.as_bytes(), text.as_bytes());
            for capacity in [0, 5, 100] {
                let mut out = Vec::with_capacity(capacity);
                out.extend_from_slice(b"{x");
                fragment.write(&mut out);
                fragment.write(&mut out);
                assert_eq!(out, format!("{{x{text}{text}").into_bytes());
            }
        }
    }

    #[test]
    fn integers_are_written_as_serde_json_writes_them() {
        let mut edges = vec![0, u64::MAX, u64::from(u32::MAX)];
        for power in (0..20).map(|p| 10u64.pow(p)) {
            edges.extend([
                power - 1,
                power,
                power + 1,
                power.wrapping_mul(9),
                power.wrapping_mul(10) - 1,
            ]);
        }
        for n in edges {
            for prefix in [&b""[..], b"[1,"] {
                let mut out = prefix.to_vec();
                write_u64(&mut out, n);
                let mut want = prefix.to_vec();
                want.extend(serde_json::to_vec(&n).unwrap());
                assert_eq!(out, want, "{n}");
            }
        }
    }
}
