//! NVSHMEM self-test kernels (skeleton; see issue 5).
