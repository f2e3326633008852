//! `varlen-attn`: the crate's command-line program.
//!
//! - `varlen-attn` / `varlen-attn bench`: times the seed's shapes and checks them against the
//!   f64 oracle.
//! - `varlen-attn run --input in.safetensors --output out.safetensors`: attention on your own
//!   tensors.
//! - `varlen-attn check --input in.safetensors`: the fast path against the oracle on your own
//!   tensors.
//!
//! Exit codes: 0 success, 2 bad input (arguments or files), 1 any other failure.

mod bench;

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;
use varlen_attn::{oracle, Backend, CpuIsa, Params};
use varlen_attn_cli::tensors::{self, AnyInputs, FileElement, Inputs};
use varlen_attn_cli::Failure;

/// Variable-length multi-head attention (FlashAttention-style, cu_seqlens packing) on the CPU
/// or the GPU, with an f64 oracle to check it against.
#[derive(Parser, Debug)]
#[command(name = "varlen-attn", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Time the seed workload's shapes (the default): median time, GFLOP/s, % of the machine's
    /// measured peak, and the error against the f64 oracle.
    Bench(bench::BenchArgs),
    /// Read q, k, v, cu_seqlens_q and cu_seqlens_k from a safetensors file, write `out` (and
    /// `lse` with --lse) to another.
    Run(RunArgs),
    /// Read the same tensors, run the fast path and the f64 oracle, and print the error
    /// statistics (max abs, max ulp, fraction exact).
    Check(CheckArgs),
}

/// Attention parameters shared by every command.
#[derive(clap::Args, Debug, Clone)]
struct AttentionArgs {
    /// Causal mask, aligned to the bottom-right corner when a sequence has more keys than
    /// queries.
    #[arg(long)]
    causal: bool,
    /// Softmax scale (default 1/sqrt(head_dim)).
    #[arg(long, allow_negative_numbers = true)]
    scale: Option<f32>,
    /// Sliding window `LEFT,RIGHT` in tokens; -1 means unbounded on that side.
    #[arg(long, value_name = "LEFT,RIGHT", allow_hyphen_values = true)]
    window: Option<String>,
    /// Soft-cap the scaled scores: s becomes softcap * tanh(s / softcap).
    #[arg(long, allow_negative_numbers = true)]
    softcap: Option<f32>,
    /// Where to run.
    #[arg(long, default_value = "auto", value_parser = names_of(&Backend::ALL, Backend::name))]
    backend: Backend,
    /// Force a CPU instruction set (for comparisons).
    #[arg(long, default_value = "auto", value_parser = names_of(&CpuIsa::ALL, CpuIsa::name))]
    isa: CpuIsa,
}

