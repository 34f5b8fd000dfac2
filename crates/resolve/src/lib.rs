//! commstack-resolve (skeleton; see the crate's owner issue).
