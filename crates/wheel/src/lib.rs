//! commstack-wheel (skeleton; see the crate's owner issue).
