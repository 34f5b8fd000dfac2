//! A GET whose answer is bounded: at most so many bytes, all of it within an overall time.

use std::time::Duration;

use reqwest::StatusCode;
use reqwest::header::{ACCEPT, HeaderMap};
use tokio::time::Instant;

use crate::error::{HttpError, shown};
use crate::retry::{self, RetryPolicy};

/// The most a download may cost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bound {
    /// Bytes of the body, checked against `Content-Length` and while it arrives.
    pub max_bytes: u64,
    /// The whole download: every attempt, the waits between them and every body byte.
    pub time: Duration,
}

/// One bounded GET.
#[derive(Clone, Debug)]
pub struct Get<'a> {
    pub url: &'a str,
    /// The `Accept` header, if any.
    pub accept: Option<&'a str>,
    /// What is downloaded, as messages name it (e.g. "the InRelease").
    pub what: &'a str,
    pub bound: Bound,
}

/// The answer to a [`get`]: a success with its body, or another final status (404, 403...)
/// whose body is not read.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    /// Where the answer came from, after redirects.
    pub url: reqwest::Url,
    pub headers: HeaderMap,
    /// The body of a 2xx answer; empty for others.
    pub body: Vec<u8>,
}

/// How one attempt ended when it brought no answer.
enum Failure {
    Transient {
        message: String,
        retry_after: Option<Duration>,
    },
    Permanent(HttpError),
}

/// GET `request.url`, retrying transient failures (5xx, 429, 408, resets, timeouts) as
/// `policy` says, all within `request.bound`: more bytes than `max_bytes` are refused as
/// soon as they are announced or arrive, and nothing runs past `time` from now.
pub async fn get(
    client: &reqwest::Client,
    request: &Get<'_>,
    policy: &RetryPolicy,
) -> Result<Answer, HttpError> {
    let deadline = Instant::now() + request.bound.time;
    let mut received = 0u64;
    let mut failures = 0u32;
    let mut last = None;
    let too_slow = |received: u64, last: Option<String>| HttpError::TooSlow {
        url: request.url.to_string(),
        what: request.what.to_string(),
        limit: request.bound.time,
        received,
        last,
    };
    loop {
        let outcome =
            tokio::time::timeout_at(deadline, attempt(client, request, &mut received)).await;
        let (message, retry_after) = match outcome {
            Err(_) => return Err(too_slow(received, last)),
            Ok(Ok(answer)) => return Ok(answer),
            Ok(Err(Failure::Permanent(error))) => return Err(error),
            Ok(Err(Failure::Transient {
                message,
                retry_after,
            })) => (message, retry_after),
        };
        failures += 1;
        if failures > policy.retries {
            return Err(HttpError::GaveUp {
                message,
                attempts: failures,
            });
        }
        let wake = Instant::now() + policy.delay(failures, retry_after);
        if wake >= deadline {
            // The next try would start after the bound: say so now rather than wait for it.
            return Err(too_slow(received, Some(message)));
        }
        last = Some(message);
        tokio::time::sleep_until(wake).await;
    }
}

/// One request and its body; `received` counts body bytes as they arrive (the caller
/// reports it when the deadline cuts this attempt off).
async fn attempt(
    client: &reqwest::Client,
    request: &Get<'_>,
    received: &mut u64,
) -> Result<Answer, Failure> {
    let url = request.url;
    let mut builder = client.get(url);
    if let Some(accept) = request.accept {
        builder = builder.header(ACCEPT, accept);
    }
    let mut response = builder.send().await.map_err(|e| transport(url, &e))?;
    let status = response.status();
    if retry::is_transient(status) {
        return Err(Failure::Transient {
            message: format!("{} answered {status}", shown(url)),
            retry_after: retry::retry_after(response.headers()),
        });
    }
    let mut answer = Answer {
        status,
        url: response.url().clone(),
        headers: response.headers().clone(),
        body: Vec::new(),
    };
    if !status.is_success() {
        return Ok(answer);
    }
    let limit = request.bound.max_bytes;
    let too_large = |size: u64, announced: bool| {
        Failure::Permanent(HttpError::TooLarge {
            url: url.to_string(),
            what: request.what.to_string(),
            limit,
            size,
            announced,
        })
    };
    if let Some(announced) = response.content_length().filter(|&n| n > limit) {
        return Err(too_large(announced, true));
    }
    // A chunked or close-delimited body announces nothing: the check is per chunk, before
    // it is kept, so no more than `limit` plus one chunk is ever held.
    while let Some(chunk) = response.chunk().await.map_err(|e| transport(url, &e))? {
        *received += chunk.len() as u64;
        let size = answer.body.len() as u64 + chunk.len() as u64;
        if size > limit {
            return Err(too_large(size, false));
        }
        answer.body.extend_from_slice(&chunk);
    }
    Ok(answer)
}

fn transport(url: &str, err: &reqwest::Error) -> Failure {
    let message = retry::error_chain(err);
    match retry::is_permanent(err) {
        true => Failure::Permanent(HttpError::Failed {
            url: url.to_string(),
            message,
        }),
        false => Failure::Transient {
            message: format!("{}: {message}", shown(url)),
            retry_after: None,
        },
    }
}
