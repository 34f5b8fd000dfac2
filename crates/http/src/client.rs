//! The one builder of HTTP clients.

use std::time::Duration;

use crate::error::HttpError;

/// Every request of commstack says who it is (mirrors and indexes log it).
pub const USER_AGENT: &str = concat!("commstack/", env!("CARGO_PKG_VERSION"));

/// What a client is built with. `ClientSettings::default()` is what the index and the
/// mirror use; fetch takes its timeouts from its options.
#[derive(Clone, Debug)]
pub struct ClientSettings {
    pub connect_timeout: Duration,
    /// The longest silence while reading an answer: one read, not the whole download (a
    /// [`crate::Bound`] bounds that).
    pub read_timeout: Duration,
    pub max_redirects: usize,
}

impl Default for ClientSettings {
    fn default() -> ClientSettings {
        ClientSettings {
            connect_timeout: Duration::from_secs(15),
            read_timeout: Duration::from_secs(60),
            max_redirects: 10,
        }
    }
}

/// A client with `settings`. Proxies come from the environment (`HTTPS_PROXY`,
/// `HTTP_PROXY`, `ALL_PROXY`, `NO_PROXY`), as reqwest reads them by default; TLS trusts
/// the platform's roots.
pub fn client(settings: &ClientSettings) -> Result<reqwest::Client, HttpError> {
    reqwest::Client::builder()
        .user_agent(USER_AGENT)
        .connect_timeout(settings.connect_timeout)
        .read_timeout(settings.read_timeout)
        .redirect(reqwest::redirect::Policy::limited(settings.max_redirects))
        .build()
        .map_err(|e| HttpError::Setup(crate::retry::error_chain(&e)))
}
