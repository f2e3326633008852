//! Runs the `varlen-attn` binary on generated safetensors files, good and bad.

use assert_cmd::Command;
use half::bf16;
use ndarray::Array3;
use predicates::prelude::*;
use safetensors::{tensor::TensorView, Dtype};
use std::path::{Path, PathBuf};
use varlen_attn::{oracle, Params};

fn bin() -> Command {
    Command::cargo_bin("varlen-attn").expect("binary built")
}

/// A tensor to write: name, dtype, shape, raw bytes.
struct Entry(&'static str, Dtype, Vec<usize>, Vec<u8>);

fn write_file(path: &Path, entries: &[Entry]) {
    let views: Vec<(String, TensorView)> = entries
        .iter()
        .map(|Entry(name, dtype, shape, bytes)| {
            (name.to_string(), TensorView::new(*dtype, shape.clone(), bytes).unwrap())
        })
        .collect();
    std::fs::write(path, safetensors::serialize(views, None).unwrap()).unwrap();
}

fn bf16_entry(name: &'static str, a: &Array3<bf16>) -> Entry {
    Entry(name, Dtype::BF16, a.shape().to_vec(), bytemuck::cast_slice(a.as_slice().unwrap()).to_vec())
}

fn i32_entry(name: &'static str, v: &[i32]) -> Entry {
    Entry(name, Dtype::I32, vec![v.len()], bytemuck::cast_slice(v).to_vec())
}

struct Case {
    q: Array3<bf16>,
    k: Array3<bf16>,
    v: Array3<bf16>,
    cu_q: Vec<i32>,
    cu_k: Vec<i32>,
}

fn case() -> Case {
    let f = |t: usize, h: usize, d: usize, salt: usize| {
        bf16::from_f32((((t * 31 + h * 7 + d * 13 + salt) % 29) as f32 - 14.0) / 10.0)
    };
    Case {
        q: Array3::from_shape_fn((9, 4, 24), |(t, h, d)| f(t, h, d, 1)),
        k: Array3::from_shape_fn((11, 2, 24), |(t, h, d)| f(t, h, d, 2)),
        v: Array3::from_shape_fn((11, 2, 16), |(t, h, d)| f(t, h, d, 3)),
        cu_q: vec![0, 4, 4, 9],
        cu_k: vec![0, 6, 8, 11],
    }
}

fn entries(c: &Case) -> Vec<Entry> {
    vec![
        bf16_entry("q", &c.q),
        bf16_entry("k", &c.k),
        bf16_entry("v", &c.v),
        i32_entry("cu_seqlens_q", &c.cu_q),
        i32_entry("cu_seqlens_k", &c.cu_k),
    ]
}

fn temp_dir() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

fn files_in(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect()
}

#[test]
fn run_writes_the_same_output_as_the_library() {
    let dir = temp_dir();
    let (input, output) = (dir.path().join("in.safetensors"), dir.path().join("out.safetensors"));
    let c = case();
    write_file(&input, &entries(&c));
    bin()
        .args(["run", "--input", input.to_str().unwrap(), "--output", output.to_str().unwrap(), "--causal", "--lse"])
        .assert()
        .success()
        .stdout(predicate::str::contains("wrote out [9, 4, 16] and lse"));

    let bytes = std::fs::read(&output).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let out = file.tensor("out").unwrap();
    assert_eq!((out.dtype(), out.shape()), (Dtype::BF16, &[9usize, 4, 16][..]));
    let got: Vec<bf16> = bytemuck::pod_collect_to_vec(out.data());
    let params = Params { causal: true, ..Params::default() };
    let (expected, lse) =
        varlen_attn::forward_with_lse(c.q.view(), c.k.view(), c.v.view(), &c.cu_q, &c.cu_k, &params).unwrap();
    assert_eq!(got, expected.into_raw_vec_and_offset().0);
    let got_lse: Vec<f32> = bytemuck::pod_collect_to_vec(file.tensor("lse").unwrap().data());
    assert_eq!(got_lse, lse.into_raw_vec_and_offset().0);
}

#[test]
fn run_takes_window_scale_and_softcap() {
    let dir = temp_dir();
    let (input, output) = (dir.path().join("in.safetensors"), dir.path().join("out.safetensors"));
    let c = case();
    write_file(&input, &entries(&c));
    bin()
        .args(["run", "--input", input.to_str().unwrap(), "--output", output.to_str().unwrap()])
        .args(["--window", "2,-1", "--scale", "0.5", "--softcap", "10"])
        .assert()
        .success();
    let bytes = std::fs::read(&output).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let got: Vec<bf16> = bytemuck::pod_collect_to_vec(file.tensor("out").unwrap().data());
    let params = Params { window_left: Some(2), softmax_scale: Some(0.5), softcap: Some(10.0), ..Params::default() };
    let expected = varlen_attn::forward(c.q.view(), c.k.view(), c.v.view(), &c.cu_q, &c.cu_k, &params).unwrap();
    assert_eq!(got, expected.into_raw_vec_and_offset().0);
    assert!(file.tensor("lse").is_err());
}

fn f32_entry(name: &'static str, shape: &[usize], v: &[f32]) -> Entry {
    Entry(name, Dtype::F32, shape.to_vec(), bytemuck::cast_slice(v).to_vec())
}

#[test]
fn run_and_check_take_alibi_slopes_and_sinks_from_the_file() {
    let dir = temp_dir();
    let (input, output) = (dir.path().join("in.safetensors"), dir.path().join("out.safetensors"));
    let c = case();
    let (slopes, sinks) = ((0..12).map(|i| i as f32 / 16.0).collect::<Vec<f32>>(), vec![0.5f32, -1.0, 2.0, 0.0]);
    let mut with = entries(&c);
    with.push(f32_entry("alibi_slopes", &[3, 4], &slopes));
    with.push(f32_entry("sinks", &[4], &sinks));
    write_file(&input, &with);
    bin().args(["run", "--input", input.to_str().unwrap(), "--output", output.to_str().unwrap()]).assert().success();
    let bytes = std::fs::read(&output).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let got: Vec<bf16> = bytemuck::pod_collect_to_vec(file.tensor("out").unwrap().data());
    let params = Params { alibi_slopes: Some(slopes), sinks: Some(sinks), ..Params::default() };
    let expected = varlen_attn::forward(c.q.view(), c.k.view(), c.v.view(), &c.cu_q, &c.cu_k, &params).unwrap();
    assert_eq!(got, expected.into_raw_vec_and_offset().0);
    bin().args(["check", "--input", input.to_str().unwrap()]).assert().success();
    // A slope tensor of the wrong dtype is named.
    let mut bad = entries(&c);
    bad.push(i32_entry("alibi_slopes", &[1, 2, 3, 4]));
    write_file(&input, &bad);
    bin()
        .args(["check", "--input", input.to_str().unwrap()])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("alibi_slopes").and(predicate::str::contains("f32")));
}

