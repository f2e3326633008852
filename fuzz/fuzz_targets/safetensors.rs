//! Fuzzes the CLI's safetensors reader: any bytes must give a clear error or inputs that the
//! library then accepts or refuses exactly as the oracle does, without a panic.

#![no_main]

#[path = "common.rs"]
mod common;

use libfuzzer_sys::fuzz_target;
use varlen_attn::{Backend, Params};
use varlen_attn_cli::tensors::{parse_inputs, AnyInputs};

fuzz_target!(|data: &[u8]| {
    let inputs = match parse_inputs(data, "fuzz.safetensors") {
        Ok(inputs) => inputs,
        Err(failure) => {
            assert_eq!(failure.code, 2, "a bad file is bad input: {}", failure.message);
            assert!(!failure.message.is_empty());
            return;
        }
    };
    let params = Params { backend: Backend::Cpu, ..Params::default() };
    macro_rules! run {
        ($i:expr) => {{
            let i = $i;
            // Keep each run small: the oracle's cost grows with the square of the lengths.
            if i.q.len() + i.k.len() + i.v.len() > 1 << 16 {
                return;
            }
            let moderate = [i.q.iter(), i.k.iter(), i.v.iter()]
                .into_iter()
                .flatten()
                .all(|x| varlen_attn::Element::to_f32(*x).abs() <= 4.0 && (varlen_attn::Element::to_f32(*x) == 0.0 || varlen_attn::Element::to_f32(*x).abs() >= 1e-3));
            common::check(i.q.view(), i.k.view(), i.v.view(), &i.cu_seqlens_q, &i.cu_seqlens_k, &params, 1, false, moderate);
        }};
    }
    match inputs {
        AnyInputs::Bf16(i) => run!(i),
        AnyInputs::F16(i) => run!(i),
        AnyInputs::F32(i) => run!(i),
    }
});
