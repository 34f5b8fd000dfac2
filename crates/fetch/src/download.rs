//! Getting one file's bytes from one source into the partial file, hashing as they arrive:
//! HTTP with retries, backoff and `Range` resume, or a copy from a local file.

use std::io::{self, Read, Write};
use std::path::Path;
use std::time::Duration;

use commstack_http::RetryPolicy;
use commstack_http::retry;
use indicatif::ProgressBar;
use reqwest::StatusCode;
use reqwest::header::{CONTENT_RANGE, RANGE};
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

use crate::error::SourceError;

/// What ended up in the partial file.
#[derive(Debug)]
pub(crate) struct Downloaded {
    pub sha256: String,
    pub size: u64,
    /// Body bytes received from the network, over every attempt (0 for a local copy).
    pub transferred: u64,
    /// Bytes already in the partial file when the first request went out.
    pub resumed_from: u64,
}

/// Attempts that got the file further (a flaky connection that keeps dropping) are not
/// counted against `retries`, but are bounded too.
const MAX_ATTEMPTS: u32 = 64;

/// Downloads `url` into `part`, resuming from what `part` already holds.
pub(crate) async fn download_http(
    client: &reqwest::Client,
    url: &url::Url,
    part: &Path,
    expected_size: Option<u64>,
    policy: &RetryPolicy,
    bar: &ProgressBar,
) -> Result<Downloaded, SourceError> {
    let mut failures = 0u32;
    let mut attempts = 0u32;
    let mut transferred = 0u64;
    let mut resumed_from = None;
    let mut furthest = file_len(part);
    loop {
        attempts += 1;
        let mut offset = file_len(part);
        if let Some(size) = expected_size {
            if offset > size {
                truncate(part)?;
                offset = 0;
            } else if offset == size && size > 0 {
                // A previous run got every byte but died before checking them.
                let (hasher, size) = hash_prefix(part, size).await?;
                let sha256 = hex::encode(hasher.finalize());
                return Ok(Downloaded {
                    sha256,
                    size,
                    transferred,
                    resumed_from: size,
                });
            }
        }
        resumed_from.get_or_insert(offset);
        bar.set_position(offset);

        let mut request = client.get(url.clone());
        if offset > 0 {
            request = request.header(RANGE, format!("bytes={offset}-"));
        }
        let outcome = match request.send().await {
            Err(err) => transport_error(&err),
            Ok(response) => receive(response, part, offset, expected_size, bar).await?,
        };
        match outcome {
            Attempt::Done { received, sha256 } => {
                transferred += received;
                let size = file_len(part);
                if let Some(expected) = expected_size.filter(|&e| e != size) {
                    return Err(SourceError::SizeMismatch {
                        expected,
                        actual: size,
                    });
                }
                let resumed_from = resumed_from.unwrap_or(0);
                return Ok(Downloaded {
                    sha256,
                    size,
                    transferred,
                    resumed_from,
                });
            }
            Attempt::Restart => {}
            Attempt::Permanent(error) => return Err(error),
            Attempt::Failed(failure, wait) => {
                transferred += failure.received;
                // Progress means the partial file got further than ever before (a server
                // that ignores Range and drops every connection restarts from 0: no progress).
                let reached = file_len(part);
                if reached > furthest {
                    furthest = reached;
                } else {
                    failures += 1;
                }
                if failures > policy.retries || attempts >= MAX_ATTEMPTS {
                    return Err(failure.into_error(attempts));
                }
                let delay = policy.delay(failures, wait);
                bar.set_message(format!(
                    "retrying in {:.1}s: {}",
                    delay.as_secs_f32(),
                    failure.message()
                ));
                tokio::time::sleep(delay).await;
            }
        }
    }
}

/// The end of one attempt.
enum Attempt {
    Done {
        received: u64,
        sha256: String,
    },
    /// Try again at once (the partial file was reset).
    Restart,
    Permanent(SourceError),
    /// Transient; retry after the server's `Retry-After` when it gave one.
    Failed(Failure, Option<Duration>),
}

/// A transient failure, with the bytes that arrived before it.
struct Failure {
    kind: FailureKind,
    received: u64,
}

enum FailureKind {
    Status(u16),
    Transport(String),
}

