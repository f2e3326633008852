//! The kernel's one source, assembled for the run-time compilers (NVRTC on NVIDIA, hipRTC on
//! AMD): the portability header is inlined, since neither compiler sees our files.

use super::plan::Variant;

/// The kernel's files: the entry point and the headers it includes.
const FILES: [(&str, &str); 16] = [
    ("attention.hip", include_str!("kernel/attention.hip")),
    ("portability.h", include_str!("kernel/portability.h")),
    ("params.h", include_str!("kernel/params.h")),
    ("rows.h", include_str!("kernel/rows.h")),
    ("kv_address.h", include_str!("kernel/kv_address.h")),
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

/// hipRTC options for `variant` on the AMD architecture `arch` (e.g. `gfx90a`).
pub(crate) fn hiprtc_options(variant: &Variant, arch: &str) -> Vec<String> {
    let mut options = vec![format!("--offload-arch={arch}"), "-O3".to_string(), "-std=c++17".to_string()];
    options.extend(variant.defines());
    options
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
