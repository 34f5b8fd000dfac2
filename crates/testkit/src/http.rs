//! The small slice of HTTP/1.1 the test server needs: reading a request head, parsing a
//! `Range` header, and the reason phrase of a status code.

use std::io::{self, BufRead};

/// One parsed request head (the body, if any, is read and dropped by the caller).
pub struct RequestHead {
    pub method: String,
    pub target: String,
    pub headers: Vec<(String, String)>,
}

impl RequestHead {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Reads one request head; `Ok(None)` when the client closed the connection cleanly.
pub fn read_head(reader: &mut impl BufRead) -> io::Result<Option<RequestHead>> {
    let mut line = String::new();
    // Tolerate stray empty lines between pipelined requests (RFC 9112 section 2.2).
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            return Ok(None);
        }
        if !line.trim().is_empty() {
            break;
        }
    }
    let mut parts = line.split_whitespace();
    let (Some(method), Some(target)) = (parts.next(), parts.next()) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("bad request line {line:?}"),
        ));
    };
    let (method, target) = (method.to_string(), target.to_string());
    let mut headers = Vec::new();
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "connection closed inside request head",
            ));
        }
        let trimmed = line.trim_end_matches(['\r', '\n']);
        if trimmed.is_empty() {
            break;
        }
        if let Some((name, value)) = trimmed.split_once(':') {
            headers.push((name.trim().to_string(), value.trim().to_string()));
        }
    }
    Ok(Some(RequestHead {
        method,
        target,
        headers,
    }))
}

/// What a `Range` header asks of a body of `len` bytes.
#[derive(Debug, PartialEq, Eq)]
pub enum RangeAnswer {
    /// Serve bytes `start..end` (end exclusive) with 206.
    Partial { start: usize, end: usize },
    /// 416: the range starts past the end.
    Unsatisfiable,
    /// A form we do not serve (several ranges, garbage): serve the full body.
    Ignore,
}

pub fn parse_range(value: &str, len: usize) -> RangeAnswer {
    let Some(spec) = value.trim().strip_prefix("bytes=") else {
        return RangeAnswer::Ignore;
    };
    if spec.contains(',') {
        return RangeAnswer::Ignore;
    }
    let Some((first, last)) = spec.split_once('-') else {
        return RangeAnswer::Ignore;
    };
    // `bytes=-N`: the last N bytes (RFC 9110 suffix range), as used to read a zip's end.
    if first.trim().is_empty() {
        return match last.trim().parse::<usize>() {
            Ok(0) => RangeAnswer::Unsatisfiable,
            Ok(n) if len > 0 => RangeAnswer::Partial {
                start: len.saturating_sub(n),
                end: len,
            },
            Ok(_) => RangeAnswer::Unsatisfiable,
            Err(_) => RangeAnswer::Ignore,
        };
    }
    let Ok(start) = first.trim().parse::<usize>() else {
        return RangeAnswer::Ignore;
    };
    let end = match last.trim() {
        "" => len,
        last => match last.parse::<usize>() {
            Ok(last) if last >= start => (last + 1).min(len),
            _ => return RangeAnswer::Ignore,
        },
    };
    if start >= len {
        return RangeAnswer::Unsatisfiable;
    }
    RangeAnswer::Partial { start, end }
}

pub fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        206 => "Partial Content",
        301 => "Moved Permanently",
        302 => "Found",
        303 => "See Other",
        307 => "Temporary Redirect",
        308 => "Permanent Redirect",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        416 => "Range Not Satisfiable",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Status",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_forms() {
        assert_eq!(
            parse_range("bytes=10-", 100),
            RangeAnswer::Partial {
                start: 10,
                end: 100
            }
        );
        assert_eq!(
            parse_range("bytes=10-19", 100),
            RangeAnswer::Partial { start: 10, end: 20 }
        );
        assert_eq!(
            parse_range("bytes=10-500", 100),
            RangeAnswer::Partial {
                start: 10,
                end: 100
            }
        );
        assert_eq!(parse_range("bytes=100-", 100), RangeAnswer::Unsatisfiable);
        assert_eq!(
            parse_range("bytes=-10", 100),
            RangeAnswer::Partial {
                start: 90,
                end: 100
            }
        );
        assert_eq!(
            parse_range("bytes=-1000", 100),
            RangeAnswer::Partial { start: 0, end: 100 }
        );
        assert_eq!(parse_range("bytes=-x", 100), RangeAnswer::Ignore);
        assert_eq!(parse_range("bytes=1-2,5-6", 100), RangeAnswer::Ignore);
        assert_eq!(parse_range("items=1-2", 100), RangeAnswer::Ignore);
    }
}
