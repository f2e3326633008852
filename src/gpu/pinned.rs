//! Page-locked host memory for the host-array call's copies (NVIDIA): a few fixed slots that
//! the copies to and from the device pass through, chunk by chunk, so that the host's packing
//! of one chunk overlaps the bus's transfer of the last one, and every transfer runs at the
//! page-locked rate instead of through the driver's own pageable staging. Kept between calls
//! (a fixed [`SLOTS`] × [`CHUNK_BYTES`]); `gpu::release_staging` drops the [`PinnedRing`].

use crate::error::Error;
use cudarc::driver::sys::{CUdeviceptr, CUevent_flags};
use cudarc::driver::{result, CudaEvent, CudaStream, PinnedHostSlice};
use std::ops::Range;
use std::sync::Arc;

/// Bytes of one slot: large against each chunk's few driver calls (microseconds), small
/// against the transfers the chunks pipeline.
pub(crate) const CHUNK_BYTES: usize = 16 << 20;

/// Slots in the ring: the host fills (or drains) one while the bus moves the others.
pub(crate) const SLOTS: usize = 3;

/// The ring's slots and, for each, the event recorded after its last transfer.
pub(crate) struct PinnedRing {
    slots: Vec<PinnedHostSlice<u8>>,
    done: Vec<CudaEvent>,
}

impl Drop for PinnedRing {
    fn drop(&mut self) {
        // No copy may still read or write a slot when its memory is freed.
        for done in &self.done {
            if let Err(e) = done.synchronize() {
                log::warn!("varlen-attn: waiting for a staging copy before freeing it: {e}");
            }
        }
    }
}

fn error(what: &'static str) -> impl Fn(cudarc::driver::DriverError) -> Error {
    move |e| Error::Gpu(format!("{what}: {e}"))
}

impl PinnedRing {
    pub fn new(stream: &Arc<CudaStream>) -> Result<PinnedRing, Error> {
        let context = stream.context();
        let mut slots = Vec::with_capacity(SLOTS);
        let mut done = Vec::with_capacity(SLOTS);
        for _ in 0..SLOTS {
            // SAFETY: the bytes are written (by `fill`, or by a copy from the device) before they
            // are read. Flags 0: cached memory, which the host also reads back fast (unlike
            // write-combined memory).
            slots.push(
                unsafe { context.alloc_pinned_with_flags::<u8>(CHUNK_BYTES, 0) }
                    .map_err(error("allocating page-locked host memory"))?,
            );
            done.push(
                context.new_event(Some(CUevent_flags::CU_EVENT_DISABLE_TIMING)).map_err(error("creating an event"))?,
            );
        }
        Ok(PinnedRing { slots, done })
    }

    /// Copies `len` bytes to device memory at `dst`, queued on `stream`: `fill(range, chunk)`
    /// writes the bytes `range` into `chunk`. Returns once the last chunk is queued (the bytes
    /// are in page-locked memory, which later work on `stream` waits for).
    ///
    /// # Safety
    /// `dst` must address `len` bytes of device memory of `stream`'s context that stay
    /// allocated until the copies end.
    pub unsafe fn copy_in(
        &mut self,
        stream: &CudaStream,
        dst: CUdeviceptr,
        len: usize,
        fill: &mut dyn FnMut(Range<usize>, &mut [u8]),
    ) -> Result<(), Error> {
        for (i, start) in (0..len).step_by(CHUNK_BYTES).enumerate() {
            let (slot, n) = (i % SLOTS, CHUNK_BYTES.min(len - start));
            // The slot's last copy must have left before it is refilled.
            self.done[slot].synchronize().map_err(error("waiting for a copy"))?;
            let host = &mut self.slots[slot].as_mut_slice().map_err(error("reading page-locked memory"))?[..n];
            fill(start..start + n, host);
            // SAFETY: the caller's guarantee for `dst + start .. + n`; `host` is page-locked and is
            // not written again before `done[slot]`, recorded after this copy, has passed.
            unsafe { result::memcpy_htod_async(dst + start as u64, host, stream.cu_stream()) }
                .map_err(error("copying to the device"))?;
            self.done[slot].record(stream).map_err(error("recording an event"))?;
        }
        Ok(())
    }

    /// Copies `len` bytes of device memory at `src` out, after the work queued on `stream`:
    /// `drain(range, chunk)` receives the bytes `range`, in order, each chunk once the bus has
    /// brought it while the next ones are in flight.
    ///
    /// # Safety
    /// `src` must address `len` bytes of device memory of `stream`'s context that stay
    /// allocated until this returns.
    pub unsafe fn copy_out(
        &mut self,
        stream: &CudaStream,
        src: CUdeviceptr,
        len: usize,
        drain: &mut dyn FnMut(Range<usize>, &[u8]),
    ) -> Result<(), Error> {
        let chunks: Vec<usize> = (0..len).step_by(CHUNK_BYTES).collect();
        let queue = |ring: &mut PinnedRing, i: usize| -> Result<(), Error> {
            let (slot, start) = (i % SLOTS, chunks[i]);
            let n = CHUNK_BYTES.min(len - start);
            ring.done[slot].synchronize().map_err(error("waiting for a copy"))?;
            let host = &mut ring.slots[slot].as_mut_slice().map_err(error("reading page-locked memory"))?[..n];
            // SAFETY: the caller's guarantee for `src + start .. + n`; the slot is not read before
            // `done[slot]`, recorded after this copy, has passed.
            unsafe { result::memcpy_dtoh_async(host, src + start as u64, stream.cu_stream()) }
                .map_err(error("copying from the device"))?;
            ring.done[slot].record(stream).map_err(error("recording an event"))
        };
        for i in 0..chunks.len().min(SLOTS) {
            queue(self, i)?;
        }
        for i in 0..chunks.len() {
            let (slot, start) = (i % SLOTS, chunks[i]);
            let n = CHUNK_BYTES.min(len - start);
            self.done[slot].synchronize().map_err(error("waiting for a copy"))?;
            drain(start..start + n, &self.slots[slot].as_slice().map_err(error("reading page-locked memory"))?[..n]);
            if i + SLOTS < chunks.len() {
                queue(self, i + SLOTS)?;
            }
        }
        Ok(())
    }
}
