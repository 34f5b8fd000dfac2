//! commstack-fetch (skeleton; see the crate's owner issue).
