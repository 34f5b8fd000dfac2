//! Seeded test data: SplitMix64 byte streams with random access.
//!
//! Every input byte of the self-test comes from a stream named by (seed, purpose,
//! rank), so that any rank can recompute what any other rank sent (the CPU
//! reference) without exchanging data. SplitMix64 is written out here rather than
//! taken from `rand` because its output must never change between versions: a
//! recorded seed has to reproduce the same bytes forever. Bytes are never 0 (a zero
//! byte maps to 1), so a receive buffer left zeroed can never pass for data.

const GOLDEN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's output function.
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// What a stream is used for; part of its key so that streams never overlap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u64)]
pub enum Purpose {
    PutSource = 1,
    DispatchTokens = 2,
    DispatchRouting = 3,
}

/// An infinite, seekable stream of non-zero pseudo-random bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteStream {
    key: u64,
}

impl ByteStream {
    pub fn new(seed: u64, purpose: Purpose, index: u64) -> Self {
        let key = mix64(seed ^ mix64((purpose as u64).wrapping_mul(GOLDEN_GAMMA) ^ mix64(index)));
        Self { key }
    }

    /// Word `i` of the stream (SplitMix64 state after i+1 steps, mixed).
    pub fn word(&self, i: u64) -> u64 {
        mix64(
            self.key
                .wrapping_add(i.wrapping_add(1).wrapping_mul(GOLDEN_GAMMA)),
        )
    }

    /// Writes bytes `[offset, offset + out.len())` of the stream into `out`.
    pub fn fill(&self, offset: u64, out: &mut [u8]) {
        let mut pos = offset;
        let mut rest = out;
        while !rest.is_empty() {
            let word = self.word(pos / 8).to_le_bytes();
            let start = (pos % 8) as usize;
            let n = (8 - start).min(rest.len());
            for (dst, &b) in rest[..n].iter_mut().zip(&word[start..start + n]) {
                *dst = nonzero(b);
            }
            rest = &mut rest[n..];
            pos += n as u64;
        }
    }

    /// Compares `actual` with bytes `[offset, offset + actual.len())` of the stream.
    pub fn compare(&self, offset: u64, actual: &[u8]) -> Mismatches {
        const CHUNK: usize = 64 * 1024;
        let mut expected = vec![0u8; CHUNK.min(actual.len())];
        let mut result = Mismatches::default();
        for (i, got) in actual.chunks(CHUNK).enumerate() {
            let base = (i * CHUNK) as u64;
            let want = &mut expected[..got.len()];
            self.fill(offset + base, want);
            result.add_chunk(base, want, got);
        }
        result
    }
}

fn nonzero(b: u8) -> u8 {
    b.max(1)
}

/// Count and first position of wrong bytes in a comparison.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Mismatches {
    pub wrong_bytes: u64,
    pub first_offset: Option<u64>,
}

impl Mismatches {
    /// Adds the mismatches of `got` against `want`, both starting at `base`.
    pub fn add_chunk(&mut self, base: u64, want: &[u8], got: &[u8]) {
        debug_assert_eq!(want.len(), got.len());
        if want == got {
            return;
        }
        for (i, (w, g)) in want.iter().zip(got).enumerate() {
            if w != g {
                self.wrong_bytes += 1;
                self.first_offset.get_or_insert(base + i as u64);
            }
        }
    }

    /// Counts bytes of `got` (starting at `base`) that differ from `value`.
    pub fn add_fill_check(&mut self, base: u64, value: u8, got: &[u8]) {
        for (i, g) in got.iter().enumerate() {
            if *g != value {
                self.wrong_bytes += 1;
                self.first_offset.get_or_insert(base + i as u64);
            }
        }
    }

    pub fn merge(&mut self, other: Mismatches) {
        self.wrong_bytes += other.wrong_bytes;
        if self.first_offset.is_none() {
            self.first_offset = other.first_offset;
        }
    }

    pub fn is_clean(&self) -> bool {
        self.wrong_bytes == 0
    }
}

/// A seed for runs that did not ask for one: time and pid, mixed. It is reported.
pub fn fresh_seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    mix64(nanos ^ (u64::from(std::process::id()) << 32))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix64_matches_reference_values() {
        // Reference: SplitMix64 seeded with 0 yields these first outputs
        // (Vigna's splitmix64.c).
        let s = ByteStream { key: 0 };
        assert_eq!(s.word(0), 0xE220_A839_7B1D_CDAF);
        assert_eq!(s.word(1), 0x6E78_9E6A_A1B9_65F4);
        assert_eq!(s.word(2), 0x06C4_5D18_8009_454F);
    }

    #[test]
    fn fill_is_seekable_and_never_zero() {
        let s = ByteStream::new(42, Purpose::PutSource, 3);
        let mut whole = vec![0u8; 1000];
        s.fill(0, &mut whole);
        assert!(whole.iter().all(|&b| b != 0));
        for (off, len) in [(0usize, 1usize), (3, 17), (8, 8), (13, 500), (999, 1)] {
            let mut part = vec![0u8; len];
            s.fill(off as u64, &mut part);
            assert_eq!(part, whole[off..off + len], "offset {off} len {len}");
        }
    }

    #[test]
    fn streams_differ_by_seed_purpose_and_index() {
        let a = ByteStream::new(1, Purpose::PutSource, 0);
        assert_ne!(a, ByteStream::new(2, Purpose::PutSource, 0));
        assert_ne!(a, ByteStream::new(1, Purpose::DispatchTokens, 0));
        assert_ne!(a, ByteStream::new(1, Purpose::PutSource, 1));
        assert_ne!(a.word(0), ByteStream::new(1, Purpose::PutSource, 1).word(0));
    }

    #[test]
    fn compare_counts_every_wrong_byte() {
        let s = ByteStream::new(7, Purpose::PutSource, 0);
        let mut buf = vec![0u8; 200_000];
        s.fill(100, &mut buf);
        assert_eq!(s.compare(100, &buf), Mismatches::default());
        buf[70_000] ^= 0xFF;
        buf[150_001] = buf[150_001].wrapping_add(1);
        let m = s.compare(100, &buf);
        assert_eq!(m.wrong_bytes, 2);
        assert_eq!(m.first_offset, Some(70_000));
        // Wrong offset: nearly every byte differs.
        assert!(s.compare(101, &buf).wrong_bytes > 190_000);
    }
}
