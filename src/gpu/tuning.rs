//! Switches for benchmarks and comparisons, read from the environment once per process. Calls
//! never need them: every default is the tuned configuration.
//!
//! | variable | effect |
//! |---|---|
//! | `VARLEN_ATTN_GPU_KERNEL=mma` | Hopper runs the sm_80 `mma.sync` kernel instead of warpgroup MMAs |
//! | `VARLEN_ATTN_GPU_TMA=0` | Hopper copies K and V by cp.async only, no tensor-memory copies |
//! | `VARLEN_ATTN_GPU_STAGES=2` | Hopper keeps two K/V stages in shared memory, not three |
//! | `VARLEN_ATTN_GPU_Q_BUFFERS=1` | Hopper keeps one Q buffer, not two |
//! | `VARLEN_ATTN_GPU_BLOCK_M=192`, `=128` or `=64` | Hopper uses query tiles of that many rows (three, two or one computing warpgroups) whatever the problem |
//! | `VARLEN_ATTN_GPU_BLOCK_N=192`, `=128` or `=64` | Hopper uses key tiles of that many keys (heads up to 128 wide) |
//! | `VARLEN_ATTN_GPU_SPLITS=n` | at most `n` key splits per query tile (1: none) |
//! | `VARLEN_ATTN_GPU_MERGE=kernel` | NVIDIA combines key splits in a second kernel, as AMD does, not in the last split block of each row group |
//! | `VARLEN_ATTN_GPU_ORDER=heads` or `=tiles` | units of work walk each query tile's heads (heads inner), or each head's tiles, whatever the problem |
//! | `VARLEN_ATTN_GPU_PERSISTENT=0` | Hopper launches a block per tile, not one per multiprocessor walking several |
//! | `VARLEN_ATTN_DUMP_PTX=folder` | each compiled variant's PTX is written there (for `ptxas -v`) |

use std::path::PathBuf;
use std::sync::OnceLock;

/// The switches of one process (see the module docs); `Default` is the tuned configuration.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Tuning {
    pub mma_on_hopper: bool,
    pub no_tma: bool,
    pub two_stages: bool,
    pub one_q_buffer: bool,
    /// Hopper's query tile rows, 64, 128 or 192, instead of the problem's choice.
    pub block_m: Option<usize>,
    /// Hopper's keys per tile, 64, 128 or 192, instead of the head width's choice.
    pub block_n: Option<usize>,
    pub max_splits: Option<usize>,
    /// Key splits are combined by the merge kernel, not in the attention kernel.
    pub merge_kernel: bool,
    /// Hopper launches a block per unit of work instead of a persistent grid.
    pub no_persistent: bool,
    /// Units of work walk each query tile's heads (`Some(true)`, `VA_HEADS_INNER`) or each
    /// head's tiles (`Some(false)`), instead of the problem's choice.
    pub heads_inner: Option<bool>,
    pub dump_ptx: Option<PathBuf>,
}

impl Tuning {
    /// This process's switches, read on first use.
    pub fn get() -> &'static Tuning {
        static TUNING: OnceLock<Tuning> = OnceLock::new();
        TUNING.get_or_init(|| Tuning::from(|name| std::env::var(name).ok()))
    }

    /// The switches as `lookup` (an environment) sets them.
    fn from(lookup: impl Fn(&str) -> Option<String>) -> Tuning {
        let is = |name: &str, value: &str| lookup(name).is_some_and(|v| v == value);
        Tuning {
            mma_on_hopper: is("VARLEN_ATTN_GPU_KERNEL", "mma"),
            no_tma: is("VARLEN_ATTN_GPU_TMA", "0"),
            two_stages: is("VARLEN_ATTN_GPU_STAGES", "2"),
            one_q_buffer: is("VARLEN_ATTN_GPU_Q_BUFFERS", "1"),
            block_m: lookup("VARLEN_ATTN_GPU_BLOCK_M")
                .and_then(|m| m.parse().ok())
                .filter(|m| [64, 128, 192].contains(m)),
            block_n: lookup("VARLEN_ATTN_GPU_BLOCK_N")
                .and_then(|n| n.parse().ok())
                .filter(|n| [64, 128, 192].contains(n)),
            max_splits: lookup("VARLEN_ATTN_GPU_SPLITS").and_then(|n| n.parse().ok()),
            merge_kernel: is("VARLEN_ATTN_GPU_MERGE", "kernel"),
            no_persistent: is("VARLEN_ATTN_GPU_PERSISTENT", "0"),
            heads_inner: match lookup("VARLEN_ATTN_GPU_ORDER").as_deref() {
                Some("heads") => Some(true),
                Some("tiles") => Some(false),
                _ => None,
            },
            dump_ptx: lookup("VARLEN_ATTN_DUMP_PTX").map(PathBuf::from),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_each_switch_and_defaults_to_the_tuned_configuration() {
        assert_eq!(Tuning::from(|_| None), Tuning::default());
        let env = |name: &str| {
            Some(
                match name {
                    "VARLEN_ATTN_GPU_KERNEL" => "mma",
                    "VARLEN_ATTN_GPU_TMA" => "0",
                    "VARLEN_ATTN_GPU_STAGES" => "2",
                    "VARLEN_ATTN_GPU_Q_BUFFERS" => "1",
                    "VARLEN_ATTN_GPU_BLOCK_M" => "128",
                    "VARLEN_ATTN_GPU_BLOCK_N" => "192",
                    "VARLEN_ATTN_GPU_SPLITS" => "1",
                    "VARLEN_ATTN_GPU_PERSISTENT" => "0",
                    "VARLEN_ATTN_GPU_MERGE" => "kernel",
                    "VARLEN_ATTN_GPU_ORDER" => "heads",
                    _ => "/tmp/ptx",
                }
                .to_string(),
            )
        };
        let all = Tuning::from(env);
        assert!(all.mma_on_hopper && all.no_tma && all.two_stages && all.block_m == Some(128) && all.no_persistent);
        assert!(all.one_q_buffer && all.block_n == Some(192) && all.merge_kernel && all.heads_inner == Some(true));
        assert_eq!(Tuning::from(|n| (n == "VARLEN_ATTN_GPU_ORDER").then(|| "tiles".into())).heads_inner, Some(false));
        assert_eq!((all.max_splits, all.dump_ptx), (Some(1), Some(PathBuf::from("/tmp/ptx"))));
        // Other values leave the defaults.
        assert_eq!(Tuning::from(|_| Some("yes".into())).max_splits, None);
        assert_eq!(Tuning::from(|_| Some("64".into())).block_m, Some(64));
        assert_eq!(Tuning::from(|_| Some("96".into())).block_m, None);
        assert_eq!(Tuning::from(|_| Some("192".into())).block_m, Some(192));
    }
}
