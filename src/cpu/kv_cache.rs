//! The buffer that holds one wave of packed keys and values, kept between calls so that a call
//! allocates nothing once the buffer has grown to the problem's size.

use super::workspace::Line;
use std::sync::Mutex;

/// Packed K/V blocks of a wave, their finiteness flags and the wave's block offsets.
#[derive(Default)]
pub(crate) struct KvCache {
    lines: Vec<Line>,
    finite: Vec<bool>,
    /// `offsets[w]..offsets[w + 1]`: the key blocks of the wave's `w`-th (sequence, kv head).
    pub offsets: Vec<usize>,
}

impl KvCache {
    /// `len` packed elements, `blocks` flags, and the offsets (contents unspecified; the
    /// packers overwrite every element they own).
    pub fn buffers<P: bytemuck::Pod>(&mut self, len: usize, blocks: usize) -> (&mut [P], &mut [bool], &[usize]) {
        let lines = (len * core::mem::size_of::<P>()).div_ceil(64);
        if self.lines.len() < lines {
            self.lines.resize(lines, Line::ZERO);
        }
        if self.finite.len() < blocks {
            self.finite.resize(blocks, false);
        }
        let packed = &mut bytemuck::cast_slice_mut::<Line, P>(&mut self.lines[..lines])[..len];
        (packed, &mut self.finite[..blocks], &self.offsets)
    }
}

static CACHE: Mutex<Option<KvCache>> = Mutex::new(None);

/// Runs `f` with the shared cache, or with a fresh one when another call is using it (or a
/// panic poisoned it). The cache is put back afterwards.
pub(crate) fn with_cache<R>(f: impl FnOnce(&mut KvCache) -> R) -> R {
    let taken = CACHE.lock().ok().and_then(|mut slot| slot.take());
    let mut cache = taken.unwrap_or_default();
    let result = f(&mut cache);
    if let Ok(mut slot) = CACHE.lock() {
        let keep = slot.as_ref().is_none_or(|other| other.lines.len() < cache.lines.len());
        if keep {
            *slot = Some(cache);
        }
    }
    result
}
