//! The kernel's one source, assembled for the run-time compilers (NVRTC on NVIDIA, hipRTC on
//! AMD): the portability header is inlined, since neither compiler sees our files.

use super::plan::{Target, Variant};

/// The kernel's files: the entry point and the headers it includes.
const FILES: [(&str, &str); 14] = [
    ("attention.hip", include_str!("kernel/attention.hip")),
    ("portability.h", include_str!("kernel/portability.h")),
    ("params.h", include_str!("kernel/params.h")),
    ("load.h", include_str!("kernel/load.h")),
    ("mask.h", include_str!("kernel/mask.h")),
    ("score.h", include_str!("kernel/score.h")),
    ("scheduling.h", include_str!("kernel/scheduling.h")),
    ("combine.h", include_str!("kernel/combine.h")),
    ("fragments.h", include_str!("kernel/fragments.h")),
    ("tile_mma.h", include_str!("kernel/tile_mma.h")),
    ("tile_wgmma.h", include_str!("kernel/tile_wgmma.h")),
    ("wgmma.h", include_str!("kernel/wgmma.h")),
    ("barriers.h", include_str!("kernel/barriers.h")),
    ("tile_mfma.h", include_str!("kernel/tile_mfma.h")),
];

/// The HIP C++ source with its headers inlined (each `#include "name.h"` line replaced by the
/// file, recursively; every header is `#pragma once`, and each is included once).
pub(crate) fn kernel_source() -> String {
    fn inline(text: &str, out: &mut String) {
        for line in text.lines() {
            let header = line.strip_prefix("#include \"").and_then(|rest| rest.strip_suffix('"'));
            match header.and_then(|name| FILES.iter().find(|(file, _)| *file == name)) {
                Some((_, contents)) => inline(contents, out),
                None => {
                    out.push_str(line);
                    out.push('\n');
                }
            }
        }
    }
    let mut source = String::new();
    inline(FILES[0].1, &mut source);
    source
}

/// NVRTC options for `variant` on compute capability `major.minor`: `sm_90a` on Hopper (so
/// the architecture-specific instructions are allowed), `sm_XY` elsewhere.
pub(crate) fn nvrtc_options(variant: &Variant, major: i32, minor: i32) -> Vec<String> {
    let suffix = if (major, minor) == (9, 0) { "a" } else { "" };
    let mut options = vec![format!("--gpu-architecture=sm_{major}{minor}{suffix}"), "--std=c++17".to_string()];
    options.extend(variant.defines());
    options
}

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

/// hipRTC options for `variant` on the AMD architecture `arch` (e.g. `gfx90a`).
pub(crate) fn hiprtc_options(variant: &Variant, arch: &str) -> Vec<String> {
    let mut options = vec![format!("--offload-arch={arch}"), "-O3".to_string(), "-std=c++17".to_string()];
    options.extend(variant.defines());
    options
}

/// The variants the compile check covers for `targets`: the seed's head dims, odd ones, the
/// extremes, D_v ≠ D, both element types.
pub(crate) fn compile_check_variants(targets: &[Target]) -> Vec<Variant> {
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
    // SAFETY: asks the dynamic loader whether the library can be opened; nothing else.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
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
        if let Some(folder) = &super::tuning::Tuning::get().dump_ptx {
            let path = folder.join(format!("sm{major}{minor}_{i:02}_{:?}.ptx", variant.target));
            std::fs::write(&path, ptx.to_src())
                .map_err(|e| crate::Error::Gpu(format!("could not write {}: {e}", path.display())))?;
        }
    }
    Ok(variants.len())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_source_has_every_header_inlined() {
        let source = super::kernel_source();
        assert!(!source.contains("#include \""), "a local header was left as an include");
        for name in ["va_attention_wgmma", "va_attention_tile_mma", "va_attention_tile_mfma", "va_copy16"] {
            assert!(source.contains(name), "{name} is missing");
        }
    }
}
