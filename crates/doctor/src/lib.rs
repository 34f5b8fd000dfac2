//! commstack-doctor (skeleton; see the crate's owner issue).
