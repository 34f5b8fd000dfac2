//! commstack-nvshmem (skeleton; see the crate's owner issue).
