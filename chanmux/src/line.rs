//! The microVM's protocol line: how its two directions say where they
//! end, since a virtio serial port (like a serial line) carries no
//! end-of-file, and how the guest learns that the host has taken all it
//! sent before it powers off (a port's writes complete before QEMU has
//! passed them on, and QEMU's exit drops what it still holds).
//!
//! Host to guest: the protocol's JSON, then [`END_OF_INPUT`] when the
//! runtime closes the plugin's stdin, then [`OUTPUT_TAKEN`] once the host
//! has read the guest's [`END_OF_OUTPUT`]. No JSON text holds either byte
//! raw (RFC 8259, section 7: inside strings control characters are
//! escaped; outside them only space, tab, line feed and carriage return
//! occur), so the host sends both unescaped.
//!
//! Guest to host: the plugin's stdout, which the plugin writes and so may
//! hold any byte: [`END_OF_OUTPUT`] and [`ESCAPE`] in it are sent as
//! `ESCAPE, byte ^ 0x40` ([`escape_output`]); an [`END_OF_OUTPUT`] alone
//! ends the stream ([`Unescape`]). JSON output holds neither, so a
//! protocol message crosses unchanged.

/// Host to guest: the plugin's stdin has ended.
pub const END_OF_INPUT: u8 = 0x04;
/// Host to guest: everything the guest sent up to its
/// [`END_OF_OUTPUT`] has been read; it may power off.
pub const OUTPUT_TAKEN: u8 = 0x06;
/// Guest to host: the plugin's stdout has ended (unescaped).
pub const END_OF_OUTPUT: u8 = 0x04;
/// Guest to host: the next byte, xor `0x40`, is a byte of the plugin's.
pub const ESCAPE: u8 = 0x10;

fn special(b: u8) -> bool {
    b == END_OF_OUTPUT || b == ESCAPE
}

/// Whether `data` needs [`escape_output`] (it holds a byte that would
/// otherwise be read as a control byte).
pub fn needs_escape(data: &[u8]) -> bool {
    data.iter().any(|&b| special(b))
}

/// Appends `data` to `out` with its control bytes escaped.
pub fn escape_output(data: &[u8], out: &mut Vec<u8>) {
    for &b in data {
        if special(b) {
            out.extend_from_slice(&[ESCAPE, b ^ 0x40]);
        } else {
            out.push(b);
        }
    }
}

/// The host's side of the guest's output: undoes [`escape_output`]
/// across reads and finds the end.
#[derive(Debug, Default)]
pub struct Unescape {
    /// The last read ended with an [`ESCAPE`].
    pending: bool,
    ended: bool,
}

impl Unescape {
    /// The plugin's bytes in `data`: borrowed when `data` holds no
    /// control byte, else unescaped into `scratch`. Bytes after the end
    /// are dropped.
    pub fn feed<'a>(&mut self, data: &'a [u8], scratch: &'a mut Vec<u8>) -> &'a [u8] {
        if self.ended {
            return &[];
        }
        if !self.pending && !needs_escape(data) {
            return data;
        }
        scratch.clear();
        for &b in data {
            if self.pending {
                self.pending = false;
                scratch.push(b ^ 0x40);
            } else if b == ESCAPE {
                self.pending = true;
            } else if b == END_OF_OUTPUT {
                self.ended = true;
                break;
            } else {
                scratch.push(b);
            }
        }
        scratch
    }

    /// Whether the end has been read.
    pub fn ended(&self) -> bool {
        self.ended
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn through(chunks: &[&[u8]]) -> (Vec<u8>, bool) {
        let mut u = Unescape::default();
        let mut got = Vec::new();
        let mut scratch = Vec::new();
        for c in chunks {
            got.extend_from_slice(u.feed(c, &mut scratch));
        }
        (got, u.ended())
    }

    #[test]
    fn every_byte_crosses_and_the_end_is_found_however_it_is_split() {
        let plugin: Vec<u8> = (0..=255u8).chain([ESCAPE, END_OF_OUTPUT, ESCAPE]).collect();
        let mut wire = Vec::new();
        escape_output(&plugin, &mut wire);
        wire.push(END_OF_OUTPUT);
        wire.extend_from_slice(b"after the end");
        for cut in 0..wire.len() {
            let (got, ended) = through(&[&wire[..cut], &wire[cut..]]);
            assert_eq!(got, plugin, "split at {cut}");
            assert!(ended);
        }
        let one_by_one: Vec<&[u8]> = wire.chunks(1).collect();
        assert_eq!(through(&one_by_one), (plugin, true));
    }

    #[test]
    fn json_crosses_unchanged_and_borrowed() {
        let line = b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"s\":\"\\u0004\"}}\n";
        assert!(!needs_escape(line));
        let mut u = Unescape::default();
        let mut scratch = Vec::new();
        let got = u.feed(line, &mut scratch);
        assert_eq!(got, line);
        assert!(scratch.is_empty());
        assert!(!u.ended());
    }
}
