//! commstack-testkit: real parts for tests.
//!
//! [`TestServer`] is a real HTTP/1.1 server on `127.0.0.1` (a random port, one thread per
//! connection, keep-alive) that serves the routes a test gives it and can misbehave at
//! the byte level: truncate a body, reset the connection midway, corrupt one byte, trickle
//! slowly, send a body of gigabytes it never holds (with or without `Content-Length`),
//! ignore `Range`, redirect, fail the first requests with 5xx/429. It logs every
//! request (method, path, `Range`, headers) so a test can assert what a client did, e.g.
//! that a resume asked for `bytes=N-`, or that an offline run opened no connection.
//!
//! ```no_run
//! use commstack_testkit::{Behavior, Route, TestServer};
//! let server = TestServer::start();
//! server.route("/simple/torch/", Route::ok(br#"{"files":[]}"#.to_vec())
//!     .header("Content-Type", "application/vnd.pypi.simple.v1+json"));
//! server.route("/f.whl", Route::ok(vec![7u8; 4096]).behavior(Behavior::Truncate { after: 100 }));
//! let url = server.url("/f.whl"); // http://127.0.0.1:PORT/f.whl
//! // ... run the client ...
//! assert_eq!(server.hits("/f.whl"), 1);
//! ```
//!
//! Defaults: unknown paths answer 404; a 200 route honours `Range: bytes=A-B` / `bytes=A-`
//! (unless `Route::ignore_range()` or `Behavior::IgnoreRange`)
//! with 206 + `Content-Range` (416 when the start is past the end); `HEAD` gets the
//! headers only. Routes are keyed by path without the query string.
//!
//! [`TestRegistry`] is a real OCI registry (Debian's docker-registry) on `127.0.0.1` with
//! TLS and htpasswd auth. [`CutProxy`] sits in front of it (or any TCP server) and cuts
//! every connection once a given number of bytes has passed one way: a server gone in the
//! middle of a blob, at a byte count. [`debian::ArchiveKey`] signs InRelease files with a
//! throwaway gpg key, with whatever dates a test needs.
//!
//! [`cosign::ReferrersRegistry`] is a registry with the OCI 1.1 referrers API (plain
//! HTTP, in memory) and [`cosign::cosign`] the real cosign binary, both from Debian's
//! packages (`bash ci/cosign-tools.sh`).
//!
//! [`browser::show`] opens a page or an SVG in a real headless browser (chromium) and
//! gives back its screenshot's pixels and its DOM after rendering.
//!
//! [`slurm::Cluster`] is a real Slurm (munged, slurmctld, slurmd) of one node on loopback
//! that runs job scripts in OCI containers (runc); [`nvshmem::source_tree`] an
//! NVSHMEM-shaped source (its env_defs header) for what reads NVSHMEM's variables.
//!
//! [`as_non_root`] runs a scenario as a user who is not root (the test again, under
//! `setpriv`, when the tests run as root), so that file permissions bite.

pub mod browser;
pub mod build_tools;
pub mod command;
pub mod cosign;
pub mod cut_proxy;
pub mod debian;
mod http;
pub mod native;
mod non_root;
pub mod nvshmem;
pub mod pypi;
pub mod registry;
mod server;
pub mod slurm;

pub use cut_proxy::{CutProxy, Direction};
pub use non_root::as_non_root;
pub use registry::{
    REGISTRY_PASSWORD, REGISTRY_USER, RegistryAuthMode, TestRegistry, skip_registry_tests,
};
pub use server::{Behavior, Request, Route, TestServer};
