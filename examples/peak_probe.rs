fn main() {
    for t in [1, 2] {
        for u in [varlen_attn::PeakUnit::Bf16Dot, varlen_attn::PeakUnit::F32Fma] {
            println!(
                "{t} {u:?} {:.1} GFLOP/s",
                varlen_attn::measure_peak(u, t, std::time::Duration::from_millis(300)).unwrap() / 1e9
            );
        }
    }
}
