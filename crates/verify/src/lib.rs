//! commstack-verify (skeleton; see the crate's owner issue).
