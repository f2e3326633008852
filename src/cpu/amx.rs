//! The x86-64 kernel for bf16 input on CPUs with AMX (Intel Sapphire Rapids and later): both
//! products run on the tile matrix unit, `tdpbf16ps`, 16×16 f32 outputs from 16×32 bf16 times
//! 32×16 bf16 per instruction (16 384 FLOP), with exact bf16 products and f32 accumulation.
//!
//! Rust has no stable AMX intrinsics or target features, so the tile instructions are written as
//! inline assembly; the operating system must also grant the process the tile state (Linux
//! `arch_prctl(ARCH_REQ_XCOMP_PERM)`), which [`available`] asks for once.
//!
//! Layouts (`u32` = a pair of bf16, the lower index in the low half):
//! - Q `[row][d padded to 32]` bf16 row-major: the A operand, 32 head_dim values per tile row;
//! - K `[strip of 16 keys][d/2 pairs][16]`: the B operand ("VNNI" pairs along head_dim);
//! - P `[row][KEY_BLOCK]` bf16: the A operand of the second product, 32 keys per tile row;
//! - V `[key pair][dv padded to 16]`: the B operand, two keys interleaved per column;
//! - the scores and the accumulator in f32, stored and loaded as 16×16 tiles.
//!
//! head_dim is padded to the tile depth of 32 (72 costs as 96 in the first product: the tile unit
//! takes the same time for a shallower tile) and head_dim_v to 16 columns (72 costs as 80).

use super::pack_bf16;
use super::score::ScoreMap;
use super::softmax::RowState;
use super::softmax_bf16;
use super::tile::{round_up, TileKernel};
use crate::element::{DType, Element};
use crate::layout::{Rows, SequenceRows};
use core::arch::asm;
use core::arch::x86_64::*;
use core::marker::PhantomData;
use core::ops::Range;
use std::sync::OnceLock;

/// Query rows per work item: four tile rows.
const QUERY_BLOCK: usize = 64;
/// Keys per block: four 32-key tile depths of the second product.
const KEY_BLOCK: usize = 128;
/// Bytes per tile row.
const TILE_BYTES: usize = 64;

/// The AMX kernel; only constructed for bf16 input where the CPU and the OS allow AMX.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AmxKernel<T> {
    simd: pulp::x86::V4,
    _element: PhantomData<T>,
}

impl<T: Element> AmxKernel<T> {
    /// The kernel, if `T` is bf16 and AMX is usable.
    pub fn try_new() -> Option<Self> {
        let simd = pulp::x86::V4::try_new()?;
        (T::DTYPE == DType::BF16 && available()).then_some(AmxKernel { simd, _element: PhantomData })
    }
}

/// Whether this CPU has AMX-BF16 (with the AVX-512 the softmax uses) and the OS lets this
/// process use the tile state. Asks the OS once.
pub(crate) fn available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| cpu_has_amx() && super::bf16dot::available() && request_tile_permission())
}

/// CPUID leaf 7: EDX bit 22 is AMX-BF16, bit 24 AMX-TILE.
fn cpu_has_amx() -> bool {
    let leaf7 = __cpuid_count(7, 0);
    leaf7.edx & (1 << 22) != 0 && leaf7.edx & (1 << 24) != 0
}

/// Linux: `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`; true when granted.
#[cfg(target_os = "linux")]
fn request_tile_permission() -> bool {
    const SYS_ARCH_PRCTL: i64 = 158;
    const ARCH_REQ_XCOMP_PERM: i64 = 0x1023;
    const XFEATURE_XTILEDATA: i64 = 18;
    let result: i64;
    // SAFETY: a plain system call with integer arguments; the kernel writes no memory of ours.
    // rcx and r11 are clobbered by `syscall`.
    unsafe {
        asm!("syscall", inlateout("rax") SYS_ARCH_PRCTL => result, in("rdi") ARCH_REQ_XCOMP_PERM,
             in("rsi") XFEATURE_XTILEDATA, lateout("rcx") _, lateout("r11") _, options(nostack));
    }
    result == 0
}

#[cfg(not(target_os = "linux"))]
fn request_tile_permission() -> bool {
    false
}

/// The tile configuration: palette 1, all eight tiles 16 rows × 64 bytes.
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

const CONFIG: TileConfig = {
    let mut bytes = [0u8; 64];
    bytes[0] = 1;
    let mut t = 0;
    while t < 8 {
        bytes[16 + 2 * t] = TILE_BYTES as u8;
        bytes[48 + t] = 16;
        t += 1;
    }
    TileConfig(bytes)
};

