//! What a vendor's runtime provides (memory, a stream, compiled kernels, a launch), and the one
//! launch sequence every vendor runs on it.

use super::plan::{KernelParams, Plan, Target, Variant};
use super::tensor_map::{TensorMap, TensorMapShape};
use super::workspace::Workspace;
use crate::error::Error;
use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex};

/// The kernels of one compiled variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Entry {
    /// `va_attention_forward`: one block per (query tile, head) pair or key split of one.
    Attention,
    /// `va_attention_merge`: combines the key splits, one thread per output element of the split pairs.
    Merge,
    /// `va_plan_tiles`: checks cu_seqlens on the device and writes `tile_start`, one block.
    PlanTiles,
}

impl Entry {
    /// The kernel's name in the source.
    pub fn name(self) -> &'static str {
        match self {
            Entry::Attention => "va_attention_forward",
            Entry::Merge => "va_attention_merge",
            Entry::PlanTiles => "va_plan_tiles",
        }
    }
}

/// The grid, block and dynamic shared memory of one launch.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Dims {
    pub grid: (u32, u32, u32),
    pub threads: u32,
    pub shared_bytes: u32,
}

/// One GPU of one vendor: its stream, memory and compiled kernels.
pub(crate) trait Runtime {
    /// Device memory (freed when dropped, ordered after the work queued before).
    type Buffer;
    /// The entry points of one compiled variant.
    type Kernels;

    fn name(&self) -> &str;
    fn multiprocessors(&self) -> usize;
    fn target(&self) -> Target;

    /// `bytes` of device memory, contents unspecified.
    fn alloc(&self, bytes: usize) -> Result<Self::Buffer, Error>;
    /// A new buffer holding `bytes`.
    fn upload(&self, bytes: &[u8]) -> Result<Self::Buffer, Error>;
    /// The first `bytes.len()` bytes of `buffer`, after the queued work.
    fn download(&self, buffer: &Self::Buffer, bytes: &mut [u8]) -> Result<(), Error>;
    /// Overwrites the first `bytes.len()` bytes of `buffer`, in stream order.
    fn write(&self, buffer: &mut Self::Buffer, bytes: &[u8]) -> Result<(), Error>;
    fn address(&self, buffer: &Self::Buffer) -> u64;
    /// Overwrites the first `len` bytes of `buffer` with what `fill(range, chunk)` writes for
    /// each range of them, queued in stream order. Runtimes with page-locked staging pass the
    /// bytes through it chunk by chunk (the host's fill of one chunk overlapping the bus's
    /// copy of the last); the default fills one pageable vector and writes it.
    fn stage_in(
        &self,
        buffer: &mut Self::Buffer,
        len: usize,
        fill: &mut dyn FnMut(Range<usize>, &mut [u8]),
    ) -> Result<(), Error> {
        // Words, so that the bytes are aligned for any element type.
        let mut words = vec![0u64; len.div_ceil(8)];
        let bytes = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut words)[..len];
        fill(0..len, bytes);
        self.write(buffer, bytes)
    }
    /// The first `len` bytes of `buffer` after the queued work, handed to `drain(range, chunk)`
    /// range by range, in order (chunk by chunk as they arrive, where staging is page-locked).
    fn stage_out(
        &self,
        buffer: &Self::Buffer,
        len: usize,
        drain: &mut dyn FnMut(Range<usize>, &[u8]),
    ) -> Result<(), Error> {
        let mut words = vec![0u64; len.div_ceil(8)];
        let bytes = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut words)[..len];
        self.download(buffer, bytes)?;
        drain(0..len, bytes);
        Ok(())
    }
    /// Frees the page-locked staging memory, if any (allocated again on the next use).
    fn release_staging(&self) {}
    fn synchronize(&self) -> Result<(), Error>;
    /// GPU milliseconds of the work `work` queues (device events).
    fn time(&self, work: &mut dyn FnMut() -> Result<(), Error>) -> Result<f32, Error>;

    /// The kernels of `variant`, compiled on first use.
    fn kernels(&self, variant: Variant) -> Result<Arc<Self::Kernels>, Error>;
    /// The workspace (key splits' partial results, or `tile_start`), kept between calls.
    fn workspace(&self) -> &Workspace<Self::Buffer>;
    /// The split counters (`Plan::split_counter_bytes`), zero when allocated and left zero by
    /// every launch, kept between calls.
    fn split_counters(&self) -> &Workspace<Self::Buffer>;
    /// The flag that `va_plan_tiles` raises for cu_seqlens on the device that break a rule.
    fn status(&self) -> &StatusFlag<Self::Buffer>;
    /// Hopper's tensor maps of K and V, or `None` where the runtime has none (the kernel then
    /// copies by cp.async).
    fn tensor_maps(&self, _shapes: [TensorMapShape; 2], _f16: bool) -> Option<[TensorMap; 2]> {
        None
    }

    /// Queues `entry` of `kernels` with the parameter block (and, for Hopper's attention kernel,
    /// the tensor maps of K and V and whether both were encoded).
    ///
    /// # Safety
    /// Every address in `params` must be a live device allocation of the size the kernel
    /// indexes, for as long as the kernel runs.
    unsafe fn launch(
        &self,
        kernels: &Self::Kernels,
        entry: Entry,
        dims: Dims,
        params: &KernelParams,
        maps: Option<(&[TensorMap; 2], i32)>,
    ) -> Result<(), Error>;
}

