//! The hot path allocates nothing: once the worker threads' scratch and the packing buffer have
//! grown to a problem's size, further calls of `forward_into` make no heap allocation at all
//! (the output is the caller's).

use half::bf16;
use ndarray::Array3;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use varlen_attn::{internal::workloads::SEED_SHAPES, Params};

/// Counts every allocation, on every thread.
struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn no_allocation_after_warm_up() {
    // A parallel-sized shape and a tiny one (which runs on the calling thread), each on every
    // CPU path of this machine.
    for index in [11, 20] {
        let shape = SEED_SHAPES[index];
        let [q, k, v] = shape.random_inputs::<bf16>(1);
        let cu = shape.cu_seqlens();
        let mut out = Array3::<bf16>::default((shape.tokens(), shape.num_heads, shape.head_dim));
        for isa in [varlen_attn::CpuIsa::Auto, varlen_attn::CpuIsa::Scalar] {
            let params = Params { cpu_isa: isa, backend: varlen_attn::Backend::Cpu, ..Params::default() };
            // Warm-up: thread pool, per-thread scratch, packing buffer: calls until three in a
            // row allocate nothing (at least 8, at most 64), so that every worker thread has
            // run an item even when the machine is busy and work stealing leaves one idle for
            // a while. A call that allocates every time never gets there, and fails below.
            let mut quiet = 0;
            for call in 0..64 {
                let before = ALLOCATIONS.load(Ordering::SeqCst);
                varlen_attn::forward_into(q.view(), k.view(), v.view(), &cu, &cu, &params, out.view_mut()).unwrap();
                quiet = if ALLOCATIONS.load(Ordering::SeqCst) == before { quiet + 1 } else { 0 };
                if call >= 8 && quiet >= 3 {
                    break;
                }
            }
            let before = ALLOCATIONS.load(Ordering::SeqCst);
            for _ in 0..5 {
                varlen_attn::forward_into(q.view(), k.view(), v.view(), &cu, &cu, &params, out.view_mut()).unwrap();
            }
            let allocations = ALLOCATIONS.load(Ordering::SeqCst) - before;
            assert_eq!(allocations, 0, "shape {index} {isa:?}: {allocations} allocations in 5 calls after warm-up");
        }
    }
}
