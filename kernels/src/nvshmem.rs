//! Safe wrapper over NVSHMEM's host side: unique id, init/finalize, symmetric memory,
//! barriers. One [`Nvshmem`] per process; finalize runs when it is dropped.

use std::ffi::c_void;
use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context as _, bail};
use cudarc::driver::{CudaContext, sys::CUdeviceptr};

use crate::ffi;

/// An NVSHMEM unique id (`nvshmemx_uniqueid_t`), as the opaque bytes that travel over
/// the rendezvous.
#[derive(Clone, PartialEq, Eq)]
pub struct UniqueId(pub [u8; ffi::UNIQUEID_BYTES]);

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "UniqueId({:02x?}..)", &self.0[..8])
    }
}

impl UniqueId {
    /// A fresh id (rank 0 only). Needs `ctx`'s context current, which this ensures.
    pub fn generate(ctx: &Arc<CudaContext>) -> anyhow::Result<Self> {
        ctx.bind_to_thread()
            .context("making the CUDA context current")?;
        let mut id = [0u8; ffi::UNIQUEID_BYTES];
        // SAFETY: cs_get_uniqueid writes exactly UNIQUEID_BYTES bytes (static_assert in host.cu).
        check(
            unsafe { ffi::cs_get_uniqueid(id.as_mut_ptr().cast()) },
            "nvshmemx_get_uniqueid",
        )?;
        Ok(Self(id))
    }
}

static ACTIVE: AtomicBool = AtomicBool::new(false);

/// An initialised NVSHMEM job member. Not `Send`: NVSHMEM is initialised
/// THREAD_SERIALIZED and the CUDA runtime binds its context per thread, so every call
/// stays on the thread that initialised it.
pub struct Nvshmem {
    ctx: Arc<CudaContext>,
    rank: usize,
    world: usize,
    _not_send: PhantomData<*const ()>,
}

impl Nvshmem {
    /// Collective over all `world` ranks: initialises NVSHMEM with `id` from rank 0.
    /// `ctx` (the device's primary context, shared with the CUDA runtime) is made current
    /// first: NVSHMEM adopts the current context and fails without one.
    pub fn init(
        ctx: Arc<CudaContext>,
        rank: usize,
        world: usize,
        id: &UniqueId,
    ) -> anyhow::Result<Self> {
        if ACTIVE.swap(true, Ordering::SeqCst) {
            bail!("NVSHMEM is already initialised in this process (one Nvshmem per process)");
        }
        let result = (|| {
            ctx.bind_to_thread()
                .context("making the CUDA context current before NVSHMEM init")?;
            let (r, w, dev) = (to_c_int(rank)?, to_c_int(world)?, to_c_int(ctx.ordinal())?);
            // SAFETY: the id buffer holds UNIQUEID_BYTES bytes; the context is current.
            check(
                unsafe { ffi::cs_init(r, w, id.0.as_ptr().cast(), dev) },
                "NVSHMEM init",
            )
        })();
        if let Err(e) = result {
            ACTIVE.store(false, Ordering::SeqCst);
            return Err(e);
        }
        Ok(Self {
            ctx,
            rank,
            world,
            _not_send: PhantomData,
        })
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn world(&self) -> usize {
        self.world
    }

    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Host-side barrier over all PEs. It does not wait for work queued on streams:
    /// synchronise them first.
    pub fn barrier_all(&self) {
        // SAFETY: NVSHMEM is initialised (self exists) and we are on its thread.
        unsafe { ffi::cs_barrier_all() }
    }

    /// Collective: allocates `bytes` of symmetric memory on every PE.
    pub fn alloc(&self, bytes: usize) -> anyhow::Result<SymmetricBuffer<'_>> {
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: NVSHMEM is initialised; cs_malloc writes ptr on success only.
        check(unsafe { ffi::cs_malloc(bytes, &mut ptr) }, "nvshmem_malloc")
            .with_context(|| format!("allocating {bytes} bytes of symmetric memory"))?;
        Ok(SymmetricBuffer {
            ptr,
            len: bytes,
            _shmem: PhantomData,
        })
    }

    /// (major, minor, patch) of the libnvshmem_host this process loaded.
    pub fn loaded_version() -> (i32, i32, i32) {
        let (mut a, mut b, mut c) = (0, 0, 0);
        // SAFETY: writes three ints; needs no initialised state.
        unsafe { ffi::cs_loaded_version(&mut a, &mut b, &mut c) };
        (a, b, c)
    }
}

impl Drop for Nvshmem {
    fn drop(&mut self) {
        // Finalize needs the context current; if binding fails there is nothing better
        // to do than to try anyway.
        let _ = self.ctx.bind_to_thread();
        // SAFETY: NVSHMEM was initialised by Self::init on this thread.
        unsafe { ffi::cs_finalize() };
        ACTIVE.store(false, Ordering::SeqCst);
    }
}

/// Symmetric memory on this PE; the same offsets address it on every PE.
///
/// Freeing is collective, so it is explicit ([`SymmetricBuffer::free`]); a buffer that
/// is dropped instead (e.g. on an error path, where other PEs may not be freeing) stays
/// allocated until NVSHMEM is finalised, which releases the whole heap.
pub struct SymmetricBuffer<'a> {
    ptr: *mut c_void,
    len: usize,
    _shmem: PhantomData<&'a Nvshmem>,
}

impl SymmetricBuffer<'_> {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_ptr(&self) -> *mut c_void {
        self.ptr
    }

    /// The address as a driver-API device pointer (for cudarc's memcpy/memset).
    pub fn device_ptr(&self) -> CUdeviceptr {
        self.ptr as CUdeviceptr
    }

    /// Collective: every PE frees its buffer of the same allocation.
    pub fn free(self) {
        // SAFETY: ptr came from nvshmem_malloc and is freed once (self is consumed).
        unsafe { ffi::cs_free(self.ptr) }
    }
}

fn to_c_int(v: usize) -> anyhow::Result<i32> {
    i32::try_from(v).with_context(|| format!("{v} does not fit a C int"))
}

/// Turns a `cs_*` status into a Result carrying the stored message.
pub(crate) fn check(status: i32, what: &str) -> anyhow::Result<()> {
    if status == 0 {
        Ok(())
    } else {
        bail!("{what}: {}", ffi::last_error())
    }
}
