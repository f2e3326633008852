//! Tensor maps for Hopper's tensor memory accelerator (TMA): how the copying warpgroup's bulk
//! copies see K and V. Each map describes one `[tokens, heads, dims]` tensor as a 3-D array
//! (dims fastest) read in boxes of 64 columns × 1 head × `rows` tokens with 128-byte swizzle,
//! exactly one slab of the kernel's shared-memory tile (`VaCoreTile` in `tile_wgmma.h`).
//!
//! This file holds the geometry and the rules the driver checks; `cuda.rs` asks the driver to
//! encode it. A tensor TMA cannot address (unaligned base or strides) is copied by cp.async.

/// A `CUtensorMap` as the driver encodes it: 128 opaque bytes, 64-byte aligned (the kernel's
/// `VaTensorMap`).
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct TensorMap(pub [u64; 16]);

/// Columns per box: one 128-byte row of 16-bit elements, the width of the 128-byte swizzle.
pub(crate) const BOX_COLUMNS: usize = 64;

/// One `[tokens, heads, dims]` tensor of 16-bit elements in device memory, with element strides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TensorMapShape {
    pub address: u64,
    pub tokens: usize,
    pub heads: usize,
    pub dims: usize,
    pub token_stride: usize,
    pub head_stride: usize,
    /// Tokens per box (the kernel's key tile).
    pub rows: usize,
}

/// The arguments of `cuTensorMapEncodeTiled` for a shape, dims first: sizes in elements,
/// strides of the outer two dimensions in bytes, the box in elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TiledArguments {
    pub global_dims: [u64; 3],
    pub global_strides: [u64; 2],
    pub box_dims: [u32; 3],
}

impl TensorMapShape {
    /// The encoding arguments, or `None` where the tensor memory accelerator cannot address the
    /// tensor: the base and both strides must be multiples of 16 bytes, each stride must cover
    /// the dimension inside it (heads within a token, dims within a head), the sizes must fit
    /// the driver's 32-bit limits and the box its 256-element one.
    pub fn arguments(&self) -> Option<TiledArguments> {
        const ELEMENT: u64 = 2;
        let (token_bytes, head_bytes) = (self.token_stride as u64 * ELEMENT, self.head_stride as u64 * ELEMENT);
        let aligned = [self.address, token_bytes, head_bytes].iter().all(|b| b.is_multiple_of(16));
        let nested = self.head_stride >= self.dims && self.token_stride >= self.heads * self.head_stride;
        let sized = [self.tokens, self.heads, self.dims].iter().all(|&n| n > 0 && n <= u32::MAX as usize)
            && token_bytes < 1 << 40
            && (1..=256).contains(&self.rows);
        (aligned && nested && sized).then_some(TiledArguments {
            global_dims: [self.dims as u64, self.heads as u64, self.tokens as u64],
            global_strides: [head_bytes, token_bytes],
            box_dims: [BOX_COLUMNS as u32, 1, self.rows as u32],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn packed(tokens: usize, heads: usize, dims: usize) -> TensorMapShape {
        TensorMapShape {
            address: 1 << 20,
            tokens,
            heads,
            dims,
            token_stride: heads * dims,
            head_stride: dims,
            rows: 128,
        }
    }

    #[test]
    fn a_packed_seed_tensor_is_one_box_per_slab() {
        let a = packed(65556, 16, 72).arguments().unwrap();
        assert_eq!(a.global_dims, [72, 16, 65556]);
        assert_eq!(a.global_strides, [144, 16 * 144]);
        assert_eq!(a.box_dims, [64, 1, 128]);
        assert_eq!(core::mem::size_of::<TensorMap>(), 128);
        assert_eq!(core::mem::align_of::<TensorMap>(), 64);
    }

    #[test]
    fn what_the_accelerator_cannot_address_is_refused() {
        // head_dim 100: a head is 200 bytes, not a multiple of 16.
        assert_eq!(packed(10, 4, 100).arguments(), None);
        assert_eq!(TensorMapShape { address: (1 << 20) + 8, ..packed(10, 4, 64) }.arguments(), None);
        assert_eq!(packed(0, 4, 64).arguments(), None);
        // Heads that overlap, or tokens inside a head.
        assert_eq!(TensorMapShape { head_stride: 32, ..packed(10, 4, 64) }.arguments(), None);
        assert_eq!(TensorMapShape { token_stride: 64, ..packed(10, 4, 64) }.arguments(), None);
        assert_eq!(TensorMapShape { rows: 512, ..packed(10, 4, 64) }.arguments(), None);
        // A strided view (every other head of a larger tensor) is fine.
        assert!(TensorMapShape { token_stride: 8 * 128, head_stride: 128, ..packed(10, 4, 64) }.arguments().is_some());
    }
}