#[test]
fn check_prints_error_statistics() {
    let dir = temp_dir();
    let input = dir.path().join("in.safetensors");
    write_file(&input, &entries(&case()));
    bin()
        .args(["check", "--input", input.to_str().unwrap()])
        .assert()
        .success()
        .stdout(predicate::str::contains("out: 576 elements: max abs error").and(predicate::str::contains("% exact")));
    // The oracle agrees with what `check` checks against.
    let c = case();
    assert!(oracle::forward(c.q.view(), c.k.view(), c.v.view(), &c.cu_q, &c.cu_k, &Params::default()).is_ok());
}

/// A bad input file: exit code 2, a message naming the problem, and no output file.
fn refuses(entries_or_bytes: Result<Vec<Entry>, Vec<u8>>, message: &str) {
    let dir = temp_dir();
    let (input, output) = (dir.path().join("in.safetensors"), dir.path().join("out.safetensors"));
    match entries_or_bytes {
        Ok(entries) => write_file(&input, &entries),
        Err(bytes) => std::fs::write(&input, bytes).unwrap(),
    }
    bin()
        .args(["run", "--input", input.to_str().unwrap(), "--output", output.to_str().unwrap()])
        .assert()
        .code(2)
        .stderr(predicate::str::contains(message));
    assert_eq!(files_in(dir.path()), vec![input.clone()], "nothing else may be left behind");
    bin()
        .args(["check", "--input", input.to_str().unwrap()])
        .assert()
        .code(2)
        .stderr(predicate::str::contains(message));
}

#[test]
fn missing_tensor() {
    let mut e = entries(&case());
    e.remove(1);
    refuses(Ok(e), "tensor `k` is missing (expected the dtype of q, [total_k, num_kv_heads, head_dim])");
}

