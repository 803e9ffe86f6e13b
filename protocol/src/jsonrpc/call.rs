//! A `host/invokeTool` request line read by hand, for the shape the SDKs
//! and the bench write: the envelope's four members and the params' own,
//! in any order, every string plain (no escape, no control), integers
//! written plainly, `arguments` an object of modest depth.
//!
//! Why: every tool call's line is read once, and reading it through
//! serde (a visitor per member, a field match per key, the string scan
//! of `serde_json` one byte at a time) cost about twice what the rest of
//! the call's reading does. Here a member's name, and a value that can
//! only be one text (`"2.0"`, the method), is compared in place with the
//! bytes it must be; any other string is found with the word-wide escape
//! scan of [`crate::json`] and borrowed; each member is matched once, and
//! only `arguments` goes through `serde_json` (from its own slice, into
//! the same map type).
//!
//! It takes a line only when it is sure of the outcome: anything else
//! (an escape, a duplicate or unknown member, a `null`, a number that is
//! not a plain integer, a value its type refuses, another method, deep
//! `arguments`) gives `None` and the line is read the general way, which
//! decides as before. What it takes is valid JSON (its grammar is a
//! subset of JSON's, the line is UTF-8, `arguments` is checked by
//! `serde_json`), so it yields exactly what the general reading yields.

use std::borrow::Cow;

use super::{Incoming, MAX_INTEGER_ID, MAX_STRING_ID_BYTES, Params, RequestId};
use crate::contract::ToolCall;
use crate::method::{InvokeTool, Method};
use crate::primitives::{Identifier, JsonObject, Timestamp};
use crate::wire::{InvokeToolParams, TurnId};

/// Deepest `arguments` (itself included) read here. Far below
/// `serde_json`'s limit of 128 nested values counted from the line or the
/// params: any depth taken here is within it for the general reading too.
const MAX_ARGUMENTS_DEPTH: usize = 64;

/// The request, when `line` is a `host/invokeTool` request of the plain
/// shape; `None` leaves the line to the general reading.
pub(super) fn read(line: &str) -> Option<Incoming<'_, Params<'_>>> {
    let mut c = Cursor { line, at: 0 };
    let (mut jsonrpc, mut id, mut method, mut params) = (None, None, None, None);
    c.object(
        &["jsonrpc", "id", "method", "params"],
        |c, member| match member {
            0 => once(&mut jsonrpc, c.literal("2.0")?),
            1 => once(&mut id, c.id()?),
            2 => once(&mut method, c.literal(InvokeTool::NAME)?),
            _ => once(&mut params, c.params()?),
        },
    )?;
    c.end()?;
    jsonrpc?;
    method?;
    Some(Incoming::Request {
        id: id?,
        method: Cow::Borrowed(InvokeTool::NAME),
        params: Some(Params::InvokeTool(Box::new(params?))),
    })
}

/// Stores a member's value seen for the first time; a second one is
/// `None` (the general reading refuses or decides it).
fn once<T>(slot: &mut Option<T>, value: T) -> Option<()> {
    if slot.is_some() {
        return None;
    }
    *slot = Some(value);
    Some(())
}

/// A position in the line.
struct Cursor<'a> {
    line: &'a str,
    at: usize,
}

