//! Compile checks of every kernel variant without a GPU, for CI (`tests/gpu_compile.rs`): NVRTC
//! for NVIDIA, the `hipcc` arguments for AMD.

use crate::gpu::plan::{Target, Variant};
use crate::gpu::source::{kernel_source, nvrtc_options};

/// The `hipcc` arguments CI uses to compile-check every AMD variant for `arch` (e.g. `gfx90a`),
/// one list per variant, to be followed by `-o OUTPUT`; the kernel file is compiled where it
/// stands (relative to the crate's root), so its header is found.
///
/// ```
/// let all = varlen_attn::internal::hipcc_check_arguments("gfx90a");
/// assert!(all[0].contains(&"--offload-arch=gfx90a".to_string()));
/// ```
pub fn hipcc_check_arguments(arch: &str) -> Vec<Vec<String>> {
    compile_check_variants(&[Target::Mfma])
        .iter()
        .map(|v| {
            let mut args = vec!["--genco".to_string(), format!("--offload-arch={arch}"), "-O3".to_string()];
            args.extend(v.defines());
            args.push("src/gpu/kernel/attention.hip".to_string());
            args
        })
        .collect()
}

/// The variants the compile check covers for `targets`: the seed's head dims, odd ones, the
/// extremes, D_v ≠ D, both element types, the compiled-in options (soft-cap, ALiBi, paged).
fn compile_check_variants(targets: &[Target]) -> Vec<Variant> {
    let mut all = Vec::new();
    for &target in targets {
        for (d, dv) in
            [(72, 72), (128, 128), (64, 64), (80, 80), (96, 96), (256, 256), (7, 7), (33, 65), (1, 1), (200, 40)]
        {
            for f16 in [false, true] {
                all.push(Variant::new(d, dv, f16, target));
            }
        }
        // The soft-cap code, compiled in only for calls that use it.
        all.push(Variant { softcap: true, ..Variant::new(72, 72, false, target) });
        all.push(Variant { softcap: true, ..Variant::new(128, 128, true, target) });
        // ALiBi's bias, likewise (with and without the soft-cap).
        all.push(Variant { alibi: true, ..Variant::new(72, 72, false, target) });
        all.push(Variant { alibi: true, softcap: true, ..Variant::new(128, 128, true, target) });
        // Hopper's 64-row tiles for small problems.
        if target == Target::Wgmma {
            for (d, dv, f16) in [(72, 72, false), (128, 128, true), (256, 256, false), (33, 65, false)] {
                all.push(Variant::new(d, dv, f16, target).with_one_warpgroup());
            }
            // 192-key tiles (narrow heads on long sequences) and 192-row ones (a switch).
            for (d, dv, f16) in [(72, 72, false), (64, 64, true), (96, 96, false)] {
                let wide_tiles = Variant { block_n: 192, ..Variant::new(d, dv, f16, target) }.with_hopper_stages();
                all.push(wide_tiles);
                all.push(Variant { softcap: true, ..wide_tiles });
            }
            for (d, dv, f16) in [(72, 72, false), (128, 128, true)] {
                all.push(Variant::new(d, dv, f16, target).with_three_warpgroups());
            }
        }
        // Batches whose units walk each query tile's heads.
        for (d, dv, f16) in [(72, 72, false), (64, 64, true)] {
            all.push(Variant { heads_inner: true, ..Variant::new(d, dv, f16, target) });
        }
        if target == Target::Wgmma {
            all.push(Variant { heads_inner: true, ..Variant::new(72, 72, false, target).with_three_warpgroups() });
        }
        // Paged keys and values (with ALiBi, and on Hopper's 64- and 192-row tiles).
        for (d, dv, f16) in [(72, 72, false), (128, 128, true), (33, 65, false)] {
            all.push(Variant { paged: true, ..Variant::new(d, dv, f16, target) });
        }
        all.push(Variant { paged: true, alibi: true, ..Variant::new(64, 64, false, target) });
        if target == Target::Wgmma {
            all.push(Variant { paged: true, ..Variant::new(128, 128, false, target).with_one_warpgroup() });
            all.push(Variant { paged: true, ..Variant::new(72, 72, false, target).with_three_warpgroups() });
        }
    }
    all
}

/// Compiles every kernel variant CI checks with NVRTC for compute capability `major.minor`,
/// without a GPU (only `libnvrtc` is needed); returns how many compiled.
///
/// ```no_run
/// // CI: LD_LIBRARY_PATH points at PyPI's nvidia-cuda-nvrtc wheel.
/// assert!(varlen_attn::internal::compile_check_nvidia(9, 0)? > 0);
/// # Ok::<(), varlen_attn::Error>(())
/// ```
///
/// # Errors
/// [`Error::NoDevice`](crate::Error::NoDevice) without NVRTC; [`Error::Gpu`](crate::Error::Gpu) with the compiler's log for the first
/// variant that fails.
pub fn compile_check_nvidia(major: i32, minor: i32) -> Result<usize, crate::Error> {
    if !crate::gpu::cuda_library_present("nvrtc") {
        return Err(crate::Error::NoDevice("NVRTC (libnvrtc.so.13) was not found".into()));
    }
    // Hopper builds both NVIDIA kernels (`VARLEN_ATTN_GPU_KERNEL=mma` selects the older one).
    let targets: &[Target] = if (major, minor) == (9, 0) { &[Target::Wgmma, Target::Mma] } else { &[Target::Mma] };
    let variants = compile_check_variants(targets);
    for (i, variant) in variants.iter().enumerate() {
        let options =
            cudarc::nvrtc::CompileOptions { options: nvrtc_options(variant, major, minor), ..Default::default() };
        let ptx = cudarc::nvrtc::compile_ptx_with_opts(kernel_source(), options)
            .map_err(|e| crate::Error::Gpu(format!("sm_{major}{minor}: {variant:?}: {e}")))?;
        // `VARLEN_ATTN_DUMP_PTX=folder` keeps every variant's PTX, so that a change meant to
        // leave the generated code alone can be checked by comparing two folders.
        if let Some(folder) = &crate::gpu::tuning::Tuning::get().dump_ptx {
            let path = folder.join(format!("sm{major}{minor}_{i:02}_{:?}.ptx", variant.target));
            std::fs::write(&path, ptx.to_src())
                .map_err(|e| crate::Error::Gpu(format!("could not write {}: {e}", path.display())))?;
        }
    }
    Ok(variants.len())
}
