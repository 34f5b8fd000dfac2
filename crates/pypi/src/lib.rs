//! commstack-pypi (skeleton; see the crate's owner issue).
