//! Unaligned whole-vector loads and stores for `pulp::Simd` (which has slices of vectors, not
//! pointers), for the kernels' packed panels.

use pulp::Simd;

/// One vector from `p` (no alignment needed).
///
/// # Safety
/// `p` must be valid for reading `S::F32_LANES` f32.
#[inline(always)]
pub(crate) unsafe fn load<S: Simd>(p: *const f32) -> S::f32s {
    // SAFETY: the caller's guarantee; `S::f32s` is plain data of exactly that many f32.
    unsafe { core::ptr::read_unaligned(p.cast::<S::f32s>()) }
}

/// Writes one vector to `p` (no alignment needed).
///
/// # Safety
/// `p` must be valid for writing `S::F32_LANES` f32.
#[inline(always)]
pub(crate) unsafe fn store<S: Simd>(p: *mut f32, x: S::f32s) {
    // SAFETY: the caller's guarantee.
    unsafe { core::ptr::write_unaligned(p.cast::<S::f32s>(), x) }
}