/// Loads the tile configuration; zeroes every tile.
///
/// # Safety
/// AMX must be usable ([`available`]).
#[inline(always)]
unsafe fn configure_tiles() {
    // SAFETY: the caller checked AMX; CONFIG is a valid 64-byte palette-1 configuration.
    unsafe { asm!("ldtilecfg [{}]", in(reg) &CONFIG, options(nostack, readonly)) };
}

/// Releases the tile state, so the OS need not save it on context switches.
///
/// # Safety
/// AMX must be usable.
#[inline(always)]
unsafe fn release_tiles() {
    // SAFETY: the caller checked AMX.
    unsafe { asm!("tilerelease", options(nostack, nomem)) };
}

/// `tileloadd tmmN, [ptr + stride * row]` for 16 rows of 64 bytes.
macro_rules! tile_load {
    ($tile:literal, $ptr:expr, $stride:expr) => {
        asm!(concat!("tileloadd tmm", $tile, ", [{p} + {s}*1]"), p = in(reg) $ptr, s = in(reg) $stride,
             options(nostack, readonly))
    };
}

/// `tilestored [ptr + stride * row], tmmN`.
macro_rules! tile_store {
    ($tile:literal, $ptr:expr, $stride:expr) => {
        asm!(concat!("tilestored [{p} + {s}*1], tmm", $tile), p = in(reg) $ptr, s = in(reg) $stride,
             options(nostack))
    };
}

/// `tdpbf16ps tmmC, tmmA, tmmB`: C += A·B.
macro_rules! tile_dot {
    ($c:literal, $a:literal, $b:literal) => {
        asm!(concat!("tdpbf16ps tmm", $c, ", tmm", $a, ", tmm", $b), options(nostack, nomem))
    };
}

/// `tilezero tmmN`.
macro_rules! tile_zero {
    ($tile:literal) => {
        asm!(concat!("tilezero tmm", $tile), options(nostack, nomem))
    };
}

/// One batch of tile dot products on four independent accumulators (no memory traffic), for
/// the peak microbenchmark; returns its FLOP. Requires [`available`].
pub(crate) fn peak_batch() -> f64 {
    const BATCH: usize = 4096;
    assert!(available());
    // SAFETY: AMX is usable (asserted); the tiles hold whatever bits they start with (zeroed),
    // no memory is touched besides the configuration.
    unsafe {
        configure_tiles();
        tile_zero!("4");
        tile_zero!("5");
        tile_zero!("6");
        tile_zero!("7");
        for _ in 0..BATCH {
            tile_dot!("0", "4", "6");
            tile_dot!("1", "4", "7");
            tile_dot!("2", "5", "6");
            tile_dot!("3", "5", "7");
        }
        release_tiles();
    }
    (BATCH * 4 * 16 * 16 * 32 * 2) as f64
}

impl<T: Element> TileKernel<T> for AmxKernel<T> {
    type Packed = u32;
    const QUERY_BLOCK: usize = QUERY_BLOCK;
    const KEY_BLOCK: usize = KEY_BLOCK;
    const STRIP: usize = 32;

    fn q_stride(d: usize) -> usize {
        round_up(d, 32) / 2
    }
    fn k_len(d: usize) -> usize {
        KEY_BLOCK * round_up(d, 32) / 2
    }
    fn v_len(dv: usize) -> usize {
        KEY_BLOCK / 2 * round_up(dv, 16)
    }
    fn o_len(dv: usize) -> usize {
        QUERY_BLOCK * round_up(dv, 16)
    }
    fn o_index(dv: usize, r: usize, j: usize) -> usize {
        r * round_up(dv, 16) + j
    }
    fn p_len() -> usize {
        QUERY_BLOCK * KEY_BLOCK / 2
    }

    fn pack_q(&self, q: &Rows<T>, tokens: Range<usize>, head: usize, dst: &mut [u32]) {
        let d = q.row(tokens.start, head).len();
        pack_bf16::pack_queries(q, tokens, head, round_up(d, 32), QUERY_BLOCK, dst);
    }

    fn pack_k(&self, k: &SequenceRows<T>, tokens: Range<usize>, dst: &mut [u32]) {
        let d = k.dims();
        // SAFETY: AMX implies AVX-512F/BW (`available()` checks them).
        unsafe { pack_bf16::pack_keys(k, tokens.clone(), round_up(d, 32) / 2, round_up(tokens.len(), 32), dst) };
    }

