//! commstack-logscan (skeleton; see the crate's owner issue).
