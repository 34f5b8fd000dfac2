//! commstack-testkit (skeleton; see the crate's owner issue).
