//! commstack-image: the verified stack as a container image, written by the tool itself
//! (Debian's Docker 20.10 has no BuildKit and stamps the clock into `docker import`).
//!
//! - [`layer`]: a directory tree as a layer tar whose bytes depend only on the tree.
//! - [`docker_archive`]: the layers and a canonical config as the docker-archive
//!   `docker load` reads; the image ID is the sha256 of the config bytes.
//! - [`oci_layout`]: the same image as an OCI layout with gzip layers, for registries.

pub mod docker_archive;
mod hashing;
pub mod layer;
pub mod oci_layout;

pub use docker_archive::{DockerArchive, ImageSpec, image_config, write_docker_archive};
pub use layer::{Layer, write_layer};
pub use oci_layout::{GZIP_LEVEL, OciImage, write_oci_layout};