impl<'a> Cursor<'a> {
    fn bytes(&self) -> &'a [u8] {
        self.line.as_bytes()
    }

    /// The next byte after JSON whitespace (space, tab, CR, LF).
    #[inline]
    fn peek(&mut self) -> Option<u8> {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.bytes().get(self.at) {
            self.at += 1;
        }
        self.bytes().get(self.at).copied()
    }

    #[inline]
    fn eat(&mut self, want: u8) -> Option<()> {
        (self.peek()? == want).then(|| self.at += 1)
    }

    /// Only whitespace is left.
    fn end(&mut self) -> Option<()> {
        self.peek().is_none().then_some(())
    }

    /// An object whose members are all among `names`, `member` called
    /// with the cursor on each value (after its `:`) and the index of its
    /// name in `names`. Any other name is `None`.
    fn object(
        &mut self,
        names: &[&str],
        mut member: impl FnMut(&mut Self, usize) -> Option<()>,
    ) -> Option<()> {
        self.eat(b'{')?;
        if self.peek()? == b'}' {
            self.at += 1;
            return Some(());
        }
        loop {
            let index = self.name(names)?;
            self.eat(b':')?;
            member(self, index)?;
            match self.peek()? {
                b',' => self.at += 1,
                b'}' => {
                    self.at += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// The index in `names` of the member name at the cursor, when it is
    /// one of them written plainly: its bytes, then the closing quote.
    /// The names hold no quote, backslash or control character, so that is
    /// exactly when [`Self::plain_str`] would read the name: compared in
    /// place, a name costs no scan. Anything else (another name, an
    /// escape) is `None`, as an unknown member is.
    #[inline]
    fn name(&mut self, names: &[&str]) -> Option<usize> {
        self.eat(b'"')?;
        let rest = self.bytes().get(self.at..)?;
        let index = names.iter().position(|name| {
            let n = name.len();
            rest.get(n) == Some(&b'"') && rest.get(..n) == Some(name.as_bytes())
        })?;
        self.at += names[index].len() + 1;
        Some(index)
    }

    /// `Some(())` when the value at the cursor is the string `text`
    /// written plainly (`text` holds no quote, backslash or control
    /// character); anything else is `None` (another value, or the same
    /// text with an escape, is decided by the general reading).
    #[inline]
    fn literal(&mut self, text: &str) -> Option<()> {
        self.eat(b'"')?;
        let rest = self.bytes().get(self.at..)?;
        let n = text.len();
        if rest.get(n) != Some(&b'"') || rest.get(..n) != Some(text.as_bytes()) {
            return None;
        }
        self.at += n + 1;
        Some(())
    }

    /// A string without escapes or control characters, borrowed: its
    /// text is the bytes between the quotes.
    #[inline]
    fn plain_str(&mut self) -> Option<&'a str> {
        self.eat(b'"')?;
        let start = self.at;
        let end = string_stop(self.bytes(), start)?;
        if self.bytes().get(end) != Some(&b'"') {
            return None;
        }
        self.at = end + 1;
        // Both ends are next to an ASCII quote: char boundaries.
        self.line.get(start..end)
    }

    /// A non-negative integer as JSON writes it (no leading zero, no
    /// fraction or exponent), within `u64`.
    fn integer(&mut self) -> Option<u64> {
        self.peek()?;
        let digits = self.bytes()[self.at..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count();
        let text = &self.bytes()[self.at..self.at + digits];
        if digits == 0 || (digits > 1 && text[0] == b'0') {
            return None;
        }
        // A fraction or an exponent makes it a float: left to serde_json.
        if let Some(b'.' | b'e' | b'E') = self.bytes().get(self.at + digits) {
            return None;
        }
        self.at += digits;
        text.iter().try_fold(0u64, |n, &d| {
            n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
        })
    }

    /// A request id as `parse_id` takes it: an integer up to 2^53 − 1 or
    /// a string of at most 64 bytes.
    fn id(&mut self) -> Option<RequestId> {
        if self.peek()? == b'"' {
            let s = self.plain_str()?;
            return (s.len() <= MAX_STRING_ID_BYTES).then(|| RequestId::String(s.to_owned()));
        }
        let n = self.integer()?;
        (n <= MAX_INTEGER_ID).then_some(RequestId::Number(n))
    }

    /// `host/invokeTool`'s params: `turnId`, `call`, optional `step`.
    fn params(&mut self) -> Option<InvokeToolParams> {
        let (mut turn_id, mut call, mut step) = (None, None, None);
        self.object(&["turnId", "call", "step"], |c, member| match member {
            0 => once(&mut turn_id, TurnId::from_borrowed(c.plain_str()?).ok()?),
            1 => once(&mut call, c.call()?),
            _ => once(&mut step, c.integer()?),
        })?;
        Some(InvokeToolParams {
            turn_id: turn_id?,
            call: call?,
            step,
        })
    }

    /// A [`ToolCall`]: its five members, each once.
    fn call(&mut self) -> Option<ToolCall> {
        let (mut id, mut tool, mut arguments, mut trace_id, mut requested_at) =
            (None, None, None, None, None);
        let names = ["id", "tool", "arguments", "traceId", "requestedAt"];
        self.object(&names, |c, member| match member {
            0 => once(&mut id, c.identifier()?),
            1 => once(&mut tool, c.identifier()?),
            2 => once(&mut arguments, c.arguments()?),
            3 => once(&mut trace_id, c.identifier()?),
            _ => once(&mut requested_at, Timestamp::parse(c.plain_str()?).ok()?),
        })?;
        Some(ToolCall {
            id: id?,
            tool: tool?,
            arguments: arguments?,
            trace_id: trace_id?,
            requested_at: requested_at?,
        })
    }

    fn identifier(&mut self) -> Option<Identifier> {
        Identifier::new(self.plain_str()?).ok()
    }

    /// `arguments`: the object's extent found here, its value read by
    /// `serde_json` from that slice into the map the derive reads.
    fn arguments(&mut self) -> Option<JsonObject> {
        serde_json::from_str(self.object_text()?).ok()
    }

    /// The text of the object at the cursor, to its matching `}`, found by
    /// counting brackets outside strings. For a valid object that is where
    /// any JSON parser ends it; an invalid one is refused by the parse of
    /// the slice that follows. Deeper than [`MAX_ARGUMENTS_DEPTH`]: `None`.
    fn object_text(&mut self) -> Option<&'a str> {
        if self.peek()? != b'{' {
            return None;
        }
        let bytes = self.bytes();
        let start = self.at;
        let mut depth = 0usize;
        let mut at = start;
        loop {
            match *bytes.get(at)? {
                b'{' | b'[' => {
                    depth += 1;
                    if depth > MAX_ARGUMENTS_DEPTH {
                        return None;
                    }
                }
                b'}' | b']' => {
                    depth = depth.checked_sub(1)?;
                    if depth == 0 {
                        break;
                    }
                }
                b'"' => at = string_end(bytes, at + 1)?,
                _ => {}
            }
            at += 1;
        }
        self.at = at + 1;
        self.line.get(start..self.at)
    }
}

/// The index of the first quote, backslash or control character from
/// `at`: where a plain string ends, or where it is not plain. Eight bytes
/// at a time, the byte found from the word's mask without a rescan (the
/// strings of a call are short: a rescan would cost as much as the scan).
#[inline]
fn string_stop(bytes: &[u8], mut at: usize) -> Option<usize> {
    while let Some(word) = bytes.get(at..).and_then(<[u8]>::first_chunk::<8>) {
        let mask = crate::json::escape_mask(u64::from_le_bytes(*word));
        if mask != 0 {
            return Some(at + (mask.trailing_zeros() / 8) as usize);
        }
        at += 8;
    }
    let tail = bytes.get(at..)?;
    let found = tail
        .iter()
        .position(|&b| b < 0x20 || b == b'"' || b == b'\\');
    found.map(|i| at + i)
}

/// The index of the quote closing a string whose text starts at `at`,
/// stepping over escaped characters.
fn string_end(bytes: &[u8], mut at: usize) -> Option<usize> {
    loop {
        at = string_stop(bytes, at)?;
        match bytes.get(at)? {
            b'"' => return Some(at),
            b'\\' => at += 2,
            // A control character: invalid JSON, left to serde_json.
            _ => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::string_stop;

    /// The first stop byte, one byte at a time.
    fn naive(bytes: &[u8], at: usize) -> Option<usize> {
        let found = bytes
            .get(at..)?
            .iter()
            .position(|&b| b < 0x20 || b == b'"' || b == b'\\');
        found.map(|i| at + i)
    }

    #[test]
    fn the_stop_is_found_at_every_position_of_every_length() {
        let stops = [b'"', b'\\', 0x00, 0x1f];
        let others = [b'a', b' ', b'!', b'#', b'[', b']', 0x7f, 0x80, 0xa2, 0xff];
        for len in 0..40 {
            for other in others {
                let mut bytes = vec![other; len];
                assert_eq!(string_stop(&bytes, 0), None);
                for at in 0..len {
                    for stop in stops {
                        bytes[at] = stop;
                        // A second stop later, and one before the start.
                        for later in [None, Some(len - 1)] {
                            let mut b = bytes.clone();
                            if let Some(l) = later {
                                b[l] = b'"';
                            }
                            for start in [0, at / 2, at] {
                                assert_eq!(
                                    string_stop(&b, start),
                                    naive(&b, start),
                                    "{b:?} from {start}"
                                );
                            }
                        }
                        bytes[at] = other;
                    }
                }
            }
        }
        assert_eq!(string_stop(b"ab", 3), None);
    }
}
