//! What the registry tests share: options for the test registry, and incompressible bytes.
// Each test file is its own crate and uses a part of this.
#![allow(dead_code)]

use std::time::Duration;

use commstack_registry::{Credentials, PushOptions, RegistryAuth, RetryPolicy, Target};
use commstack_testkit::{REGISTRY_PASSWORD, REGISTRY_USER, TestRegistry};

/// Options for `repo` at `host` (the registry's, or a proxy's in front of it): its CA, the
/// right password, no bars, a short retry.
pub fn options_for(host: &str, registry: &TestRegistry, repo: &str) -> PushOptions {
    let target = Target::parse(&format!("{host}/{repo}")).unwrap();
    let mut options = PushOptions::new(target);
    options.ca_file = Some(registry.ca());
    options.progress = false;
    options.credentials = Some(Credentials {
        auth: RegistryAuth::Basic(REGISTRY_USER.into(), REGISTRY_PASSWORD.into()),
        source: "the test".into(),
    });
    options.retry = RetryPolicy {
        attempts: 2,
        backoff: Duration::from_millis(100),
        max_backoff: Duration::from_millis(100),
    };
    options
}

/// `len` bytes of xorshift noise from `seed`: incompressible, and the same every run.
pub fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(len + 8);
    let mut x = seed | 1;
    while bytes.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        bytes.extend_from_slice(&x.to_le_bytes());
    }
    bytes.truncate(len);
    bytes
}