#[test]
fn wrong_dtype() {
    let c = case();
    let mut e = entries(&c);
    let k32 = c.k.mapv(|x| x.to_f32());
    e[1] = Entry("k", Dtype::F32, k32.shape().to_vec(), bytemuck::cast_slice(k32.as_slice().unwrap()).to_vec());
    refuses(Ok(e), "tensor `k` has dtype F32 but `q` has BF16");

    let mut e = entries(&c);
    let cu: Vec<i64> = c.cu_q.iter().map(|&x| x as i64).collect();
    e[3] = Entry("cu_seqlens_q", Dtype::I64, vec![cu.len()], bytemuck::cast_slice(&cu).to_vec());
    refuses(Ok(e), "tensor `cu_seqlens_q` has dtype I64; expected I32");

    let mut all = entries(&case());
    all[0] = Entry("q", Dtype::U8, vec![9, 4, 24], vec![0; 9 * 4 * 24]);
    refuses(Ok(all), "tensor `k` has dtype BF16 but `q` has U8");
    let mut all = entries(&case());
    for (i, shape) in [(0usize, vec![9usize, 4, 24]), (1, vec![11, 2, 24]), (2, vec![11, 2, 16])] {
        let n: usize = shape.iter().product();
        all[i] = Entry(["q", "k", "v"][i], Dtype::I16, shape, vec![0; 2 * n]);
    }
    refuses(Ok(all), "tensor `q` has dtype I16; expected BF16, F16 or F32");
}

#[test]
fn wrong_rank() {
    let c = case();
    let mut e = entries(&c);
    e[2] = Entry("v", Dtype::BF16, vec![11, 32], bytemuck::cast_slice(c.v.as_slice().unwrap()).to_vec());
    refuses(Ok(e), "tensor v has rank 2, expected 3 ([total_k, num_kv_heads, head_dim_v])");
    let mut e = entries(&c);
    e[4] = Entry("cu_seqlens_k", Dtype::I32, vec![2, 2], bytemuck::cast_slice(&[0i32, 6, 8, 11]).to_vec());
    refuses(Ok(e), "tensor `cu_seqlens_k` has rank 2; expected 1");
}

#[test]
fn truncated_file() {
    let dir = temp_dir();
    let full = dir.path().join("full.safetensors");
    write_file(&full, &entries(&case()));
    let bytes = std::fs::read(&full).unwrap();
    refuses(Err(bytes[..bytes.len() - 100].to_vec()), "is not a valid safetensors file");
    refuses(Err(b"not a safetensors file at all".to_vec()), "is not a valid safetensors file");
}

#[test]
fn inconsistent_cu_seqlens() {
    let mut e = entries(&case());
    e[3] = i32_entry("cu_seqlens_q", &[0, 5, 4, 9]);
    refuses(Ok(e), "cu_seqlens_q[2] = 4: entries must not decrease");
    let mut e = entries(&case());
    e[4] = i32_entry("cu_seqlens_k", &[0, 6, 11]);
    refuses(Ok(e), "cu_seqlens_q has 4 entries but cu_seqlens_k has 3");
}

#[test]
fn bad_arguments_exit_with_code_2() {
    let dir = temp_dir();
    let input = dir.path().join("in.safetensors");
    write_file(&input, &entries(&case()));
    bin()
        .args(["check", "--input", input.to_str().unwrap(), "--window", "3"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("expected LEFT,RIGHT"));
    bin()
        .args(["check", "--input", input.to_str().unwrap(), "--scale", "-1"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("softmax_scale"));
    bin()
        .args(["bench", "--shapes", "30"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("shape 30 does not exist"));
    bin()
        .args(["check", "--input", dir.path().join("absent").to_str().unwrap()])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("cannot read"));
}

#[test]
fn bench_runs_small_shapes_and_writes_json() {
    let dir = temp_dir();
    let json = dir.path().join("bench.json");
    bin()
        .args(["bench", "--shapes", "11,20", "--repeats", "1", "--quiet", "--json", json.to_str().unwrap()])
        .assert()
        .success()
        .stdout(predicate::str::contains("GFLOP/s").and(predicate::str::contains("   11     4   72    276")));
    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let results = report["results"].as_array().unwrap();
    assert_eq!(results.len(), 2);
    assert_eq!(results[0]["rows_checked"], 276);
    assert_eq!(results[0]["within_tolerance"], true);
}

#[test]
fn help_explains_the_commands() {
    bin()
        .arg("--help")
        .assert()
        .success()
        .stdout(predicate::str::contains("bench").and(predicate::str::contains("safetensors")));
    bin().args(["run", "--help"]).assert().success().stdout(predicate::str::contains("--window <LEFT,RIGHT>"));
}
