//! A client for Python package indexes, as far as commstack needs one: PEP 691 JSON project
//! pages, PEP 658 core metadata files (tried always: some indexes serve them without
//! announcing them) with a fallback to reading METADATA out of the wheel through HTTP range
//! requests, and the platform tags a target accepts in pip's order. Wheel filenames are
//! parsed by `commstack_wheel::WheelFilename`.

pub mod index;
pub mod metadata;
pub mod remote_zip;
pub mod tags;

pub use index::{IndexClient, IndexFile, ProjectPage};
pub use metadata::CoreMetadata;
pub use tags::{TargetPlatform, TargetTags};