/// A parser accepting exactly the library's names of `all` (listed by `--help`), through the
/// library's `FromStr`.
fn names_of<T>(all: &[T], name: fn(T) -> &'static str) -> impl clap::builder::TypedValueParser<Value = T>
where
    T: Copy + Send + Sync + 'static + core::str::FromStr<Err = String>,
{
    use clap::builder::TypedValueParser;
    let names: Vec<&'static str> = all.iter().map(|&x| name(x)).collect();
    clap::builder::PossibleValuesParser::new(names).map(|n| n.parse::<T>().expect("a listed name parses"))
}

impl AttentionArgs {
    fn params(&self) -> Result<Params, Failure> {
        let (window_left, window_right) = match &self.window {
            None => (None, None),
            Some(text) => parse_window(text).map_err(Failure::input)?,
        };
        Ok(Params {
            softmax_scale: self.scale,
            causal: self.causal,
            window_left,
            window_right,
            softcap: self.softcap,
            backend: self.backend,
            cpu_isa: self.isa,
            ..Params::default()
        })
    }
}

fn parse_window(text: &str) -> Result<(Option<usize>, Option<usize>), String> {
    let side = |s: &str| -> Result<Option<usize>, String> {
        match s.trim() {
            "-1" => Ok(None),
            n => n.parse().map(Some).map_err(|_| format!("--window {text}: `{n}` is not a token count or -1")),
        }
    };
    let (left, right) = text.split_once(',').ok_or_else(|| format!("--window {text}: expected LEFT,RIGHT"))?;
    Ok((side(left)?, side(right)?))
}

#[derive(clap::Args, Debug)]
struct RunArgs {
    /// safetensors file with q, k, v (bf16, f16 or f32) and cu_seqlens_q, cu_seqlens_k (i32).
    #[arg(long)]
    input: PathBuf,
    /// safetensors file to write `out` (and `lse`) to; written whole or not at all.
    #[arg(long)]
    output: PathBuf,
    /// Also write the log-sum-exp `lse` (f32 [num_heads, total_q]).
    #[arg(long)]
    lse: bool,
    #[command(flatten)]
    attention: AttentionArgs,
}

#[derive(clap::Args, Debug)]
struct CheckArgs {
    /// safetensors file with q, k, v and cu_seqlens_q, cu_seqlens_k.
    #[arg(long)]
    input: PathBuf,
    #[command(flatten)]
    attention: AttentionArgs,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.command {
        None => bench::run(&bench::BenchArgs {
            shapes: None,
            max_flop: 1e12,
            dtype: bench::ElementArg::Bf16,
            repeats: 5,
            check_rows: 16,
            json: None,
            quiet: false,
            attention: AttentionArgs {
                causal: false,
                scale: None,
                window: None,
                softcap: None,
                backend: Backend::Auto,
                isa: CpuIsa::Auto,
            },
        }),
        Some(Command::Bench(args)) => bench::run(args),
        Some(Command::Run(args)) => run(args),
        Some(Command::Check(args)) => check(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("error: {}", failure.message);
            ExitCode::from(failure.code)
        }
    }
}

/// `params` with the file's ALiBi slopes and sinks, where it has them.
fn with_modifiers<T>(params: &Params, inputs: &Inputs<T>) -> Params {
    Params { alibi_slopes: inputs.alibi_slopes.clone(), sinks: inputs.sinks.clone(), ..params.clone() }
}

fn run(args: &RunArgs) -> Result<(), Failure> {
    let params = args.attention.params()?;
    fn typed<T: FileElement>(inputs: Inputs<T>, params: &Params, args: &RunArgs) -> Result<(), Failure> {
        let params = &with_modifiers(params, &inputs);
        let (out, lse) = varlen_attn::forward_with_lse(
            inputs.q.view(),
            inputs.k.view(),
            inputs.v.view(),
            &inputs.cu_seqlens_q,
            &inputs.cu_seqlens_k,
            params,
        )
        .map_err(Failure::from_library)?;
        tensors::write_outputs(&args.output, &out, args.lse.then_some(&lse))?;
        println!("wrote out {:?}{} to {}", out.shape(), if args.lse { " and lse" } else { "" }, args.output.display());
        Ok(())
    }
    match tensors::read_inputs(&args.input)? {
        AnyInputs::Bf16(i) => typed(i, &params, args),
        AnyInputs::F16(i) => typed(i, &params, args),
        AnyInputs::F32(i) => typed(i, &params, args),
    }
}

fn check(args: &CheckArgs) -> Result<(), Failure> {
    let params = args.attention.params()?;
    fn typed<T: FileElement>(i: Inputs<T>, params: &Params) -> Result<(), Failure> {
        let params = &with_modifiers(params, &i);
        let (q, k, v) = (i.q.view(), i.k.view(), i.v.view());
        let (cu_q, cu_k) = (&i.cu_seqlens_q, &i.cu_seqlens_k);
        let (out, lse) = varlen_attn::forward_with_lse(q, k, v, cu_q, cu_k, params).map_err(Failure::from_library)?;
        let reference = oracle::reference(q, k, v, cu_q, cu_k, params).map_err(Failure::from_library)?;
        let report = reference.compare(out.view());
        println!("out: {report}");
        let lse_report = reference.compare_lse(lse.view());
        println!("lse: {lse_report}");
        if report.worst.is_some() || lse_report.worst.is_some() {
            return Err(Failure::runtime("the fast path is out of tolerance against the oracle".into()));
        }
        Ok(())
    }
    match tensors::read_inputs(&args.input)? {
        AnyInputs::Bf16(i) => typed(i, &params),
        AnyInputs::F16(i) => typed(i, &params),
        AnyInputs::F32(i) => typed(i, &params),
    }
}
