//! The layer plan: which files go into which layer, so that a change re-ships only small
//! layers. Bottom first: the base root filesystem (as is); one layer per large wheel
//! (installed size at least the threshold, by name: torch, the CUDA libraries, NCCL,
//! triton in the real stack); one layer for the rest of the lock's closure; the venv
//! skeleton and the image user; (DeepEP V2) the CUDA toolchain its JIT runs; the NVSHMEM
//! drop-in; DeepEP; commstack's own files on top.
//! About 10 to 15 layers for the real stack: far below Docker's limit of 125.

use anyhow::{Context, Result};
use commstack_deepep::LockedWheel;
use serde::{Deserialize, Serialize};

/// Wheels whose installed size is at least this get a layer of their own.
pub const LARGE_WHEEL_BYTES: u64 = 64 << 20;

/// What a layer holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum LayerKind {
    Base,
    /// Wheels installed into the venv (by file name).
    Wheels {
        wheels: Vec<String>,
    },
    Skeleton,
    /// DeepEP V2's JIT toolchain (the locked CUDA wheels, by file name) under
    /// /opt/commstack/cuda.
    CudaToolchain {
        wheels: Vec<String>,
    },
    Own,
}

/// One planned layer.
#[derive(Clone, Debug)]
pub struct PlannedLayer {
    /// A short description, also the image history's `created_by`.
    pub holds: String,
    pub kind: LayerKind,
    pub wheels: Vec<LockedWheel>,
}

/// The installed size of a wheel: the sum of its files' uncompressed sizes.
pub fn installed_size(wheel: &LockedWheel) -> Result<u64> {
    let opened = commstack_wheel::Wheel::open(&wheel.path)
        .with_context(|| format!("cannot read the wheel {}", wheel.filename))?;
    Ok(opened.entries.iter().map(|e| e.size).sum())
}

/// Plans the layers for `closure` (the lock's wheels, neither the drop-in nor DeepEP),
/// `dropin` and `deepep`, and (DeepEP V2) `jit`, the toolchain wheels; a wheel of at
/// least `large_bytes` installed gets its own layer.
pub fn plan_layers(
    closure: &[LockedWheel],
    dropin: &LockedWheel,
    deepep: &LockedWheel,
    jit: Option<&[LockedWheel]>,
    large_bytes: u64,
) -> Result<Vec<PlannedLayer>> {
    let wheels_layer = |holds: String, wheels: Vec<LockedWheel>| PlannedLayer {
        holds,
        kind: LayerKind::Wheels {
            wheels: wheels.iter().map(|w| w.filename.clone()).collect(),
        },
        wheels,
    };
    let mut sorted = closure.to_vec();
    sorted.sort_by(|a, b| a.name.cmp(&b.name).then(a.filename.cmp(&b.filename)));
    let mut large = Vec::new();
    let mut rest = Vec::new();
    for w in sorted {
        if installed_size(&w)? >= large_bytes {
            large.push(w);
        } else {
            rest.push(w);
        }
    }
    let mut plan = vec![PlannedLayer {
        holds: "base root filesystem (Debian packages)".into(),
        kind: LayerKind::Base,
        wheels: vec![],
    }];
    for w in large {
        plan.push(wheels_layer(
            format!("wheel {} {}", w.name, w.version),
            vec![w],
        ));
    }
    if !rest.is_empty() {
        plan.push(wheels_layer(
            format!("{} more wheels of the lock's closure", rest.len()),
            rest,
        ));
    }
    plan.push(PlannedLayer {
        holds: "venv skeleton and the image user".into(),
        kind: LayerKind::Skeleton,
        wheels: vec![],
    });
    if let Some(jit) = jit {
        plan.push(PlannedLayer {
            holds: format!(
                "CUDA toolchain for DeepEP V2's JIT ({})",
                jit.iter()
                    .map(|w| format!("{} {}", w.name, w.version))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            kind: LayerKind::CudaToolchain {
                wheels: jit.iter().map(|w| w.filename.clone()).collect(),
            },
            wheels: jit.to_vec(),
        });
    }
    plan.push(wheels_layer(
        format!("NVSHMEM drop-in {} {}", dropin.name, dropin.version),
        vec![dropin.clone()],
    ));
    plan.push(wheels_layer(
        format!("DeepEP {} {}", deepep.name, deepep.version),
        vec![deepep.clone()],
    ));
    plan.push(PlannedLayer {
        holds: "commstack: tools, stack.lock, constraints, SBOM, provenance".into(),
        kind: LayerKind::Own,
        wheels: vec![],
    });
    Ok(plan)
}