/// Queues `plan` on `runtime`: its metadata copied over (unless it travels in the parameter
/// block), the workspace (and the split counters) grown if the keys are split, the attention
/// kernel, then the merge where the attention kernel does not combine the splits itself.
///
/// # Safety
/// The plan's operand addresses must be live allocations of `runtime` of the sizes its shapes
/// and strides index (validated by `Problem` and the device tensors), until the work finishes.
pub(crate) unsafe fn launch<R: Runtime>(runtime: &R, plan: &Plan) -> Result<(), Error> {
    if plan.tiles == 0 {
        return Ok(());
    }
    let kernels = runtime.kernels(plan.variant)?;
    let metadata = plan.metadata_to_copy().map(|m| runtime.upload(bytemuck::cast_slice(m))).transpose()?;
    let status = if plan.plans_on_the_device() { Some(status_address(runtime)?) } else { None };
    let workspace = runtime.workspace().at_least(plan.workspace_bytes(), |bytes| runtime.alloc(bytes))?;
    let counters =
        runtime.split_counters().at_least(plan.split_counter_bytes(), |bytes| runtime.upload(&vec![0; bytes]))?;
    let params = plan.params(
        metadata.as_ref().map(|m| runtime.address(m)),
        workspace.buffer().map(|w| runtime.address(w)),
        counters.buffer().map(|c| runtime.address(c)),
        status,
    );
    let variant = plan.variant;
    if plan.plans_on_the_device() {
        let dims = Dims { grid: (1, 1, 1), threads: PLAN_THREADS, shared_bytes: 0 };
        // SAFETY: the caller's guarantee for the cu_seqlens buffers (batch + 1 entries each);
        // the workspace holds tile_start (batch + 1 entries) and the grid's tile table; the
        // flag is the device's.
        unsafe { runtime.launch(&kernels, Entry::PlanTiles, dims, &params, None)? };
    }
    // Paged keys and values are no one tensor a map could describe: they come by cp.async.
    let encoded = (variant.target == Target::Wgmma).then(|| {
        if variant.paged {
            None
        } else {
            runtime.tensor_maps(plan.key_value_shapes(), variant.f16)
        }
    });
    let maps = encoded.map(|maps| match maps {
        Some(maps) => (maps, 1),
        None => ([TensorMap::default(); 2], 0),
    });
    let dims =
        Dims { grid: plan.grid(), threads: variant.threads() as u32, shared_bytes: variant.shared_bytes() as u32 };
    // SAFETY: the caller's guarantee for the operands; the metadata, the workspace and the
    // split counters are allocations of this runtime sized by the plan, freed stream-ordered
    // after the kernels.
    unsafe { runtime.launch(&kernels, Entry::Attention, dims, &params, maps.as_ref().map(|(m, tma)| (m, *tma)))? };
    if plan.launches_merge() {
        let (grid, threads) = plan.merge_grid();
        let dims = Dims { grid, threads, shared_bytes: 0 };
        // SAFETY: as above; the merge reads the workspace the attention kernel wrote.
        unsafe { runtime.launch(&kernels, Entry::Merge, dims, &params, None)? };
    }
    drop(metadata);
    Ok(())
}

/// Threads of `va_plan_tiles`' one block (`VA_PLAN_THREADS`).
const PLAN_THREADS: u32 = 1024;

/// A device's flag for cu_seqlens on the device that break a rule: four zero bytes allocated
/// on first use, raised by `va_plan_tiles`, read and lowered by [`take_status`].
pub(crate) struct StatusFlag<B> {
    slot: Mutex<Option<B>>,
}

impl<B> StatusFlag<B> {
    pub fn new() -> Self {
        StatusFlag { slot: Mutex::new(None) }
    }
}

fn poisoned() -> Error {
    Error::Gpu("the status flag's lock was poisoned by a panic".into())
}

/// The device address of `runtime`'s status flag (allocated, lowered, on first use).
fn status_address<R: Runtime>(runtime: &R) -> Result<u64, Error> {
    let mut slot = runtime.status().slot.lock().map_err(|_| poisoned())?;
    if slot.is_none() {
        *slot = Some(runtime.upload(&[0u8; 4])?);
    }
    Ok(runtime.address(slot.as_ref().expect("set above")))
}

/// Whether the status flag was raised since the last look (waiting for the queued work), and
/// lowers it.
pub(crate) fn take_status<R: Runtime>(runtime: &R) -> Result<bool, Error> {
    let mut slot = runtime.status().slot.lock().map_err(|_| poisoned())?;
    let Some(flag) = slot.as_mut() else { return Ok(false) };
    let mut bytes = [0u8; 4];
    runtime.download(flag, &mut bytes)?;
    let raised = bytes != [0; 4];
    if raised {
        runtime.write(flag, &[0u8; 4])?;
    }
    Ok(raised)
}

/// Compiled kernels by variant, shared by a device's calls.
pub(crate) struct KernelCache<K> {
    compiled: Mutex<HashMap<Variant, Arc<K>>>,
}

impl<K> KernelCache<K> {
    pub fn new() -> Self {
        KernelCache { compiled: Mutex::new(HashMap::new()) }
    }

    /// The kernels of `variant`, from `compile` the first time.
    pub fn get_or_compile(
        &self,
        variant: Variant,
        compile: impl FnOnce() -> Result<K, Error>,
    ) -> Result<Arc<K>, Error> {
        let mut cache =
            self.compiled.lock().map_err(|_| Error::Gpu("the kernel cache was poisoned by a panic".into()))?;
        if let Some(k) = cache.get(&variant) {
            return Ok(k.clone());
        }
        let kernels = Arc::new(compile()?);
        cache.insert(variant, kernels.clone());
        Ok(kernels)
    }
}
