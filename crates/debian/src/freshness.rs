//! Whether a signed index is current. A signature proves who made an index, not when: a
//! mirror (or anyone between) can serve an old, validly signed InRelease and so freeze a
//! lock on packages with known holes. Like apt, the index's `Valid-Until` must not have
//! passed and its `Date` must not lie in the future; beyond apt, an index without
//! `Valid-Until` must not be older than a stated age, and none may be older than the one
//! the existing lock already recorded for the same mirror and suite (a rollback).

use anyhow::{Result, bail};
use jiff::{SignedDuration, Timestamp};

use crate::release::Release;

/// How far a `Date` may lie ahead of this machine's clock: clocks kept by NTP agree
/// within seconds; five minutes leaves room for one that is not, and no more.
pub const MAX_SKEW: SignedDuration = SignedDuration::from_mins(5);

/// What an index is judged against.
#[derive(Clone, Debug)]
pub struct Freshness {
    /// This machine's clock (tests fix it).
    pub now: Timestamp,
    /// The oldest an index without `Valid-Until` may be (stack.toml's
    /// `image.index-max-age-days`).
    pub max_age_days: u32,
    pub max_skew: SignedDuration,
    /// The `Date` an existing lock recorded for this mirror and suite.
    pub recorded: Option<Recorded>,
}

/// A date an earlier lock recorded, and where (for the message).
#[derive(Clone, Debug)]
pub struct Recorded {
    pub date: Timestamp,
    /// e.g. "stack.lock" (its `[base] release-date`).
    pub lock: String,
}

impl Freshness {
    /// Judged now, with `max_age_days` and [`MAX_SKEW`], nothing recorded.
    pub fn now(max_age_days: u32) -> Freshness {
        Freshness {
            now: Timestamp::now(),
            max_age_days,
            max_skew: MAX_SKEW,
            recorded: None,
        }
    }

    /// Refuses `release` (read from `url`) when it is from the future, expired, too old
    /// without `Valid-Until`, or older than the recorded one; each refusal names the dates
    /// and the bound.
    pub fn check(&self, release: &Release, url: &str) -> Result<()> {
        let (date, now) = (release.date, self.now);
        let ahead = date.duration_since(now);
        if ahead > self.max_skew {
            bail!(
                "{url} is dated {date}, {} ahead of this machine's clock ({now}); at most {} is allowed: \
                 the mirror signs a time that has not come, or this clock is behind. Check the clock \
                 (`date -u`, `timedatectl`), then run `cargo xtask lock` again",
                span(ahead),
                span(self.max_skew)
            );
        }
        match release.valid_until {
            Some(until) if until < now => bail!(
                "{url} expired: its Valid-Until is {until}, {} before now ({now}); it is dated {date}. \
                 A mirror that serves an expired index is stale or replays an old one: use a current \
                 mirror (image.mirror in the stack manifest) and run `cargo xtask lock` again",
                span(now.duration_since(until))
            ),
            Some(_) => {}
            None => {
                let age = now.duration_since(date);
                let max = SignedDuration::from_hours(24 * i64::from(self.max_age_days));
                if age > max {
                    bail!(
                        "{url} is dated {date}, {} before now ({now}), and has no Valid-Until: older than \
                         image.index-max-age-days = {} allows. The mirror may be frozen or replay an old \
                         index: use a current mirror (image.mirror); if this suite's index no longer \
                         changes (a release after its last point release), raise image.index-max-age-days \
                         in the stack manifest and run `cargo xtask lock` again",
                        span(age),
                        self.max_age_days
                    );
                }
            }
        }
        if let Some(recorded) = &self.recorded
            && date < recorded.date
        {
            bail!(
                "{url} is dated {date}, older than the index {} already records for this mirror and suite \
                 ([base] release-date = {}): the mirror serves an older index than before (rolled back, \
                 or a stale copy). Use a current mirror (image.mirror); to go back to the older index on \
                 purpose, delete {} and run `cargo xtask lock`",
                recorded.lock,
                recorded.date,
                recorded.lock
            );
        }
        Ok(())
    }
}

/// `3 days 4 h`, `2 h 5 min`, `40 s`: a reader's unit.
fn span(d: SignedDuration) -> String {
    let secs = d.as_secs().abs();
    let (days, hours, mins) = (secs / 86_400, secs % 86_400 / 3_600, secs % 3_600 / 60);
    match (days, hours, mins) {
        (0, 0, 0) => format!("{secs} s"),
        (0, 0, m) => format!("{m} min"),
        (0, h, m) => format!("{h} h {m} min"),
        (d, h, _) => format!("{d} days {h} h"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_read_in_a_readers_unit() {
        assert_eq!(span(SignedDuration::from_secs(40)), "40 s");
        assert_eq!(span(SignedDuration::from_mins(5)), "5 min");
        assert_eq!(span(SignedDuration::from_mins(125)), "2 h 5 min");
        assert_eq!(span(SignedDuration::from_hours(24 * 3 + 4)), "3 days 4 h");
    }
}
