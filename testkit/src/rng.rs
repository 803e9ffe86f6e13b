//! The workspace's one hand-rolled generator.

/// Marsaglia's xorshift64 (shifts 13, 7, 17): deterministic, seeded, no
/// dependency. Not for anything but tests.
#[derive(Debug, Clone)]
pub struct XorShift(u64);

impl XorShift {
    /// A generator from `seed`; a zero seed (a fixed point) is replaced.
    pub fn new(seed: u64) -> Self {
        Self(if seed == 0 {
            0x9E37_79B9_7F4A_7C15
        } else {
            seed
        })
    }

    /// The next 64 bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A number in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// An index into a slice of `len` (> 0) items.
    pub fn index(&mut self, len: usize) -> usize {
        self.below(len as u64) as usize
    }

    /// One of `from` (not empty), cloned.
    pub fn pick<T: Clone>(&mut self, from: &[T]) -> T {
        from[self.index(from.len())].clone()
    }

    /// True one time in `n`.
    pub fn one_in(&mut self, n: u64) -> bool {
        self.below(n) == 0
    }
}

#[cfg(test)]
mod tests {
    use super::XorShift;

    /// The sequence is xorshift64's: the suites' recorded seeds replay.
    #[test]
    fn the_sequence_is_xorshift64() {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut g = XorShift::new(x);
        for _ in 0..1000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            assert_eq!(g.next_u64(), x);
        }
        let mut zero = XorShift::new(0);
        assert_ne!(zero.next_u64(), 0, "a zero seed would stay zero");
        let mut g = XorShift::new(7);
        assert!((0..1000).all(|_| g.below(10) < 10));
        assert_eq!(g.pick(&["only"]), "only");
    }
}
