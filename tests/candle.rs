//! The candle calls (`--features candle`) equal `varlen_attn::forward` bit for bit on the same
//! data, for every dtype, GQA, causal, windows, soft-cap, strided tensors and empty sequences;
//! bad tensors give candle errors naming the argument, never a panic.

use candle_core::{DType, Device, Tensor};
use half::{bf16, f16};
use ndarray::Array3;
use varlen_attn::candle::{
    flash_attn_varlen, flash_attn_varlen_alibi_windowed_softcap, flash_attn_varlen_cpu, flash_attn_varlen_windowed,
    flash_attn_varlen_with_lse,
};
use varlen_attn::{Backend, Element, Params};

mod common;

use common::{extreme::uniform, Rng};

/// The same data as an ndarray (for `forward`) and a candle tensor.
fn pair<T: Element + candle_core::WithDType>(shape: (usize, usize, usize), seed: u64) -> (Array3<T>, Tensor) {
    let array = uniform::<T>(&mut Rng::new(seed), shape, 4.0);
    let tensor = Tensor::from_vec(array.iter().copied().collect::<Vec<T>>(), shape, &Device::Cpu).unwrap();
    (array, tensor)
}

fn cpu(params: Params) -> Params {
    Params { backend: Backend::Cpu, ..params }
}

fn same<T: Element + candle_core::WithDType>(ours: &Tensor, expected: &Array3<T>) {
    assert_eq!(ours.dims(), expected.shape());
    let got: Vec<T> = ours.flatten_all().unwrap().to_vec1::<T>().unwrap();
    let want: Vec<T> = expected.iter().copied().collect();
    let bits = |x: &[T]| x.iter().map(|v| v.to_f32().to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&got), bits(&want));
}

fn u32s(values: &[i32]) -> Tensor {
    Tensor::new(values.iter().map(|&x| x as u32).collect::<Vec<_>>().as_slice(), &Device::Cpu).unwrap()
}

fn every_mask_and_dtype<T: Element + candle_core::WithDType>() {
    // Three sequences, one empty; GQA 4 / 2 heads; head_dim 72, head_dim_v 40.
    let cu_q = [0, 37, 37, 130];
    let cu_k = [0, 50, 61, 170];
    let (q, qt) = pair::<T>((130, 4, 72), 1);
    let (k, kt) = pair::<T>((170, 2, 72), 2);
    let (v, vt) = pair::<T>((170, 2, 40), 3);
    let (cq, ck) = (u32s(&cu_q), u32s(&cu_k));
    let scale = 0.11f32;
    let forward = |params: Params| {
        varlen_attn::forward(
            q.view(),
            k.view(),
            v.view(),
            &cu_q,
            &cu_k,
            &cpu(Params { softmax_scale: Some(scale), ..params }),
        )
        .unwrap()
    };
    for causal in [false, true] {
        let ours = flash_attn_varlen(&qt, &kt, &vt, &cq, &ck, 93, 109, scale, causal).unwrap();
        same(&ours, &forward(Params { causal, ..Params::default() }));
    }
    for (left, right) in [(Some(7), Some(0)), (None, Some(0)), (Some(20), Some(3)), (Some(0), None)] {
        let ours = flash_attn_varlen_windowed(&qt, &kt, &vt, &cq, &ck, 93, 109, scale, left, right).unwrap();
        same(&ours, &forward(Params { window_left: left, window_right: right, ..Params::default() }));
    }
    let capped =
        flash_attn_varlen_alibi_windowed_softcap(&qt, &kt, &vt, None, &cq, &ck, 93, 109, scale, Some(30), None, 5.0)
            .unwrap();
    same(&capped, &forward(Params { window_left: Some(30), softcap: Some(5.0), ..Params::default() }));
    // ALiBi slopes, per head and per sequence and head, as FlashAttention-2 takes them.
    for slopes in [vec![0.5f32, 0.25, 0.125, 0.0625], (0..12).map(|i| 0.01 * i as f32).collect()] {
        let shape: &[usize] = if slopes.len() == 4 { &[4] } else { &[3, 4] };
        let tensor = Tensor::from_vec(slopes.clone(), shape, &Device::Cpu).unwrap();
        let biased = flash_attn_varlen_alibi_windowed_softcap(
            &qt,
            &kt,
            &vt,
            Some(&tensor),
            &cq,
            &ck,
            93,
            109,
            scale,
            None,
            None,
            5.0,
        )
        .unwrap();
        same(&biased, &forward(Params { softcap: Some(5.0), alibi_slopes: Some(slopes), ..Params::default() }));
    }

    let (out, lse) = flash_attn_varlen_with_lse(&qt, &kt, &vt, &cq, &ck, 93, 109, scale, true).unwrap();
    let params = cpu(Params { softmax_scale: Some(scale), causal: true, ..Params::default() });
    let (want_out, want_lse) =
        varlen_attn::forward_with_lse(q.view(), k.view(), v.view(), &cu_q, &cu_k, &params).unwrap();
    same(&out, &want_out);
    assert_eq!(lse.dims(), &[4, 130]);
    let lse: Vec<f32> = lse.flatten_all().unwrap().to_vec1().unwrap();
    assert_eq!(
        lse.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
        want_lse.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
    );

    // candle-nn's convention: per-sequence lengths; a left window alone is causal to the right.
    let (lq, lk) = (u32s(&[37, 0, 93]), u32s(&[50, 11, 109]));
    let ours = flash_attn_varlen_cpu(&qt, &kt, &vt, None, &lq, &lk, 93, 109, scale, false, Some(9), None).unwrap();
    same(&ours, &forward(Params { window_left: Some(9), window_right: Some(0), ..Params::default() }));
    let ours = flash_attn_varlen_cpu(&qt, &kt, &vt, None, &lq, &lk, 93, 109, scale, true, Some(9), Some(4)).unwrap();
    same(&ours, &forward(Params { window_left: Some(9), window_right: Some(0), ..Params::default() }));
    let ours = flash_attn_varlen_cpu(&qt, &kt, &vt, None, &lq, &lk, 93, 109, scale, false, None, None).unwrap();
    same(&ours, &forward(Params::default()));
}

