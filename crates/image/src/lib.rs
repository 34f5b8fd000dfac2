//! commstack-image: the verified stack as a container image, written by the tool itself
//! (Debian's Docker 20.10 has no BuildKit and stamps the clock into `docker import`).
//!
//! - [`layer`]: a directory tree as a layer tar whose bytes depend only on the tree.
//! - [`docker_archive`]: the layers and a canonical config as the docker-archive
//!   `docker load` reads; the image ID is the sha256 of the config bytes.
//! - [`oci_layout`]: the same image as an OCI layout with gzip layers, for registries.
//! - [`base`]: the base step's output (rootfs.tar, base.json) as the image reads it.
//! - [`venv`]: the Python environment, each wheel installed into a staging tree of its own.
//! - [`jit`]: what DeepEP V2's JIT needs in the image: the CUDA toolchain, its cache.
//! - [`plan`]: which layers, holding what.
//! - [`provenance`]: every file of the image mapped to its source.
//! - [`sbom`]: the SPDX 2.3 SBOM.
//! - [`assemble`]: the image step (and its layer steps) in the store.
//! - [`load`]: `docker load` of an image step, and its OCI export.
//! - [`context`]: the build context of docker/Dockerfile (the same files, for `docker build`).

pub mod assemble;
pub mod base;
pub mod context;
pub mod docker_archive;
pub mod jit;
pub mod layer;
pub mod load;
pub mod oci_layout;
pub mod plan;
pub mod provenance;
pub mod sbom;
pub mod venv;

pub use assemble::{
    DataFile, Image, ImageInputs, ImageLayer, ImageManifest, Tool, assemble_image,
    assemble_image_reporting, image_env, locked_image_env,
};
pub use context::{DockerContext, write_docker_context};
pub use docker_archive::{
    ArchiveWriter, DockerArchive, ImageSpec, archive_manifest, image_config, write_docker_archive,
    write_docker_archive_above, write_docker_archive_to,
};
pub use jit::{JIT_CACHE_DIR, JIT_PREFIX, JitToolchain};
pub use layer::{Layer, Owner, write_layer, write_layer_owned};
pub use load::{EarlyLoad, Loaded, docker_load, docker_load_with, export_oci};
pub use oci_layout::{GZIP_LEVEL, GZIP_STEP, OciImage, write_oci_layout, write_oci_layout_with};
pub use plan::LARGE_WHEEL_BYTES;
