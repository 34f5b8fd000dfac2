//! commstack-toolchain (skeleton; see the crate's owner issue).
