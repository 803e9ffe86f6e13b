//! The real key masked out of what an upstream answers, before the plugin
//! sees it: header values, and body bytes as they stream. A key split
//! across chunks is still caught: the bytes at a chunk's end that could
//! begin the key are held until the next chunk (or the end) says whether
//! they do. Nothing else is held, so an event whose last bytes cannot
//! begin the key passes at once. The mask has the key's length, so a
//! sized answer keeps its `content-length`.

use bytes::{Bytes, BytesMut};
use hyper::header::{HeaderMap, HeaderValue};

/// The byte every byte of a masked key becomes (`*`, or `#` for a key
/// that holds a `*`).
fn mask_byte(key: &[u8]) -> u8 {
    if key.contains(&b'*') { b'#' } else { b'*' }
}

/// Where `key` first occurs in `buf` at or after `from`.
fn find(buf: &[u8], key: &[u8], from: usize) -> Option<usize> {
    let mut i = from;
    while i + key.len() <= buf.len() {
        let at = i + buf[i..].iter().position(|b| *b == key[0])?;
        if buf.get(at..at + key.len()) == Some(key) {
            return Some(at);
        }
        i = at + 1;
    }
    None
}

/// Masks every whole occurrence of `key` in `buf`; `true` when one was.
fn mask_in(buf: &mut [u8], key: &[u8]) -> bool {
    if key.is_empty() {
        return false;
    }
    let mask = mask_byte(key);
    let mut found = false;
    let mut from = 0;
    while let Some(at) = find(buf, key, from) {
        buf[at..at + key.len()].fill(mask);
        found = true;
        from = at + key.len();
    }
    found
}

/// The length of the longest proper prefix of `key` that `buf` ends with.
fn partial_tail(buf: &[u8], key: &[u8]) -> usize {
    let longest = key.len().saturating_sub(1).min(buf.len());
    (1..=longest)
        .rev()
        .find(|&n| buf[buf.len() - n..] == key[..n])
        .unwrap_or(0)
}

/// Masks the key in one answer body, chunk by chunk.
#[derive(Debug)]
pub(super) struct Redactor {
    key: Bytes,
    /// Bytes that may begin the key, held from the last chunk.
    held: BytesMut,
}

impl Redactor {
    pub(super) fn new(key: Bytes) -> Self {
        Self {
            key,
            held: BytesMut::new(),
        }
    }

    /// What of `chunk` (after what was held) can go to the plugin now.
    pub(super) fn feed(&mut self, chunk: Bytes) -> Bytes {
        // Most chunks hold neither the key nor its beginning at their end:
        // they pass as they are, uncopied.
        if self.held.is_empty()
            && find(&chunk, &self.key, 0).is_none()
            && partial_tail(&chunk, &self.key) == 0
        {
            return chunk;
        }
        let mut buf = std::mem::take(&mut self.held);
        buf.extend_from_slice(&chunk);
        mask_in(&mut buf, &self.key);
        let keep = partial_tail(&buf, &self.key);
        self.held = buf.split_off(buf.len() - keep);
        buf.freeze()
    }

    /// What was held at the end of the answer (it did not begin the key).
    pub(super) fn finish(&mut self) -> Bytes {
        std::mem::take(&mut self.held).freeze()
    }
}

/// Masks `key` in every header value of an answer.
pub(super) fn redact_headers(headers: &mut HeaderMap, key: &[u8]) {
    for value in headers.values_mut() {
        let mut bytes = value.as_bytes().to_vec();
        if mask_in(&mut bytes, key) {
            let mut masked = HeaderValue::from_bytes(&bytes)
                .unwrap_or_else(|_| HeaderValue::from_static("<redacted>"));
            masked.set_sensitive(value.is_sensitive());
            *value = masked;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &[u8] = b"sk-real-0123456789";

    fn through(chunks: &[&[u8]]) -> Vec<u8> {
        let mut r = Redactor::new(Bytes::from_static(KEY));
        let mut out = Vec::new();
        for c in chunks {
            out.extend_from_slice(&r.feed(Bytes::copy_from_slice(c)));
        }
        out.extend_from_slice(&r.finish());
        out
    }

    #[test]
    fn a_key_split_anywhere_across_chunks_is_masked_and_nothing_else_changes() {
        let text = b"data: {\"echo\":\"Bearer sk-real-0123456789\",\"sk\":\"sk-re\"}\n\nsk-real-0123456789";
        let whole = through(&[text]);
        assert_eq!(whole.len(), text.len());
        let shown = String::from_utf8(whole.clone()).unwrap();
        assert!(!shown.contains("sk-real-0123456789"), "{shown}");
        assert!(shown.contains("\"sk\":\"sk-re\""), "{shown}");
        for cut in 0..=text.len() {
            for cut2 in cut..=text.len() {
                let split = through(&[&text[..cut], &text[cut..cut2], &text[cut2..]]);
                assert_eq!(split, whole, "cut at {cut}, {cut2}");
            }
        }
        // Byte by byte.
        let bytes: Vec<&[u8]> = text.chunks(1).collect();
        assert_eq!(through(&bytes), whole);
    }

    #[test]
    fn only_a_possible_beginning_of_the_key_is_held() {
        let mut r = Redactor::new(Bytes::from_static(KEY));
        assert_eq!(
            &r.feed(Bytes::from_static(b"event one\n\n"))[..],
            b"event one\n\n"
        );
        assert_eq!(&r.feed(Bytes::from_static(b"ends sk-r"))[..], b"ends ");
        assert_eq!(&r.feed(Bytes::from_static(b"ight"))[..], b"sk-right");
        assert_eq!(&r.feed(Bytes::from_static(b"s"))[..], b"");
        assert_eq!(&r.finish()[..], b"s");
    }

    #[test]
    fn header_values_are_masked() {
        let mut h = HeaderMap::new();
        h.insert(
            "x-echo",
            HeaderValue::from_static("Bearer sk-real-0123456789"),
        );
        h.insert("x-other", HeaderValue::from_static("fine"));
        redact_headers(&mut h, KEY);
        assert_eq!(h["x-echo"], "Bearer ******************");
        assert_eq!(h["x-other"], "fine");
    }
}
