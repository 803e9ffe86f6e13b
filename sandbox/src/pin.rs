//! The content pin of a plugin binary: the SHA-256 of the exact bytes a
//! runtime may execute (`sha256 = "…"` of a runtime entry).
//!
//! Shared by the host side (staging hashes the copy it makes, the direct
//! launcher hashes the descriptor it executes) and the helper (the plugin's
//! process hashes the descriptor it executes with `execveat`).

use std::io::Read;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest, Sha256};

/// A SHA-256 digest, written as 64 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ProgramDigest([u8; 32]);

impl ProgramDigest {
    /// Parses 64 lowercase hex digits (what `sha256sum` prints); anything
    /// else is refused with what is wrong with it.
    pub fn parse(text: &str) -> Result<Self, String> {
        if text.len() != 64 {
            return Err(format!(
                "must be 64 lowercase hex digits (the output of `sha256sum <program>`), got {} characters",
                text.len()
            ));
        }
        let mut out = [0u8; 32];
        for (i, pair) in text.as_bytes().chunks(2).enumerate() {
            let digit = |c: u8| match c {
                b'0'..=b'9' => Some(c - b'0'),
                b'a'..=b'f' => Some(c - b'a' + 10),
                _ => None,
            };
            match (digit(pair[0]), digit(pair[1])) {
                (Some(h), Some(l)) => out[i] = h << 4 | l,
                _ => {
                    return Err(format!(
                        "must be 64 lowercase hex digits (the output of `sha256sum <program>`); {:?} at offset {} is not one",
                        char::from(if digit(pair[0]).is_none() {
                            pair[0]
                        } else {
                            pair[1]
                        }),
                        i * 2 + usize::from(digit(pair[0]).is_some())
                    ));
                }
            }
        }
        Ok(Self(out))
    }

    /// The digest of everything `reader` yields.
    pub fn of_reader(mut reader: impl Read) -> std::io::Result<Self> {
        let mut h = Sha256::new();
        let mut buf = vec![0u8; 1 << 16];
        loop {
            match reader.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => h.update(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(Self(h.finalize().into()))
    }

    /// The digest of a whole open file, read from its start through the
    /// descriptor (its offset is left at the end).
    pub fn of_file(file: &std::fs::File) -> std::io::Result<Self> {
        use std::io::Seek;
        let mut f = file;
        f.rewind()?;
        Self::of_reader(f)
    }

    /// A hasher fed by the caller (staging hashes the bytes it copies).
    pub(crate) fn hasher() -> Sha256 {
        Sha256::new()
    }

    pub(crate) fn from_hasher(h: Sha256) -> Self {
        Self(h.finalize().into())
    }

    /// 64 lowercase hex digits.
    pub fn hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }
}

impl std::fmt::Display for ProgramDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.hex())
    }
}

impl std::fmt::Debug for ProgramDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "sha256:{}", self.hex())
    }
}

impl Serialize for ProgramDigest {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.hex())
    }
}

impl<'de> Deserialize<'de> for ProgramDigest {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Self::parse(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_digest_is_64_lowercase_hex_digits() {
        // sha256("abc"), FIPS 180-2's example.
        let abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        let d = ProgramDigest::parse(abc).unwrap();
        assert_eq!(d.hex(), abc);
        assert_eq!(ProgramDigest::of_reader(&b"abc"[..]).unwrap(), d);
        let upper = ProgramDigest::parse(&abc.to_uppercase()).unwrap_err();
        assert!(upper.contains("'B' at offset 0"), "{upper}");
        let short = ProgramDigest::parse(&abc[..63]).unwrap_err();
        assert!(short.contains("got 63 characters"), "{short}");
        let odd = ProgramDigest::parse(&format!("{}g", &abc[..63])).unwrap_err();
        assert!(odd.contains("'g' at offset 63"), "{odd}");
    }
}
