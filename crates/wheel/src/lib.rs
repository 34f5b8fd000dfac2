//! Python wheels: read and verify them (METADATA, WHEEL, RECORD with hashes and sizes),
//! unpack or install them into a directory (keeping executable bits), and write them
//! deterministically (sorted entries, fixed timestamps, correct RECORD); console-script
//! launchers from `entry_points.txt`.
//!
//! Names and versions follow the packaging specs: distribution names are normalised per
//! PEP 503 and escaped for file names per the binary distribution format; versions are
//! parsed and normalised by `pep440_rs`.

mod headers;
mod install;
mod launcher;
mod name;
mod read;
mod record;
mod write;

pub use headers::Headers;
pub use install::{InstallLayout, Installed, install, unpack};
pub use launcher::{EntryPoint, entry_points, launcher_script, parse_entry_points};
pub use name::{Tag, WheelFilename, escape_name, escape_version, normalize_name, parse_version};
pub use read::{DIST_INFO_MAX, RecordMismatch, RecordProblem, Wheel, WheelEntry};
pub use record::{RecordEntry, format_sha256, parse_record, record_hash, render_record};
pub use write::{WheelBuilder, WrittenWheel, add_dist_info_file};

pub use pep440_rs::Version;
