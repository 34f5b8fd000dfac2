//! commstack-http: one way to make an HTTP client, and the pieces every client shares.
//!
//! The PyPI index (commstack-pypi), the Debian mirror (commstack-debian) and the
//! downloader (commstack-fetch) all build their `reqwest::Client` with [`client`]: the
//! same user agent, connect and read timeouts, redirect limit, and proxies taken from the
//! environment as reqwest does (`HTTPS_PROXY`, `HTTP_PROXY`, `ALL_PROXY`, `NO_PROXY`).
//! None of them takes a custom CA: TLS trusts the platform's roots (reqwest's rustls).
//!
//! - [`RetryPolicy`]: how often and how long to wait before trying a URL again, and which
//!   answers are worth another try ([`retry`]).
//! - [`get`]: a GET with retries whose body is read with a [`Bound`]: at most so many
//!   bytes (checked against `Content-Length` first, then while the bytes arrive) and
//!   an overall deadline for the whole download, every attempt and wait included, so a
//!   server that sends one byte now and then is cut off, not only one that falls silent.
//!   Each refusal ([`HttpError`]) names the bound it hit.
//!
//! docs/bounds.md lists the bounds each caller uses.

mod bounded;
mod client;
mod error;
pub mod retry;

pub use bounded::{Answer, Bound, Get, get};
pub use client::{ClientSettings, USER_AGENT, client};
pub use error::{HttpError, bytes, shown};
pub use retry::RetryPolicy;
