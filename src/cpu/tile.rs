//! The contract between the blocked loop (`driver.rs`) and an instruction set's kernel: packing
//! and the two small matrix products. Everything else (masking, the online softmax, the final
//! normalisation) is shared.
//!
//! Shapes, for a block of `rows` (at most `QUERY_BLOCK`) query rows and up to `KEY_BLOCK` keys:
//! - `scores`: `S[r][j] = Σ_d Q[r][d] K[j][d]` (unscaled), for `keys` columns (a multiple of
//!   [`TileKernel::STRIP`]), in the kernel's own layout (row-major with row stride `KEY_BLOCK`,
//!   or key-major for the portable kernel), which only its `softmax`, `probability` and
//!   `accumulate` read;
//! - `softmax`: the online softmax over the block (shared code in `softmax.rs`), leaving the
//!   probabilities where `accumulate` wants them;
//! - `accumulate`: `O[r][:] = alpha[r] · O[r][:] + Σ_j P[r][j] V[j][:]`.
//!
//! K and V are packed once per call, block by block (`pack_k`, `pack_v`), and shared by every
//! query block that reads them. The packers read them through `SequenceRows` alone (key `j` of
//! a sequence), the one place that knows where a key lives.
//!
//! Packed buffers come from the caller's workspace, sized by the `*_len` functions; packers
//! fill every element they own (padding with zeros), so stale workspace contents never leak.

use super::score::ScoreMap;
use super::softmax::RowState;
use crate::element::Element;
use crate::layout::{Rows, SequenceRows};
use core::ops::Range;

/// One instruction set's packing and matrix products.
pub(crate) trait TileKernel<T: Element>: Copy + Send + Sync {
    /// Element of the packed operands.
    type Packed: bytemuck::Pod + Send + Sync;

    /// Query rows per work item.
    const QUERY_BLOCK: usize;
    /// Keys per block of the streaming loop (and the row stride of the score tile).
    const KEY_BLOCK: usize;
    /// Scores are computed for whole strips of this many keys (padding keys score 0 and are
    /// masked by the caller).
    const STRIP: usize;

    /// Packed elements per row of Q (head_dim `d`).
    fn q_stride(d: usize) -> usize;
    /// Packed elements of one K block.
    fn k_len(d: usize) -> usize;
    /// Packed elements of one V block.
    fn v_len(dv: usize) -> usize;
    /// `f32`s of the output accumulator of `QUERY_BLOCK` rows (head_dim_v `dv`).
    fn o_len(dv: usize) -> usize;
    /// Where the accumulator keeps row `r`, column `j`.
    fn o_index(dv: usize, r: usize, j: usize) -> usize;
    /// Packed elements of the probability tile of `QUERY_BLOCK` rows.
    fn p_len() -> usize;

    /// Packs Q rows `tokens` of head `head` (row `r` of the block at `r * q_stride`).
    fn pack_q(&self, q: &Rows<T>, tokens: Range<usize>, head: usize, dst: &mut [Self::Packed]);
    /// Packs the sequence's keys `keys` (at most `KEY_BLOCK`), zero-padded to a whole strip.
    fn pack_k(&self, k: &SequenceRows<T>, keys: Range<usize>, dst: &mut [Self::Packed]);
    /// Packs the sequence's values `keys`, zero-padded to a whole strip. Returns whether every
    /// value is finite.
    fn pack_v(&self, v: &SequenceRows<T>, keys: Range<usize>, dst: &mut [Self::Packed]) -> bool;
    /// Writes raw scores for `rows` rows and `keys` key columns into `s` (`QUERY_BLOCK ×
    /// KEY_BLOCK` f32, in the kernel's layout).
    fn scores(&self, q: &[Self::Packed], k: &[Self::Packed], rows: usize, d: usize, keys: usize, s: &mut [f32]);
    /// The online softmax of one block (see `softmax::update` for the contract): reads the
    /// scores `s`, may overwrite them, and leaves the probabilities
    /// in `s` or `p`, wherever [`TileKernel::accumulate`] and [`TileKernel::probability`] read
    /// them.
    #[allow(clippy::too_many_arguments)]
    fn softmax(
        &self,
        s: &mut [f32],
        p: &mut [Self::Packed],
        rows: usize,
        keys: usize,
        map: ScoreMap,
        visible: &dyn Fn(usize) -> Option<Range<usize>>,
        state: &mut RowState<'_>,
    );
    /// The probability of row `r`, key `j` after [`TileKernel::softmax`].
    fn probability(&self, s: &[f32], p: &[Self::Packed], r: usize, j: usize) -> f32;
    /// Rescales and accumulates `P·V` into `o` (laid out as `o_index` says), with the
    /// probabilities as [`TileKernel::softmax`] left them. `alpha` and the row state hold
    /// `QUERY_BLOCK` rows, those past `rows` unused by the driver.
    #[allow(clippy::too_many_arguments)]
    fn accumulate(
        &self,
        s: &[f32],
        p: &[Self::Packed],
        v: &[Self::Packed],
        alpha: &[f32],
        rows: usize,
        keys: usize,
        dv: usize,
        o: &mut [f32],
    );
}

/// `x` rounded up to a multiple of `m`.
#[inline]
pub(crate) fn round_up(x: usize, m: usize) -> usize {
    x.div_ceil(m) * m
}
