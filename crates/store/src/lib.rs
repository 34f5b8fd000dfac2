//! commstack-store (skeleton; see the crate's owner issue).
