//! `varlen-attn bench`: times the seed's shapes and checks them against the oracle.

use crate::AttentionArgs;
use half::{bf16, f16};
use indicatif::{ProgressBar, ProgressStyle};
use ndarray::Array3;
use serde::Serialize;
use std::time::{Duration, Instant};
use varlen_attn::internal::{workloads::SEED_SHAPES, PeakUnit};
use varlen_attn::{oracle, Backend, CpuIsa, Element};
use varlen_attn_cli::Failure;

/// Minimum warm-up time per shape before the timed calls.
const WARM_UP: Duration = Duration::from_millis(300);

/// Options of the bench command.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    /// Shapes of the seed table to run, e.g. `0,3,11-14` (default: all that fit --max-flop).
    #[arg(long)]
    pub shapes: Option<String>,
    /// Skip shapes of more floating-point operations than this (the largest take minutes on a
    /// small CPU).
    #[arg(long, default_value_t = 1e12)]
    pub max_flop: f64,
    /// Element type of the random inputs.
    #[arg(long, value_enum, default_value_t = ElementArg::Bf16)]
    pub dtype: ElementArg,
    /// Timed calls per shape (the table shows the median), after 0.3 s of warm-up calls.
    #[arg(long, default_value_t = 5)]
    pub repeats: usize,
    /// Query rows checked against the f64 oracle on shapes of more than 1024 tokens (smaller
    /// shapes check every row). The rows are drawn at random; the oracle's cost grows with
    /// them.
    #[arg(long, default_value_t = 16)]
    pub check_rows: usize,
    /// Write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
    /// Hide the progress bar.
    #[arg(long)]
    pub quiet: bool,
    #[command(flatten)]
    pub attention: AttentionArgs,
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum ElementArg {
    Bf16,
    F16,
    F32,
}

/// One row of the results table.
#[derive(Serialize, Debug)]
pub struct Measurement {
    pub shape: usize,
    pub num_heads: usize,
    pub head_dim: usize,
    pub seq_len: usize,
    pub flop: f64,
    pub median_ms: f64,
    pub min_ms: f64,
    pub gflops: f64,
    pub percent_of_peak: Option<f64>,
    pub max_abs_error: f64,
    pub rows_checked: usize,
    pub within_tolerance: bool,
}

/// The whole report, as `--json` writes it.
#[derive(Serialize, Debug)]
pub struct Report {
    pub backend: String,
    pub cpu_isa: String,
    pub dtype: String,
    pub threads: usize,
    pub peak_gflops: Option<f64>,
    pub peak_unit: Option<String>,
    pub results: Vec<Measurement>,
}

pub fn run(args: &BenchArgs) -> Result<(), Failure> {
    match args.dtype {
        ElementArg::Bf16 => run_typed::<bf16>(args),
        ElementArg::F16 => run_typed::<f16>(args),
        ElementArg::F32 => run_typed::<f32>(args),
    }
}

