//! Which keys a query row sees: causal and sliding-window masks, bottom-right aligned.

use core::ops::Range;

/// A validated causal/sliding-window mask.
///
/// Query row `i` of a sequence with `lq` queries and `lk` keys sees key `j` iff
/// `i + lk - lq - left <= j <= i + lk - lq + right` (an absent bound is unbounded). Since both
/// bounds grow with `i`, every row sees one contiguous range and the ranges of consecutive rows
/// never leave gaps: the rows of a block together see one contiguous range too.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Mask {
    pub left: Option<usize>,
    pub right: Option<usize>,
}

impl Mask {
    /// True when every row sees every key.
    pub fn is_full(&self) -> bool {
        self.left.is_none() && self.right.is_none()
    }

    /// The keys row `row` sees, clamped to `0..lk`; an empty range (`start == end`) when none.
    #[inline]
    pub fn visible_keys(&self, row: usize, lq: usize, lk: usize) -> Range<usize> {
        // i64 holds every value here: token counts come from i32 cu_seqlens and window bounds
        // are clamped to lq + lk (no wider window changes anything) before they are added.
        let lk_i = lk as i64;
        let diagonal = row as i64 + lk_i - lq as i64;
        let clamp = |x: i64| x.clamp(0, lk_i) as usize;
        let reach = lq + lk;
        let start = match self.left {
            Some(left) => clamp(diagonal - left.min(reach) as i64),
            None => 0,
        };
        let end = match self.right {
            Some(right) => clamp(diagonal + right.min(reach) as i64 + 1),
            None => lk,
        };
        start..end.max(start)
    }

    /// The keys seen by any of the rows `rows` (contiguous, see the type's docs).
    pub fn visible_keys_of_block(&self, rows: Range<usize>, lq: usize, lk: usize) -> Range<usize> {
        if rows.is_empty() {
            return 0..0;
        }
        let first = self.visible_keys(rows.start, lq, lk);
        let last = self.visible_keys(rows.end - 1, lq, lk);
        first.start..last.end.max(first.start)
    }

    /// True when every row of `rows` sees every key of `keys`: no masking is needed inside.
    pub fn block_is_unmasked(&self, rows: Range<usize>, keys: Range<usize>, lq: usize, lk: usize) -> bool {
        if self.is_full() {
            return true;
        }
        let first = self.visible_keys(rows.start, lq, lk);
        let last = self.visible_keys(rows.end - 1, lq, lk);
        last.start <= keys.start && first.end >= keys.end
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn brute(mask: &Mask, i: usize, j: usize, lq: usize, lk: usize) -> bool {
        let d = i as i64 + lk as i64 - lq as i64;
        let j = j as i64;
        mask.left.is_none_or(|l| j >= d - l as i64) && mask.right.is_none_or(|r| j <= d + r as i64)
    }

    #[test]
    fn ranges_match_the_definition() {
        let bounds = [None, Some(0), Some(1), Some(3), Some(100)];
        for left in bounds {
            for right in bounds {
                let mask = Mask { left, right };
                for lq in 0..7 {
                    for lk in 0..7 {
                        for i in 0..lq {
                            let range = mask.visible_keys(i, lq, lk);
                            for j in 0..lk {
                                assert_eq!(
                                    range.contains(&j),
                                    brute(&mask, i, j, lq, lk),
                                    "{mask:?} i={i} j={j} lq={lq} lk={lk}"
                                );
                            }
                        }
                        if lq > 0 {
                            let all = mask.visible_keys_of_block(0..lq, lq, lk);
                            for j in 0..lk {
                                let any = (0..lq).any(|i| brute(&mask, i, j, lq, lk));
                                assert_eq!(all.contains(&j), any);
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn huge_windows_do_not_overflow() {
        let mask = Mask { left: Some(usize::MAX), right: Some(usize::MAX) };
        assert_eq!(mask.visible_keys(3, 5, 9), 0..9);
    }
}
