//! The binary cache of the stack's step outputs in an OCI registry: `cache push` sends each
//! shipped step output as a signed artifact (`push`), `build --substitute` pulls one in
//! place of building it (`pull`: the pull-or-build decision the plan asks, and the checked
//! pull), and both read and write one typed artifact config (`config`).

pub mod config;
pub mod pull;
pub mod push;
