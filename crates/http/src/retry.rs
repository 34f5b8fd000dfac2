//! When a failed request is worth another try, and how long to wait first.

use std::time::Duration;

use reqwest::StatusCode;
use reqwest::header::{HeaderMap, RETRY_AFTER};

/// How hard to try one URL.
#[derive(Clone, Debug)]
pub struct RetryPolicy {
    /// Transient failures after which the URL is given up (so `retries + 1` attempts).
    pub retries: u32,
    /// The first wait; it doubles per failure up to `max_backoff`.
    pub backoff: Duration,
    pub max_backoff: Duration,
    /// The longest `Retry-After` honoured as given (a longer one is cut to this).
    pub max_retry_after: Duration,
}

impl RetryPolicy {
    /// The wait before the next attempt after `failures` failures (1 for the first).
    pub fn backoff_for(&self, failures: u32) -> Duration {
        let factor = 1u32 << failures.saturating_sub(1).min(16);
        self.backoff.saturating_mul(factor).min(self.max_backoff)
    }

    /// The wait after `failures` failures, the server's `Retry-After` first when it gave one.
    pub fn delay(&self, failures: u32, retry_after: Option<Duration>) -> Duration {
        retry_after
            .map(|w| w.min(self.max_retry_after))
            .unwrap_or_else(|| self.backoff_for(failures))
    }
}

/// Answers another try may mend: 5xx, 429 Too Many Requests, 408 Request Timeout.
pub fn is_transient(status: StatusCode) -> bool {
    status.is_server_error()
        || status == StatusCode::TOO_MANY_REQUESTS
        || status == StatusCode::REQUEST_TIMEOUT
}

/// `Retry-After: <seconds>` (the HTTP-date form is not honoured: the backoff applies).
pub fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    headers
        .get(RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs)
}

/// A bad URL or a redirect loop will not get better by retrying; resets, timeouts and
/// refused connections might.
pub fn is_permanent(err: &reqwest::Error) -> bool {
    err.is_builder() || err.is_redirect()
}

/// reqwest's own message is terse ("error decoding response body"): add the causes.
pub fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut message = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        source = cause.source();
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let policy = RetryPolicy {
            retries: 5,
            backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(350),
            max_retry_after: Duration::from_secs(1),
        };
        let delays: Vec<_> = (1..=4).map(|n| policy.backoff_for(n).as_millis()).collect();
        assert_eq!(delays, [100, 200, 350, 350]);
        assert_eq!(
            policy.delay(1, Some(Duration::from_secs(60))),
            Duration::from_secs(1)
        );
    }
}
