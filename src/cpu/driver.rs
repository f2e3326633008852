//! The blocked loop of one work item (FlashAttention's tiling on the CPU): pack a block of query
//! rows once, stream the (already packed) key/value blocks through the kernel's two products and
//! the online softmax, normalise, write the rows out.

use super::score::{AlibiBlock, ScoreMap};
use super::softmax::RowState;
use super::tile::{round_up, TileKernel};
use super::workspace::Carver;
use crate::element::Element;
use crate::layout::{KvRows, LseMut, Rows, RowsMut, SequenceRows};
use crate::problem::{Problem, Sequence};
use core::ops::Range;

/// The tensors of one call, shared by its work items.
#[derive(Clone, Copy)]
pub(crate) struct Io<'a, T> {
    pub q: Rows<'a, T>,
    pub k: KvRows<'a, T>,
    pub v: KvRows<'a, T>,
    pub out: RowsMut<'a, T>,
    pub lse: Option<LseMut<'a>>,
}

/// One work item: a block of query rows of one sequence and one head.
#[derive(Clone, Debug)]
pub(crate) struct WorkItem {
    pub sequence: Sequence,
    pub head: usize,
    /// Rows within the sequence.
    pub rows: Range<usize>,
}

/// The packed key/value blocks of one (sequence, kv head): block `i` holds keys
/// `i * KEY_BLOCK..` of the sequence, K first, then V.
pub(crate) struct PackedKv<'a, P> {
    pub blocks: &'a [P],
    /// Whether each block's values are all finite.
    pub finite: &'a [bool],
    pub k_len: usize,
    pub slot: usize,
}

impl<P> PackedKv<'_, P> {
    fn block(&self, i: usize) -> (&[P], &[P], bool) {
        let slot = &self.blocks[i * self.slot..(i + 1) * self.slot];
        let (k, v) = slot.split_at(self.k_len);
        (k, v, self.finite[i])
    }
}

/// Every index of `blocks` once: from `first` (clamped into them) down, then up from past it.
fn outward_from(blocks: Range<usize>, first: usize) -> impl Iterator<Item = usize> {
    let first = first.clamp(blocks.start, blocks.end.max(blocks.start + 1) - 1);
    let down = if blocks.is_empty() { first..first } else { blocks.start..first + 1 };
    down.rev().chain(first + 1..blocks.end)
}

/// Workspace one work item needs (in 64-byte lines), for [`attend`].
pub(crate) fn workspace_lines<T: Element, K: TileKernel<T>>(d: usize, dv: usize) -> usize {
    let packed = core::mem::size_of::<K::Packed>();
    let f32s = core::mem::size_of::<f32>();
    let lines = |bytes: usize| bytes.div_ceil(64);
    lines(K::QUERY_BLOCK * K::q_stride(d) * packed)
        + lines(K::p_len() * packed)
        + lines(K::QUERY_BLOCK * K::KEY_BLOCK * f32s)
        + lines(K::o_len(dv) * f32s)
        + 3 * lines(K::QUERY_BLOCK * f32s)
}