impl Failure {
    fn message(&self) -> String {
        match &self.kind {
            FailureKind::Status(code) => format!("HTTP {code}"),
            FailureKind::Transport(message) => message.clone(),
        }
    }

    fn into_error(self, attempts: u32) -> SourceError {
        match self.kind {
            FailureKind::Status(code) => SourceError::Status { code, attempts },
            FailureKind::Transport(message) => SourceError::Transport { message, attempts },
        }
    }
}

/// Checks the status and appends the body to `part`.
async fn receive(
    mut response: reqwest::Response,
    part: &Path,
    offset: u64,
    expected_size: Option<u64>,
    bar: &ProgressBar,
) -> Result<Attempt, SourceError> {
    let start = match resume_at(&response, part, offset, expected_size, bar)? {
        Ok(start) => start,
        Err(attempt) => return Ok(attempt),
    };

    // The digest covers the kept prefix, then every byte as it arrives.
    let mut hasher = match start {
        0 => Sha256::new(),
        _ => hash_prefix(part, start).await?.0,
    };
    let io_error = |e: io::Error| SourceError::Io {
        message: format!("writing {}: {e}", part.display()),
    };
    let mut file = match start {
        0 => tokio::fs::File::create(part).await,
        _ => tokio::fs::OpenOptions::new().append(true).open(part).await,
    }
    .map_err(io_error)?;
    let mut received = 0u64;
    let failure = loop {
        match response.chunk().await {
            Ok(Some(bytes)) => {
                file.write_all(&bytes).await.map_err(io_error)?;
                hasher.update(&bytes);
                received += bytes.len() as u64;
                bar.inc(bytes.len() as u64);
                if let Some(expected) = expected_size
                    && start + received > expected
                {
                    drop(file);
                    truncate(part)?;
                    let actual = start + received;
                    return Ok(Attempt::Permanent(SourceError::SizeMismatch {
                        expected,
                        actual,
                    }));
                }
            }
            Ok(None) => break None,
            Err(err) => break Some(transport_error(&err)),
        }
    };
    // Keep what arrived, even on failure: the next attempt resumes after it.
    file.flush().await.map_err(io_error)?;
    file.sync_all().await.map_err(io_error)?;
    Ok(match failure {
        None => Attempt::Done {
            received,
            sha256: hex::encode(hasher.finalize()),
        },
        Some(Attempt::Failed(failure, wait)) => Attempt::Failed(
            Failure {
                received,
                ..failure
            },
            wait,
        ),
        Some(other) => other,
    })
}

/// Where this answer's body starts in the file: the offset asked for (a range answer that
/// fits), or 0 (the whole file again); or, instead, how the attempt ends (a status to retry
/// or refuse, a range to start over without, a size that is not the locked one).
fn resume_at(
    response: &reqwest::Response,
    part: &Path,
    offset: u64,
    expected_size: Option<u64>,
    bar: &ProgressBar,
) -> Result<Result<u64, Attempt>, SourceError> {
    let mut start = offset;
    match response.status() {
        StatusCode::PARTIAL_CONTENT if offset > 0 => {
            let range = response
                .headers()
                .get(CONTENT_RANGE)
                .and_then(|v| v.to_str().ok())
                .and_then(parse_content_range);
            match range {
                Some((first, total)) if first == offset => {
                    if let (Some(expected), Some(total)) = (expected_size, total)
                        && expected != total
                    {
                        return Ok(Err(Attempt::Permanent(SourceError::SizeMismatch {
                            expected,
                            actual: total,
                        })));
                    }
                }
                // Not the part we asked for: start over without Range.
                _ => {
                    truncate(part)?;
                    return Ok(Err(Attempt::Restart));
                }
            }
        }
        StatusCode::OK => {
            // The server ignored Range (or there was none): the body is the whole file.
            if offset > 0 {
                truncate(part)?;
                start = 0;
                bar.set_position(0);
            }
            if let (Some(expected), Some(announced)) = (expected_size, response.content_length())
                && expected != announced
            {
                return Ok(Err(Attempt::Permanent(SourceError::SizeMismatch {
                    expected,
                    actual: announced,
                })));
            }
        }
        StatusCode::RANGE_NOT_SATISFIABLE if offset > 0 => {
            truncate(part)?;
            return Ok(Err(Attempt::Restart));
        }
        status if retry::is_transient(status) => {
            let wait = retry::retry_after(response.headers());
            return Ok(Err(Attempt::Failed(
                Failure {
                    kind: FailureKind::Status(status.as_u16()),
                    received: 0,
                },
                wait,
            )));
        }
        status => {
            return Ok(Err(Attempt::Permanent(SourceError::Status {
                code: status.as_u16(),
                attempts: 1,
            })));
        }
    }
    Ok(Ok(start))
}