#[test]
fn equals_forward_bit_for_bit_in_bf16() {
    every_mask_and_dtype::<bf16>();
}

#[test]
fn equals_forward_bit_for_bit_in_f16() {
    every_mask_and_dtype::<f16>();
}

#[test]
fn equals_forward_bit_for_bit_in_f32() {
    every_mask_and_dtype::<f32>();
}

#[test]
fn strided_tensors_are_read_in_place() {
    // q, k and v as views into one packed [tokens, 3, heads, dim] tensor, and a transposed one.
    let (tokens, heads, dim) = (90, 4, 64);
    let (_, qkv) = pair::<bf16>((tokens, 3 * heads, dim), 9);
    let qkv = qkv.reshape((tokens, 3, heads, dim)).unwrap();
    let part = |i| qkv.narrow(1, i, 1).unwrap().squeeze(1).unwrap();
    let (q, k) = (part(0), part(1));
    // v stored [heads, tokens, dim], seen as [tokens, heads, dim].
    let (_, v_heads_first) = pair::<bf16>((heads, tokens, dim), 10);
    let v = v_heads_first.transpose(0, 1).unwrap();
    assert!(!q.is_contiguous() && !v.is_contiguous());
    let cu = u32s(&[0, 30, 90]);
    let ours = flash_attn_varlen(&q, &k, &v, &cu, &cu, 60, 60, 0.125, true).unwrap();
    let array = |t: &Tensor| {
        let c = t.contiguous().unwrap();
        Array3::from_shape_vec((tokens, heads, dim), c.flatten_all().unwrap().to_vec1::<bf16>().unwrap()).unwrap()
    };
    let params = cpu(Params { softmax_scale: Some(0.125), causal: true, ..Params::default() });
    let want =
        varlen_attn::forward(array(&q).view(), array(&k).view(), array(&v).view(), &[0, 30, 90], &[0, 30, 90], &params)
            .unwrap();
    same(&ours, &want);
}