/// Computes the output rows (and LSE) of `item` and writes them.
///
/// # Safety
/// No other thread may access the output rows (or LSE entries) of `item` during the call.
#[inline(always)]
pub(crate) unsafe fn attend<T: Element, K: TileKernel<T>>(
    kernel: K,
    problem: &Problem,
    io: &Io<T>,
    item: &WorkItem,
    kv: &PackedKv<K::Packed>,
    workspace: &mut Carver,
) {
    let (d, dv) = (problem.head_dim, problem.head_dim_v);
    let seq = item.sequence;
    let (lq, lk) = (seq.q_len, seq.k_len);
    let kv_head = item.head / problem.group_size();
    let rows = item.rows.len();
    debug_assert!(rows <= K::QUERY_BLOCK);

    let q = workspace.take::<K::Packed>(K::QUERY_BLOCK * K::q_stride(d));
    let p = workspace.take::<K::Packed>(K::p_len());
    let scores = workspace.take::<f32>(K::QUERY_BLOCK * K::KEY_BLOCK);
    let o = workspace.take::<f32>(K::o_len(dv));
    // The row state of the whole block: kernels that work on whole vectors of rows may use
    // the rows past `rows`.
    let max = workspace.take::<f32>(K::QUERY_BLOCK);
    let sum = workspace.take::<f32>(K::QUERY_BLOCK);
    let alpha = workspace.take::<f32>(K::QUERY_BLOCK);
    max.fill(f32::NEG_INFINITY);
    sum.fill(0.0);
    o.fill(0.0);

    let q_tokens = seq.q_start + item.rows.start..seq.q_start + item.rows.end;
    kernel.pack_q(&io.q, q_tokens.clone(), item.head, q);
    let slope = problem.alibi_slope(seq.index, item.head);
    let diagonal0 = (item.rows.start + lk) as i64 - lq as i64;
    let mask = problem.mask;
    let keys = mask.visible_keys_of_block(item.rows.clone(), lq, lk);
    let blocks = if keys.is_empty() { 0..0 } else { keys.start / K::KEY_BLOCK..keys.end.div_ceil(K::KEY_BLOCK) };

    let values = SequenceRows::new(&io.v, seq.index, seq.k_start, kv_head);
    // ALiBi's bias peaks at each row's diagonal: from the block of the middle row's diagonal
    // outward, the first block sets nearly every row's max and later ones rarely move it (no
    // max reduction, no rescale). Any order gives the same softmax.
    let first = slope.map_or(blocks.start, |_| (diagonal0.max(0) as usize + rows / 2) / K::KEY_BLOCK);
    for index in outward_from(blocks, first) {
        let block = index * K::KEY_BLOCK..((index + 1) * K::KEY_BLOCK).min(lk);
        let width = round_up(block.len(), K::STRIP);
        let (k, v, v_finite) = kv.block(index);
        kernel.scores(q, k, rows, d, width, scores);

        let unmasked = block.len() == width && mask.block_is_unmasked(item.rows.clone(), block.clone(), lq, lk);
        let visible = |r: usize| {
            if unmasked {
                return None;
            }
            let seen = mask.visible_keys(item.rows.start + r, lq, lk);
            let clip = |j: usize| j.clamp(block.start, block.end) - block.start;
            Some(clip(seen.start)..clip(seen.end))
        };
        let alibi = slope.map(|slope| AlibiBlock { slope, diagonal0, key0: block.start as i64 });
        let map = ScoreMap { scale: problem.scale, softcap: problem.softcap, alibi };
        let mut state = RowState { max, sum, alpha };
        kernel.softmax(scores, p, rows, width, map, &visible, &mut state);

        if v_finite {
            kernel.accumulate(scores, p, v, alpha, rows, width, dv, o);
        } else {
            // 0 · inf is NaN: a non-finite value must reach only the rows that see its key, so
            // this block skips the keys each row does not see. Rare, so plain scalar code.
            for (r, &a) in alpha[..rows].iter().enumerate() {
                let at = |c: usize| K::o_index(dv, r, c);
                (0..dv).for_each(|c| o[at(c)] *= a);
                for j in visible(r).unwrap_or(0..block.len()) {
                    let weight = kernel.probability(scores, p, r, j);
                    let value = values.row(block.start + j);
                    for (c, &vv) in value.iter().enumerate() {
                        o[at(c)] += weight * vv.to_f32();
                    }
                }
            }
        }
    }

    // A sink joins each row's max and denominator as one more score, with no value.
    let sink = problem.sink(item.head).map(|s| s * core::f32::consts::LOG2_E);
    for r in 0..rows {
        let token = q_tokens.start + r;
        let (m, l, o_factor) = match sink {
            None => (max[r], sum[r], 1.0),
            Some(sink) => {
                let m = max[r];
                let with_sink = if m.is_nan() { m } else { m.max(sink) };
                let alpha = (m - with_sink).exp2();
                (with_sink, sum[r] * alpha + (sink - with_sink).exp2(), alpha)
            }
        };
        // A row that saw no key (or only scores of -inf) has l == 0: output 0, LSE -inf. One
        // reciprocal per row, not a division per element (a fifth of a 64-token sequence's
        // time went to the divisions).
        let seen = l != 0.0;
        let inv = o_factor / l;
        let value = |j: usize| if seen { o[K::o_index(dv, r, j)] * inv } else { 0.0 };
        // SAFETY: the caller guarantees this item's rows are ours alone.
        unsafe { io.out.write_row(token, item.head, |j| T::from_f32(value(j))) };
        if let Some(lse) = &io.lse {
            let value = if seen { m * core::f32::consts::LN_2 + l.ln() } else { f32::NEG_INFINITY };
            // SAFETY: as above.
            unsafe { lse.write(item.head, token, value) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::outward_from;

    #[test]
    fn outward_order_visits_every_block_once_from_the_first() {
        let order = |blocks: core::ops::Range<usize>, first| outward_from(blocks, first).collect::<Vec<_>>();
        assert_eq!(order(2..7, 4), [4, 3, 2, 5, 6]);
        assert_eq!(order(2..7, 0), [2, 3, 4, 5, 6]);
        assert_eq!(order(2..7, 9), [6, 5, 4, 3, 2]);
        assert_eq!(order(3..3, 5), Vec::<usize>::new());
    }
}
