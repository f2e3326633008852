//! Compile checks of every GPU kernel variant, without a GPU: NVRTC for Hopper (sm_90a) and
//! Ampere (sm_80), hipcc for AMD's gfx90a (MI200). Need the `gpu` feature, and libnvrtc on the
//! loader path (CI installs PyPI's nvidia-cuda-nvrtc wheel) or hipcc on the PATH (CI installs
//! Debian's hipcc). Each is skipped, saying so, when its compiler is missing, unless
//! `VARLEN_ATTN_REQUIRE_NVRTC` / `VARLEN_ATTN_REQUIRE_HIPCC` is set (as in CI).

#![cfg(feature = "gpu")]

#[test]
fn every_kernel_variant_compiles_for_nvidia() {
    for (major, minor) in [(9, 0), (8, 0)] {
        match varlen_attn::internal::compile_check_nvidia(major, minor) {
            Ok(n) => eprintln!("sm_{major}{minor}: {n} variants compiled"),
            Err(varlen_attn::Error::NoDevice(why)) if std::env::var_os("VARLEN_ATTN_REQUIRE_NVRTC").is_none() => {
                eprintln!("note: skipping the NVRTC compile check: {why}");
                return;
            }
            Err(e) => panic!("{e}"),
        }
    }
}

#[test]
fn every_kernel_variant_compiles_for_amd() {
    let hipcc = std::process::Command::new("hipcc").arg("--version").output();
    if hipcc.is_err() && std::env::var_os("VARLEN_ATTN_REQUIRE_HIPCC").is_none() {
        eprintln!("note: skipping the hipcc compile check: hipcc is not installed");
        return;
    }
    let output = std::env::temp_dir().join(format!("varlen-attn-check-{}.co", std::process::id()));
    let all = varlen_attn::internal::hipcc_check_arguments("gfx90a");
    for args in &all {
        let result = std::process::Command::new("hipcc")
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .args(args)
            .arg("-o")
            .arg(&output)
            .output()
            .expect("hipcc runs");
        assert!(result.status.success(), "hipcc {}:\n{}", args.join(" "), String::from_utf8_lossy(&result.stderr));
    }
    let _ = std::fs::remove_file(&output);
    eprintln!("gfx90a: {} variants compiled", all.len());
}
