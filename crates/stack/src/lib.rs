//! commstack-stack (skeleton; see the crate's owner issue).