    fn pack_v(&self, v: &SequenceRows<T>, tokens: Range<usize>, dst: &mut [u32]) -> bool {
        let dv = v.dims();
        // SAFETY: AMX implies AVX-512F/BW (`available()` checks them).
        unsafe { pack_bf16::pack_values(v, tokens.clone(), round_up(dv, 16), round_up(tokens.len(), 32), dst) }
    }

    fn scores(&self, q: &[u32], k: &[u32], rows: usize, d: usize, keys: usize, s: &mut [f32]) {
        let depth = round_up(d, 32);
        let (chunks, pairs) = (depth / 32, depth / 2);
        let row_tiles = rows.div_ceil(16); // Q rows past `rows` are zero
        let strip_pairs = keys / 32;
        assert!(rows <= QUERY_BLOCK && keys <= KEY_BLOCK && keys.is_multiple_of(32));
        assert!(
            q.len() >= QUERY_BLOCK * pairs
                && k.len() >= 2 * strip_pairs * pairs * 16
                && s.len() >= QUERY_BLOCK * KEY_BLOCK
        );
        let (q_stride, s_stride) = (depth * 2, KEY_BLOCK * 4);
        // Each group is 16 rows × 32 keys in two accumulator tiles; groups alternate between
        // tiles 0-1 and 2-3, so a group's results are stored while the next group's products
        // run (a tile store waits for its products: issued back to back, it stalls them).
        macro_rules! products {
            ($c0:literal, $c1:literal, $a:expr, $b0:expr, $b1:expr) => {{
                tile_zero!($c0);
                tile_zero!($c1);
                for c in 0..chunks {
                    tile_load!("4", $a.add(c * TILE_BYTES), q_stride);
                    tile_load!("5", $b0.add(c * 16 * TILE_BYTES), TILE_BYTES);
                    tile_load!("6", $b1.add(c * 16 * TILE_BYTES), TILE_BYTES);
                    tile_dot!($c0, "4", "5");
                    tile_dot!($c1, "4", "6");
                }
            }};
        }
        macro_rules! store {
            ($c0:literal, $c1:literal, $dst:expr) => {{
                tile_store!($c0, $dst, s_stride);
                tile_store!($c1, $dst.add(64), s_stride);
            }};
        }
        // Stores the group whose products are still in their tiles, if any.
        macro_rules! store_pending {
            ($pending:expr) => {
                match $pending {
                    Some((p, true)) => store!("0", "1", p),
                    Some((p, false)) => store!("2", "3", p),
                    None => {}
                }
            };
        }
        // SAFETY: AMX is usable (this kernel exists only after `available()`). Every tile load
        // reads 16 rows of 64 bytes: Q rows rt*16.. of `depth` bf16 (row_tiles*16 <= QUERY_BLOCK
        // rows are packed), K panels of `pairs` rows of 64 bytes for strips < keys/16; every
        // store writes 16 rows of 64 bytes of s at rows < QUERY_BLOCK, columns < keys. The
        // asserts above bound all of these inside the slices.
        unsafe {
            configure_tiles();
            let mut previous: Option<(*mut u8, bool)> = None;
            let groups = (0..row_tiles).flat_map(|rt| (0..strip_pairs).map(move |sp| (rt, sp)));
            for (g, (rt, sp)) in groups.enumerate() {
                let a = q.as_ptr().cast::<u8>().add(rt * 16 * q_stride);
                let b0 = k.as_ptr().cast::<u8>().add(2 * sp * pairs * TILE_BYTES);
                let b1 = b0.add(pairs * TILE_BYTES);
                let dst = s.as_mut_ptr().cast::<u8>().add(rt * 16 * s_stride + sp * 32 * 4);
                let first_set = g % 2 == 0;
                if first_set {
                    products!("0", "1", a, b0, b1);
                } else {
                    products!("2", "3", a, b0, b1);
                }
                store_pending!(previous);
                previous = Some((dst, first_set));
            }
            store_pending!(previous);
            release_tiles();
        }
    }

    // Rows past `rows` up to the next tile row feed the second product: zeroed.
    softmax_bf16::bf16_pair_softmax!(KEY_BLOCK, |rows: usize| rows.next_multiple_of(16).min(QUERY_BLOCK));