fn run_typed<T: Element>(args: &BenchArgs) -> Result<(), Failure> {
    let params = args.attention.params()?;
    let indices = match &args.shapes {
        Some(list) => varlen_attn_cli::selection::parse(list, SEED_SHAPES.len()).map_err(Failure::input)?,
        None => (0..SEED_SHAPES.len()).collect(),
    };
    let (shapes, skipped): (Vec<_>, Vec<_>) =
        indices.into_iter().map(|i| SEED_SHAPES[i]).partition(|s| s.flops() <= args.max_flop);
    let threads = rayon::current_num_threads();
    let on_gpu = params.backend == Backend::Gpu;
    let isa = varlen_attn::cpu_isa_for::<T>(&params);
    let peak_unit = match isa {
        _ if on_gpu => None,
        CpuIsa::Amx => Some(PeakUnit::AmxBf16),
        CpuIsa::Avx512Bf16 => Some(PeakUnit::Bf16Dot),
        CpuIsa::Avx2 => Some(PeakUnit::F32FmaAvx2),
        _ => Some(PeakUnit::F32Fma),
    };
    let peak = peak_unit.and_then(|u| varlen_attn::internal::measure_peak(u, threads, Duration::from_millis(300)));
    println!(
        "varlen-attn bench: {} on {}, {threads} threads{}",
        T::DTYPE,
        if on_gpu { "the GPU".to_string() } else { format!("the CPU ({})", isa.name()) },
        match (peak, peak_unit) {
            (Some(p), Some(u)) => format!("; measured peak {:.0} GFLOP/s ({})", p / 1e9, peak_name(u)),
            _ => String::new(),
        }
    );
    if !skipped.is_empty() {
        let names: Vec<String> = skipped.iter().map(|s| s.index.to_string()).collect();
        println!("skipping shapes {} (over --max-flop {:.1e})", names.join(","), args.max_flop);
    }

    let progress =
        if args.quiet { ProgressBar::hidden() } else { ProgressBar::new((shapes.len() * (args.repeats + 1)) as u64) };
    progress.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} calls, shape {msg} [{elapsed}]").expect("valid template"),
    );
    let mut results = Vec::new();
    for shape in &shapes {
        progress.set_message(shape.index.to_string());
        let [q, k, v] = shape.random_inputs::<T>(shape.index as u64);
        let cu = shape.cu_seqlens();
        let mut out = Array3::<T>::default((shape.tokens(), shape.num_heads, shape.head_dim));
        let mut call = || {
            varlen_attn::forward_into(q.view(), k.view(), v.view(), &cu, &cu, &params, out.view_mut())
                .map_err(Failure::from_library)
        };
        // Warm up for at least WARM_UP (threads, scratch, the clock and the matrix units come
        // up to speed), at least one call.
        let warm_up = Instant::now();
        call()?;
        while warm_up.elapsed() < WARM_UP {
            call()?;
        }
        progress.inc(1);
        let mut times = Vec::with_capacity(args.repeats);
        for _ in 0..args.repeats {
            let start = Instant::now();
            call()?;
            times.push(start.elapsed().as_secs_f64());
            progress.inc(1);
        }
        times.sort_by(f64::total_cmp);
        let median = times[times.len() / 2];
        let tokens: Vec<usize> = if shape.tokens() <= 1024 {
            (0..shape.tokens()).collect()
        } else {
            sample_rows(shape.tokens(), args.check_rows, shape.index as u64)
        };
        let reference = oracle::reference_rows(q.view(), k.view(), v.view(), &cu, &cu, &params, &tokens)
            .map_err(Failure::from_library)?;
        let check = reference.compare(out.view());
        let gflops = shape.flops() / median / 1e9;
        results.push(Measurement {
            shape: shape.index,
            num_heads: shape.num_heads,
            head_dim: shape.head_dim,
            seq_len: shape.seq_len,
            flop: shape.flops(),
            median_ms: median * 1e3,
            min_ms: times[0] * 1e3,
            gflops,
            percent_of_peak: peak.map(|p| 100.0 * gflops * 1e9 / p),
            max_abs_error: check.max_abs_error,
            rows_checked: tokens.len(),
            within_tolerance: check.worst.is_none(),
        });
    }
    progress.finish_and_clear();

    println!(
        "{:>5} {:>5} {:>4} {:>6} {:>11} {:>9} {:>7} {:>10} {:>6}",
        "shape", "heads", "dim", "L", "median ms", "GFLOP/s", "% peak", "max error", "rows"
    );
    for r in &results {
        println!(
            "{:>5} {:>5} {:>4} {:>6} {:>11.3} {:>9.1} {:>7} {:>10.2e} {:>6}{}",
            r.shape,
            r.num_heads,
            r.head_dim,
            r.seq_len,
            r.median_ms,
            r.gflops,
            r.percent_of_peak.map_or("-".to_string(), |p| format!("{p:.1}")),
            r.max_abs_error,
            r.rows_checked,
            if r.within_tolerance { "" } else { "  OUT OF TOLERANCE" }
        );
    }
    let report = Report {
        backend: if on_gpu { "gpu".into() } else { "cpu".into() },
        cpu_isa: isa.name().into(),
        dtype: T::DTYPE.name().into(),
        threads,
        peak_gflops: peak.map(|p| p / 1e9),
        peak_unit: peak_unit.map(|u| peak_name(u).into()),
        results,
    };
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&report).expect("serializable");
        std::fs::write(path, text).map_err(|e| Failure::runtime(format!("cannot write {}: {e}", path.display())))?;
    }
    if report.results.iter().any(|r| !r.within_tolerance) {
        return Err(Failure::runtime("some results are out of tolerance against the oracle".into()));
    }
    Ok(())
}

fn peak_name(unit: PeakUnit) -> &'static str {
    match unit {
        PeakUnit::AmxBf16 => "AMX tdpbf16ps",
        PeakUnit::Bf16Dot => "vdpbf16ps",
        PeakUnit::F32Fma => "f32 FMA",
        PeakUnit::F32FmaAvx2 => "f32 FMA, AVX2",
    }
}

/// `count` distinct token indices below `tokens`, drawn with a fixed seed; always includes the
/// first and last rows.
fn sample_rows(tokens: usize, count: usize, seed: u64) -> Vec<usize> {
    let mut state = seed ^ 0x5851_f42d_4c95_7f2d;
    let mut rows = vec![0, tokens - 1];
    while rows.len() < count.max(2).min(tokens) {
        state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        let row = (state >> 33) as usize % tokens;
        if !rows.contains(&row) {
            rows.push(row);
        }
    }
    rows
}
