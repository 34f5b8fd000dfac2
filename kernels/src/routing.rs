//! MoE-style dispatch: random routing of tokens to PEs and its CPU reference.
//!
//! Each of `world` PEs holds `tokens` tokens of `token_bytes` bytes and
//! `experts_per_pe` experts. A token picks `topk` distinct experts at random and is
//! sent once to every PE that hosts one of them (as DeepEP's dispatch does). Receive
//! buffers are laid out `[sender][slot][token_bytes]`: sender `s`'s tokens for PE `r`
//! fill slots 0.. of region `s` on `r`, in token order. Routing and token bytes are
//! functions of the seed, so every PE can recompute what every other PE sent.

use crate::rng::{ByteStream, Mismatches, Purpose};

/// Byte value the receive buffer is filled with before a dispatch; slots nobody
/// writes must still hold it afterwards.
pub const POISON: u8 = 0xDB;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DispatchShape {
    pub world: usize,
    pub tokens: usize,
    pub token_bytes: usize,
    pub experts_per_pe: usize,
    pub topk: usize,
}

impl DispatchShape {
    pub fn validate(&self) -> Result<(), String> {
        if self.world == 0 || self.tokens == 0 || self.token_bytes == 0 || self.experts_per_pe == 0
        {
            return Err(format!("dispatch shape has a zero dimension: {self:?}"));
        }
        if self.topk == 0 || self.topk > self.experts() {
            return Err(format!(
                "topk {} must be between 1 and the number of experts {} (= {} GPUs x {} per GPU)",
                self.topk,
                self.experts(),
                self.world,
                self.experts_per_pe
            ));
        }
        if !self.token_bytes.is_multiple_of(16) {
            return Err(format!(
                "token bytes {} must be a multiple of 16 (NVSHMEM's vector copy path)",
                self.token_bytes
            ));
        }
        // Item indices and token numbers cross the FFI as i32.
        if self.tokens.saturating_mul(self.world) > i32::MAX as usize {
            return Err(format!(
                "{} tokens x {} GPUs is too many",
                self.tokens, self.world
            ));
        }
        Ok(())
    }

    pub fn experts(&self) -> usize {
        self.world * self.experts_per_pe
    }

    pub fn send_bytes(&self) -> usize {
        self.tokens * self.token_bytes
    }

    /// One sender's region in a receive buffer (room for all its tokens).
    pub fn region_bytes(&self) -> usize {
        self.tokens * self.token_bytes
    }

    pub fn recv_bytes(&self) -> usize {
        self.world * self.region_bytes()
    }

    fn slot_offset(&self, sender: usize, slot: usize) -> u64 {
        (sender * self.region_bytes() + slot * self.token_bytes) as u64
    }
}

/// The PEs token `token` of `sender` goes to: sorted, distinct, at least one.
pub fn token_destinations(
    shape: &DispatchShape,
    seed: u64,
    sender: usize,
    token: usize,
) -> Vec<usize> {
    let stream = ByteStream::new(
        seed,
        Purpose::DispatchRouting,
        (sender * shape.tokens + token) as u64,
    );
    let experts = shape.experts() as u64;
    let mut chosen: Vec<u64> = Vec::with_capacity(shape.topk);
    let mut i = 0u64;
    while chosen.len() < shape.topk {
        // Rejection sampling keeps the pick uniform; topk <= experts guarantees progress.
        let expert = stream.word(i) % experts;
        i += 1;
        if !chosen.contains(&expert) {
            chosen.push(expert);
        }
    }
    let mut pes: Vec<usize> = chosen
        .iter()
        .map(|&e| (e as usize) / shape.experts_per_pe)
        .collect();
    pes.sort_unstable();
    pes.dedup();
    pes
}

/// One put of a dispatch: token `token` of the sender to byte `offset` of PE `pe`'s
/// receive buffer. The layout matches the arrays `cs_launch_dispatch` takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendItem {
    pub token: i32,
    pub pe: i32,
    pub offset: u64,
}

/// Everything `sender` puts, in token order.
pub fn send_plan(shape: &DispatchShape, seed: u64, sender: usize) -> Vec<SendItem> {
    let mut next_slot = vec![0usize; shape.world];
    let mut items = Vec::new();
    for token in 0..shape.tokens {
        for pe in token_destinations(shape, seed, sender, token) {
            let slot = next_slot[pe];
            next_slot[pe] += 1;
            items.push(SendItem {
                token: token as i32,
                pe: pe as i32,
                offset: shape.slot_offset(sender, slot),
            });
        }
    }
    items
}