    fn accumulate(
        &self,
        _s: &[f32],
        p_scratch: &[u32],
        v: &[u32],
        alpha: &[f32],
        rows: usize,
        keys: usize,
        dv: usize,
        o: &mut [f32],
    ) {
        let stride = round_up(dv, 16);
        let row_tiles = rows.div_ceil(16);
        let (chunks, columns) = (keys / 32, stride / 16);
        assert!(rows <= QUERY_BLOCK && keys <= KEY_BLOCK && keys.is_multiple_of(32));
        assert!(p_scratch.len() >= QUERY_BLOCK * KEY_BLOCK / 2);
        assert!(v.len() >= keys / 2 * stride && o.len() >= QUERY_BLOCK * stride && alpha.len() >= rows);
        // SAFETY: AMX implies AVX-512F (`available()` checks it); the asserts show the reads
        // and writes stay inside alpha and o.
        unsafe { rescale(alpha.as_ptr(), o.as_mut_ptr(), rows, stride) };
        let (p_stride, v_stride, o_stride) = (KEY_BLOCK * 2, stride * 4, stride * 4);
        // SAFETY: AMX is usable. A tiles read 16 rows of 64 bytes of the bf16 probabilities
        // (rows < row_tiles*16 <= QUERY_BLOCK, keys < `keys`), B tiles 16 rows (key pairs) of 64
        // bytes of V (pairs < keys/2, columns < stride), C tiles 16 rows of 64 bytes of o; all
        // inside the slices by the asserts above.
        unsafe {
            configure_tiles();
            for rt in 0..row_tiles {
                let a = p_scratch.as_ptr().cast::<u8>().add(rt * 16 * p_stride);
                // The probabilities of this row tile stay in tmm2..5, one per 32 keys.
                tile_load!("2", a, p_stride);
                if chunks > 1 {
                    tile_load!("3", a.add(TILE_BYTES), p_stride);
                }
                if chunks > 2 {
                    tile_load!("4", a.add(2 * TILE_BYTES), p_stride);
                }
                if chunks > 3 {
                    tile_load!("5", a.add(3 * TILE_BYTES), p_stride);
                }
                for col in (0..columns).step_by(2) {
                    let pair = col + 1 < columns;
                    let c0 = o.as_mut_ptr().cast::<u8>().add(rt * 16 * o_stride + col * 64);
                    let b = v.as_ptr().cast::<u8>().add(col * 64);
                    tile_load!("0", c0, o_stride);
                    if pair {
                        tile_load!("1", c0.add(64), o_stride);
                    }
                    macro_rules! depth {
                        ($chunk:literal, $a:literal) => {
                            let bc = b.add($chunk * 16 * v_stride);
                            tile_load!("6", bc, v_stride);
                            tile_dot!("0", $a, "6");
                            if pair {
                                tile_load!("7", bc.add(64), v_stride);
                                tile_dot!("1", $a, "7");
                            }
                        };
                    }
                    depth!(0, "2");
                    if chunks > 1 {
                        depth!(1, "3");
                    }
                    if chunks > 2 {
                        depth!(2, "4");
                    }
                    if chunks > 3 {
                        depth!(3, "5");
                    }
                    tile_store!("0", c0, o_stride);
                    if pair {
                        tile_store!("1", c0.add(64), o_stride);
                    }
                }
            }
            release_tiles();
        }
    }
}

const _: () = assert!(KEY_BLOCK <= 4 * 32 && KEY_BLOCK.is_multiple_of(32) && QUERY_BLOCK.is_multiple_of(32));

/// Rescales the accumulator rows by `alpha` (skipped where alpha is 1).
///
/// # Safety
/// AVX-512F present; `alpha` holds `rows` f32, `o` `rows × stride` f32; `stride` a multiple of
/// 16.
#[target_feature(enable = "avx512f")]
unsafe fn rescale(alpha: *const f32, o: *mut f32, rows: usize, stride: usize) {
    for r in 0..rows {
        // SAFETY: r < rows: inside alpha.
        let a = unsafe { alpha.add(r).read() };
        if a == 1.0 {
            continue;
        }
        let factor = _mm512_set1_ps(a);
        for c in (0..stride).step_by(16) {
            // SAFETY: row r < rows, columns c..c+16 <= stride: inside o.
            unsafe {
                let x = o.add(r * stride + c);
                _mm512_storeu_ps(x, _mm512_mul_ps(_mm512_loadu_ps(x), factor));
            }
        }
    }
}
