//! How slowly a registry may send what a pull reads ([`Slowest`]), shared by the push
//! options that carry it and the bounded reads that apply it.

use std::time::Duration;

/// `4 MiB`, `64 KiB`, `300 bytes`.
pub(crate) fn human(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} bytes"),
    }
}

/// The slowest a registry may send what a pull reads: a read of N bytes (a document, up
/// to its bound; a blob attempt, what is left of it) must end within `grace` plus N at
/// `bytes_per_second`. Else a document is refused and a blob attempt ends (it is retried,
/// and a rerun continues it), instead of a registry holding the pull open for days at one
/// byte per read timeout.
#[derive(Clone, Debug)]
pub struct Slowest {
    pub grace: Duration,
    pub bytes_per_second: u64,
}

impl Default for Slowest {
    fn default() -> Self {
        Slowest {
            grace: Duration::from_secs(60),
            bytes_per_second: 64 << 10,
        }
    }
}

impl Slowest {
    /// How long reading `bytes` may take.
    pub fn deadline(&self, bytes: u64) -> Duration {
        self.grace + Duration::from_secs_f64(bytes as f64 / self.bytes_per_second.max(1) as f64)
    }

    /// `124 s (60 s, then 64 KiB/s for 4 MiB)`: a deadline, for messages.
    pub fn said(&self, bytes: u64) -> String {
        format!(
            "{:.0} s ({:.0} s, then {}/s for {})",
            self.deadline(bytes).as_secs_f64(),
            self.grace.as_secs_f64(),
            human(self.bytes_per_second),
            human(bytes)
        )
    }
}