#[test]
fn bad_tensors_give_candle_errors_naming_the_argument() {
    let x = Tensor::zeros((6, 2, 8), DType::BF16, &Device::Cpu).unwrap();
    let cu = u32s(&[0, 6]);
    let message = |r: candle_core::Result<Tensor>| r.unwrap_err().to_string();
    let flat = Tensor::zeros((6, 16), DType::BF16, &Device::Cpu).unwrap();
    let m = message(flash_attn_varlen(&flat, &x, &x, &cu, &cu, 6, 6, 0.3, false));
    assert!(m.contains("q has rank 2, expected 3"), "{m}");
    let f16s = x.to_dtype(DType::F16).unwrap();
    let m = message(flash_attn_varlen(&x, &f16s, &x, &cu, &cu, 6, 6, 0.3, false));
    assert!(m.contains("k is F16 but q is BF16"), "{m}");
    let f64s = x.to_dtype(DType::F64).unwrap();
    let m = message(flash_attn_varlen(&f64s, &f64s, &f64s, &cu, &cu, 6, 6, 0.3, false));
    assert!(m.contains("bf16, f16 or f32"), "{m}");
    let float_seqlens = Tensor::new(&[0f32, 6.0], &Device::Cpu).unwrap();
    let m = message(flash_attn_varlen(&x, &x, &x, &float_seqlens, &cu, 6, 6, 0.3, false));
    assert!(m.contains("seqlens_q must be u32, i64 or i32"), "{m}");
    let m = message(flash_attn_varlen(&x, &x, &x, &u32s(&[0, 4]), &cu, 6, 6, 0.3, false));
    assert!(m.contains("cu_seqlens_q"), "{m}");
    let m = message(flash_attn_varlen(&x, &x, &x, &u32s(&[0, 6]), &u32s(&[0, 2, 6]), 6, 6, 0.3, false));
    assert!(m.contains("cu_seqlens"), "{m}");
    let two_d = Tensor::zeros((2, 2), DType::U32, &Device::Cpu).unwrap();
    let m = message(flash_attn_varlen(&x, &x, &x, &two_d, &cu, 6, 6, 0.3, false));
    assert!(m.contains("seqlens_q must have rank 1"), "{m}");
    for (slopes, fragment) in [
        (Tensor::zeros(3, DType::F32, &Device::Cpu).unwrap(), "num_heads"),
        (Tensor::zeros(2, DType::F16, &Device::Cpu).unwrap(), "f32"),
        (Tensor::zeros((1, 1, 2), DType::F32, &Device::Cpu).unwrap(), "[batch, num_heads]"),
    ] {
        let m = message(flash_attn_varlen_alibi_windowed_softcap(
            &x,
            &x,
            &x,
            Some(&slopes),
            &cu,
            &cu,
            6,
            6,
            0.3,
            None,
            None,
            5.0,
        ));
        assert!(m.contains("alibi_slopes") && m.contains(fragment), "{m}");
    }
    let lengths = u32s(&[6]);
    let m = message(flash_attn_varlen_cpu(&x, &x, &x, None, &lengths, &lengths, 6, 6, 0.3, false, None, Some(2)));
    assert!(m.contains("window_right needs window_left"), "{m}");
    let m = message(flash_attn_varlen(&x, &x, &x, &cu, &cu, 6, 6, -1.0, false));
    assert!(m.contains("scale"), "{m}");
}

/// The paged entry point equals `forward_paged` bit for bit on a cache with shuffled blocks, a
/// transposed (strided) cache view, and a causal window; bad block tables are candle errors
/// naming the sequence and entry.
#[test]
fn paged_entry_point_equals_forward_paged() {
    use varlen_attn::candle::flash_attn_varlen_paged_windowed;
    let (blocks, block_size, kv_heads, d) = (6, 16, 2, 32);
    let (cache, cache_t) = pair::<bf16>((blocks * block_size, kv_heads, d), 41);
    let cache4 = cache.into_shape_with_order((blocks, block_size, kv_heads, d)).unwrap();
    let cache_t = cache_t.reshape((blocks, block_size, kv_heads, d)).unwrap();
    let (q, q_t) = pair::<bf16>((3, 4, d), 42);
    let table = ndarray::Array2::from_shape_vec((2, 3), vec![4, 1, 5, 0, 2, 2]).unwrap();
    let table_t = Tensor::new(&[[4u32, 1, 5], [0, 2, 2]], &Device::Cpu).unwrap();
    let (cu_q, cu_k) = ([0, 1, 3], [0, 40, 70]);
    let params =
        cpu(Params { softmax_scale: Some(0.2), window_left: Some(20), window_right: Some(0), ..Params::default() });
    let kv = varlen_attn::PagedKv { k_cache: cache4.view(), v_cache: cache4.view(), block_table: table.view() };
    let expected = varlen_attn::forward_paged(q.view(), &kv, &cu_q, &cu_k, &params).unwrap();
    // The candle call with the window above on these seqlens.
    let call = |q: &Tensor, cache: &Tensor, table: &Tensor| {
        flash_attn_varlen_paged_windowed(
            q,
            cache,
            cache,
            table,
            &u32s(&cu_q),
            &u32s(&cu_k),
            2,
            40,
            0.2,
            Some(20),
            Some(0),
        )
    };
    same(&call(&q_t, &cache_t, &table_t).unwrap(), &expected);
    // A strided view of the cache: its heads axis swapped twice over a transposed copy.
    let swapped = cache_t.transpose(1, 2).unwrap().contiguous().unwrap().transpose(1, 2).unwrap();
    same(&call(&q_t, &swapped, &table_t).unwrap(), &expected);
    let bad = Tensor::new(&[[4u32, 1, 5], [0, 9, 2]], &Device::Cpu).unwrap();
    let m = call(&q_t, &cache_t, &bad).unwrap_err().to_string();
    assert!(m.contains("block_table[1, 1] = 9"), "{m}");
    let flat = Tensor::new(&[4u32, 1, 5], &Device::Cpu).unwrap();
    let m = call(&q_t, &cache_t, &flat).unwrap_err().to_string();
    assert!(m.contains("block_table must have rank 2"), "{m}");
    let m = call(&q_t, &q_t, &table_t).unwrap_err().to_string();
    assert!(m.contains("k_cache has rank 3, expected 4"), "{m}");
}