/// The tokens of `sender` that `receiver` gets, in slot order (the CPU reference).
pub fn expected_tokens(
    shape: &DispatchShape,
    seed: u64,
    sender: usize,
    receiver: usize,
) -> Vec<usize> {
    (0..shape.tokens)
        .filter(|&t| token_destinations(shape, seed, sender, t).contains(&receiver))
        .collect()
}

/// Where a sender's token bytes come from.
pub fn token_stream(seed: u64, sender: usize) -> ByteStream {
    ByteStream::new(seed, Purpose::DispatchTokens, sender as u64)
}

/// The send buffer of `sender`: all its tokens, back to back.
pub fn send_buffer(shape: &DispatchShape, seed: u64, sender: usize) -> Vec<u8> {
    let mut buf = vec![0u8; shape.send_bytes()];
    token_stream(seed, sender).fill(0, &mut buf);
    buf
}

/// Result of checking one receive buffer against the CPU reference.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct DispatchCheck {
    pub expected_tokens: u64,
    /// Tokens with at least one wrong byte.
    pub wrong_tokens: u64,
    /// Wrong bytes inside expected tokens.
    pub wrong_bytes: u64,
    /// Bytes outside every expected token that no longer hold [`POISON`].
    pub poison_overwritten: u64,
    /// The first problem, in words (sender, slot, token, byte).
    pub first_error: Option<String>,
}

impl DispatchCheck {
    pub fn is_clean(&self) -> bool {
        self.wrong_tokens == 0 && self.wrong_bytes == 0 && self.poison_overwritten == 0
    }
}