/// Builder and redirect errors will not get better by retrying; the rest might.
fn transport_error(err: &reqwest::Error) -> Attempt {
    let message = retry::error_chain(err);
    if retry::is_permanent(err) {
        Attempt::Permanent(SourceError::Transport {
            message,
            attempts: 1,
        })
    } else {
        Attempt::Failed(
            Failure {
                kind: FailureKind::Transport(message),
                received: 0,
            },
            None,
        )
    }
}

/// `bytes 100-199/1000` -> (100, Some(1000)); `bytes 100-199/*` -> (100, None).
fn parse_content_range(value: &str) -> Option<(u64, Option<u64>)> {
    let rest = value.trim().strip_prefix("bytes ")?;
    let (range, total) = rest.split_once('/')?;
    let (first, _) = range.split_once('-')?;
    let total = if total.trim() == "*" {
        None
    } else {
        Some(total.trim().parse().ok()?)
    };
    Some((first.trim().parse().ok()?, total))
}

fn file_len(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

fn truncate(path: &Path) -> Result<(), SourceError> {
    match std::fs::remove_file(path) {
        Err(err) if err.kind() != io::ErrorKind::NotFound => Err(SourceError::Io {
            message: format!("removing {}: {err}", path.display()),
        }),
        _ => Ok(()),
    }
}

/// The digest state and length of the first `limit` bytes of `path` (on a blocking thread).
async fn hash_prefix(path: &Path, limit: u64) -> Result<(Sha256, u64), SourceError> {
    let owned = path.to_path_buf();
    tokio::task::spawn_blocking(move || -> io::Result<(Sha256, u64)> {
        let file = std::fs::File::open(&owned)?;
        let mut hasher = Sha256::new();
        let size = io::copy(&mut file.take(limit), &mut hasher)?;
        Ok((hasher, size))
    })
    .await
    .expect("hashing thread panicked")
    .map_err(|e| SourceError::Io {
        message: format!("reading {}: {e}", path.display()),
    })
}

/// Copies a local file (mirror directory, `file://` URL) into `part`, hashing it.
pub(crate) fn copy_local(
    source: &Path,
    part: &Path,
    bar: &ProgressBar,
) -> Result<Downloaded, SourceError> {
    let mut input = match std::fs::File::open(source) {
        Ok(file) => file,
        Err(err) if err.kind() == io::ErrorKind::NotFound => {
            return Err(SourceError::NotInMirror {
                path: source.to_path_buf(),
            });
        }
        Err(err) => {
            return Err(SourceError::Io {
                message: format!("reading {}: {err}", source.display()),
            });
        }
    };
    let mut copy = || -> io::Result<(String, u64)> {
        let mut output = std::fs::File::create(part)?;
        let mut hasher = Sha256::new();
        let mut buffer = vec![0u8; 1 << 20];
        let mut size = 0u64;
        loop {
            let n = input.read(&mut buffer)?;
            if n == 0 {
                break;
            }
            hasher.update(&buffer[..n]);
            output.write_all(&buffer[..n])?;
            size += n as u64;
            bar.inc(n as u64);
        }
        output.sync_all()?;
        Ok((hex::encode(hasher.finalize()), size))
    };
    let (sha256, size) = copy().map_err(|e| SourceError::Io {
        message: format!("copying {} to {}: {e}", source.display(), part.display()),
    })?;
    Ok(Downloaded {
        sha256,
        size,
        transferred: 0,
        resumed_from: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_range_forms() {
        assert_eq!(
            parse_content_range("bytes 100-199/1000"),
            Some((100, Some(1000)))
        );
        assert_eq!(parse_content_range("bytes 100-199/*"), Some((100, None)));
        assert_eq!(parse_content_range("bytes */1000"), None);
    }
}
