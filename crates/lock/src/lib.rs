//! commstack-lock (skeleton; see the crate's owner issue).