/// Checks `recv` (PE `receiver`'s whole receive buffer) token by token.
pub fn check_receive_buffer(
    shape: &DispatchShape,
    seed: u64,
    receiver: usize,
    recv: &[u8],
) -> DispatchCheck {
    assert_eq!(recv.len(), shape.recv_bytes(), "receive buffer size");
    let tb = shape.token_bytes;
    let mut check = DispatchCheck::default();
    for sender in 0..shape.world {
        let stream = token_stream(seed, sender);
        let tokens = expected_tokens(shape, seed, sender, receiver);
        let region_start = sender * shape.region_bytes();
        let region = &recv[region_start..region_start + shape.region_bytes()];
        for (slot, &token) in tokens.iter().enumerate() {
            let got = &region[slot * tb..(slot + 1) * tb];
            let m = stream.compare((token * tb) as u64, got);
            check.expected_tokens += 1;
            if !m.is_clean() {
                check.wrong_tokens += 1;
                check.wrong_bytes += m.wrong_bytes;
                check.first_error.get_or_insert_with(|| {
                    format!(
                        "from PE {sender}, slot {slot} (token {token}): {} wrong bytes, first at byte {}",
                        m.wrong_bytes,
                        m.first_offset.unwrap_or(0)
                    )
                });
            }
        }
        let unused_start = tokens.len() * tb;
        let mut poison = Mismatches::default();
        poison.add_fill_check(unused_start as u64, POISON, &region[unused_start..]);
        if !poison.is_clean() {
            check.poison_overwritten += poison.wrong_bytes;
            check.first_error.get_or_insert_with(|| {
                let at = poison.first_offset.unwrap_or(0) as usize;
                format!(
                    "region of PE {sender}: {} bytes written past its {} tokens, first in slot {}",
                    poison.wrong_bytes,
                    tokens.len(),
                    at / tb
                )
            });
        }
    }
    check
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(world: usize) -> DispatchShape {
        DispatchShape {
            world,
            tokens: 64,
            token_bytes: 48,
            experts_per_pe: 4,
            topk: 3,
        }
    }

    #[test]
    fn destinations_are_sorted_distinct_and_in_range() {
        for world in [1, 2, 3, 8] {
            let s = shape(world);
            for token in 0..s.tokens {
                let d = token_destinations(&s, 9, world - 1, token);
                assert!(!d.is_empty() && d.len() <= s.topk.min(world));
                assert!(d.windows(2).all(|w| w[0] < w[1]), "{d:?}");
                assert!(d.iter().all(|&pe| pe < world));
            }
        }
    }

    #[test]
    fn one_pe_sends_every_token_to_itself_once() {
        let s = shape(1);
        let plan = send_plan(&s, 5, 0);
        assert_eq!(plan.len(), s.tokens);
        for (i, item) in plan.iter().enumerate() {
            assert_eq!(
                (item.token as usize, item.pe, item.offset),
                (i, 0, (i * s.token_bytes) as u64)
            );
        }
    }

    #[test]
    fn plan_and_reference_agree_on_every_slot() {
        let s = shape(4);
        for sender in 0..s.world {
            let plan = send_plan(&s, 77, sender);
            for receiver in 0..s.world {
                let expected = expected_tokens(&s, 77, sender, receiver);
                let to_receiver: Vec<_> =
                    plan.iter().filter(|i| i.pe as usize == receiver).collect();
                assert_eq!(to_receiver.len(), expected.len());
                for (slot, (item, &token)) in to_receiver.iter().zip(&expected).enumerate() {
                    assert_eq!(item.token as usize, token);
                    assert_eq!(item.offset, s.slot_offset(sender, slot));
                }
            }
        }
    }

    #[test]
    fn routing_depends_on_seed() {
        let s = shape(8);
        let a: Vec<_> = (0..s.tokens)
            .map(|t| token_destinations(&s, 1, 0, t))
            .collect();
        let b: Vec<_> = (0..s.tokens)
            .map(|t| token_destinations(&s, 2, 0, t))
            .collect();
        assert_ne!(a, b);
        let again: Vec<_> = (0..s.tokens)
            .map(|t| token_destinations(&s, 1, 0, t))
            .collect();
        assert_eq!(a, again);
    }

    /// Runs every sender's plan on the CPU into poisoned receive buffers.
    fn simulate(s: &DispatchShape, seed: u64) -> Vec<Vec<u8>> {
        let mut recv = vec![vec![POISON; s.recv_bytes()]; s.world];
        for sender in 0..s.world {
            let send = send_buffer(s, seed, sender);
            for item in send_plan(s, seed, sender) {
                let src = &send[item.token as usize * s.token_bytes..][..s.token_bytes];
                let off = item.offset as usize;
                recv[item.pe as usize][off..off + s.token_bytes].copy_from_slice(src);
            }
        }
        recv
    }

    #[test]
    fn simulated_dispatch_passes_and_every_corruption_is_caught() {
        let s = shape(3);
        let seed = 1234;
        let mut recv = simulate(&s, seed);
        for (r, buf) in recv.iter().enumerate() {
            let c = check_receive_buffer(&s, seed, r, buf);
            assert!(c.is_clean(), "PE {r}: {c:?}");
            assert!(c.expected_tokens > 0);
        }
        let total: u64 = (0..3)
            .map(|r| check_receive_buffer(&s, seed, r, &recv[r]).expected_tokens)
            .sum();
        let sent: usize = (0..3).map(|p| send_plan(&s, seed, p).len()).sum();
        assert_eq!(total as usize, sent);

        // One wrong byte inside the first token from PE 0 on PE 1.
        recv[1][5] ^= 0x01;
        let c = check_receive_buffer(&s, seed, 1, &recv[1]);
        assert_eq!(
            (c.wrong_tokens, c.wrong_bytes, c.poison_overwritten),
            (1, 1, 0)
        );
        assert!(c.first_error.unwrap().contains("slot 0"));
        recv[1][5] ^= 0x01;

        // A write into the last (unused: topk < world*experts) slot of a region.
        let last = s.region_bytes() - 1;
        recv[2][last] = 0x11;
        let c = check_receive_buffer(&s, seed, 2, &recv[2]);
        assert_eq!((c.wrong_tokens, c.poison_overwritten), (0, 1));
    }

    #[test]
    fn a_token_delivered_to_the_wrong_slot_is_caught() {
        let s = shape(2);
        let seed = 99;
        let mut recv = simulate(&s, seed);
        let tb = s.token_bytes;
        // Swap slots 0 and 1 of sender 0's region on PE 0.
        let (a, b) = recv[0].split_at_mut(tb);
        a.swap_with_slice(&mut b[..tb]);
        let c = check_receive_buffer(&s, seed, 0, &recv[0]);
        assert_eq!(c.wrong_tokens, 2);
    }

    #[test]
    fn validate_rejects_bad_shapes() {
        assert!(shape(2).validate().is_ok());
        assert!(
            DispatchShape {
                topk: 9,
                ..shape(2)
            }
            .validate()
            .is_err()
        );
        assert!(
            DispatchShape {
                token_bytes: 40,
                ..shape(2)
            }
            .validate()
            .is_err()
        );
        assert!(
            DispatchShape {
                tokens: 0,
                ..shape(2)
            }
            .validate()
            .is_err()
        );
    }
}
