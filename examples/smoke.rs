use half::bf16;
use ndarray::Array3;
use varlen_attn::*;
fn main() {
    let cu = [0, 100, 230];
    for isa in [CpuIsa::Scalar, CpuIsa::Avx2, CpuIsa::Avx512, CpuIsa::Avx512Bf16] {
        for (d, causal) in [(72usize, false), (64, true), (7, false)] {
            let q = Array3::from_shape_fn((230, 4, d), |(t, h, x)| {
                bf16::from_f32((((t * 31 + h * 7 + x * 13) % 17) as f32 - 8.0) / 8.0)
            });
            let k = Array3::from_shape_fn((230, 2, d), |(t, h, x)| {
                bf16::from_f32((((t * 11 + h * 5 + x * 3) % 19) as f32 - 9.0) / 9.0)
            });
            let v = Array3::from_shape_fn((230, 2, d), |(t, h, x)| {
                bf16::from_f32((((t * 3 + h + x * 7) % 23) as f32 - 11.0) / 4.0)
            });
            let p = Params { causal, cpu_isa: isa, ..Default::default() };
            let out = forward(q.view(), k.view(), v.view(), &cu, &cu, &p).unwrap();
            let r = oracle::reference(q.view(), k.view(), v.view(), &cu, &cu, &p).unwrap();
            println!("{isa:?} d={d} causal={causal}: {}", r.compare(out.view()));
        }
    }
}
