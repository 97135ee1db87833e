//! How one worker runs: its flags are the fields of [`WorkerConfig`] itself (clap `Args`), so
//! the binary parses them into the config that [`crate::train::run`] takes, with nothing copied
//! by hand; [`WorkerConfig::check`] refuses values out of their range with an error that names
//! the flag.

use std::path::PathBuf;

use crate::backend::DeviceChoice;
use crate::schedule::{LrSchedule, SspRefresh};

/// How one worker runs.
#[derive(Debug, Clone, clap::Args)]
pub struct WorkerConfig {
    /// The scheduler's URL.
    #[arg(long, env = "PS_SCHEDULER", default_value = "http://127.0.0.1:7000")]
    pub scheduler: String,
    /// The job to join.
    #[arg(long, env = "PS_JOB")]
    pub job: String,
    /// This worker's name in the job (unique per job; default: worker-<process id>).
    #[arg(long, env = "PS_WORKER_NAME", default_value_t = format!("worker-{}", std::process::id()))]
    pub name: String,
    /// Where the data set's files are, when not in their default place.
    #[arg(long, env = "PS_DATA")]
    pub data: Option<PathBuf>,
    /// The run directory for metrics (and, with --evaluate, results, curves and the model).
    #[arg(long, env = "PS_RUN_DIR")]
    pub run_dir: Option<PathBuf>,
    /// Serve Prometheus `/metrics` (step time by phase, examples/s, loss, bytes, compression
    /// ratio, the process's CPU and memory), `/healthz` and `/readyz` on this address.
    #[arg(long, env = "PS_METRICS_LISTEN")]
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// Evaluate on the test set at intervals and write the run's final results.
    #[arg(long)]
    pub evaluate: bool,
    /// Clocks between evaluations (0: once per epoch of this worker).
    #[arg(long, default_value_t = 0)]
    pub eval_every: u64,
    /// Compute each batch in this many micro-batches, accumulating the gradients.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub micro_batches: u32,
    /// Examples per clock when the job sets no global batch.
    #[arg(long = "batch", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    pub default_batch: u32,
    /// Emulate a link of this many megabits per second for pushes and pulls.
    #[arg(long, env = "PS_LINK_MBPS")]
    pub link_mbps: Option<f64>,
    /// The speed of this worker's real link to the shards, in megabits per second, where it is
    /// known: a dense push whose f32 values would cross it in under half a millisecond goes as
    /// f32 whatever its table's codec (compressing it saves less than its lossy codec costs in
    /// clocks). Unset: --link-mbps's speed when it emulates one, else no such floor.
    #[arg(long, env = "PS_LINK_SPEED_MBPS")]
    pub link_speed_mbps: Option<f64>,
    /// MiB for the residuals of each sparse table's rows under a lossy codec; past it, rows
    /// not pushed again for a while give theirs up (counted in
    /// `ps_worker_row_residuals_evicted_total`).
    #[arg(long, env = "PS_ROW_RESIDUAL_MIB", default_value_t = 256,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub row_residual_mib: u32,
    /// MiB for the rows of each sparse table this worker keeps from its pulls, so that a pull
    /// gets only the rows that changed since (exact: rows are compared by a digest of their
    /// values). 0 (the default) keeps none. It pays where the link, not the CPU, bounds a
    /// step (below about 1 Gbit/s a worker). Pull codecs that round rows together (int8
    /// and int4 with rows under 32 values) always get every row.
    #[arg(long, env = "PS_HELD_ROWS_MIB", default_value_t = 0)]
    pub held_rows_mib: u32,
    /// Probability that a clock is a straggler (takes --straggler-factor times longer).
    #[arg(long, default_value_t = 0.0)]
    pub straggler_prob: f64,
    /// How many times longer a straggling clock takes (at least 1).
    #[arg(long, default_value_t = 4.0)]
    pub straggler_factor: f64,
    /// Every clock's compute takes this many times longer (a persistently slower machine).
    #[arg(long, default_value_t = 1.0)]
    pub slowdown: f64,
    /// Under SSP: pull the dense tables at every clock, or only when the staleness bound
    /// requires it (fewer pulls, lower accuracy).
    #[arg(long, value_enum, default_value_t = SspRefresh::EveryClock)]
    pub ssp_refresh: SspRefresh,
    /// Send lossy codecs' gradients without the error-feedback residual (to measure what it
    /// buys; training is worse without it).
    #[arg(long = "no-error-feedback", action = clap::ArgAction::SetFalse)]
    pub error_feedback: bool,
    /// How this worker pulls every table, in place of the job's pull codecs: f32, fp16, bf16,
    /// int8 (a byte a value and a scale per block of whole rows), int4 (half a byte a value,
    /// the same scales), or delta-topk:R (dense
    /// tables as the top R of each chunk's change since this worker's last pull; sparse
    /// tables then pull in fp16).
    #[arg(long, env = "PS_PULL_CODEC")]
    pub pull_codec: Option<ps_client::PullCodec>,
    /// Momentum applied here before the codec (Deep Gradient Compression's momentum
    /// correction: the worker pushes its velocity u = m u + g and the job's tables use plain
    /// SGD, so what a sparse codec holds back is momentum, not raw gradient). 0: off.
    #[arg(long, default_value_t = 0.0)]
    pub local_momentum: f32,
    /// Sparsity warm-up (Deep Gradient Compression) over this many epochs of the job: top-k
    /// and random-k tables push 25% of their values at first, falling geometrically to their
    /// codec's ratio. 0: off.
    #[arg(long, default_value_t = 0.0)]
    pub sparsity_warmup: f64,
    /// How the step size moves over the job: constant, or cosine decay to 0 (applied by
    /// scaling the gradients: for sgd and momentum tables only).
    #[arg(long, value_enum, default_value_t = LrSchedule::Constant)]
    pub lr_schedule: LrSchedule,
    /// Where the model computes: auto (CUDA when a device works, else the CPU), cpu, cuda:N.
    #[arg(long, env = "PS_DEVICE", default_value = "auto")]
    pub device: DeviceChoice,
    /// Batches the data thread prepares ahead of the trainer.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
    pub prefetch_depth: u32,
    /// TLS (--tls-ca, and --tls-cert/--tls-key for mutual TLS) and the token
    /// (--token-file or PS_TOKEN) of every connection to the scheduler and the shards.
    #[command(flatten)]
    pub security: ps_runtime::service::ClientSecurity,
}

impl WorkerConfig {
    /// Refuses settings outside their range, naming the flag.
    pub fn check(&self) -> anyhow::Result<()> {
        let check = |ok: bool, what: &str| {
            if ok {
                Ok(())
            } else {
                Err(anyhow::anyhow!("{what}"))
            }
        };
        check(
            (0.0..=1.0).contains(&self.straggler_prob),
            "--straggler-prob is a probability: 0 to 1",
        )?;
        check(
            self.straggler_factor >= 1.0 && self.straggler_factor.is_finite(),
            "--straggler-factor must be at least 1",
        )?;
        check(
            self.slowdown >= 1.0 && self.slowdown.is_finite(),
            "--slowdown must be at least 1",
        )?;
        check(
            (0.0..1.0).contains(&self.local_momentum),
            "--local-momentum must be in [0, 1)",
        )?;
        check(
            self.sparsity_warmup >= 0.0 && self.sparsity_warmup.is_finite(),
            "--sparsity-warmup is a number of epochs, at least 0",
        )?;
        check(
            self.link_mbps.is_none_or(|m| m > 0.0 && m.is_finite()),
            "--link-mbps must be a positive number",
        )?;
        check(
            self.link_speed_mbps
                .is_none_or(|m| m > 0.0 && m.is_finite()),
            "--link-speed-mbps must be a positive number",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        cfg: WorkerConfig,
    }

    fn parse(args: &[&str]) -> Result<WorkerConfig, clap::Error> {
        Cli::try_parse_from(std::iter::once("worker").chain(args.iter().copied())).map(|c| c.cfg)
    }

    #[test]
    fn flags_are_the_config_and_bad_values_are_refused_by_name() {
        let c = parse(&["--job", "j", "--no-error-feedback", "--batch", "32"]).unwrap();
        assert_eq!((c.job.as_str(), c.default_batch), ("j", 32));
        assert!(!c.error_feedback);
        assert!(c.name.starts_with("worker-"));
        assert!(parse(&["--job", "j"]).unwrap().error_feedback);
        assert!(parse(&["--job", "j", "--micro-batches", "0"]).is_err());
        for (flag, value) in [
            ("--straggler-prob", "1.5"),
            ("--straggler-factor", "0.5"),
            ("--slowdown", "0"),
            ("--local-momentum", "1"),
            ("--link-mbps", "0"),
            ("--link-speed-mbps", "0"),
        ] {
            let e = parse(&["--job", "j", flag, value])
                .unwrap()
                .check()
                .unwrap_err();
            assert!(e.to_string().contains(flag), "{flag}: {e}");
        }
        assert_eq!(
            parse(&["--job", "j", "--pull-codec", "delta-topk:0.1"])
                .unwrap()
                .pull_codec,
            Some(ps_client::PullCodec::DeltaTopK { ratio: 0.1 })
        );
        assert_eq!(
            parse(&["--job", "j", "--pull-codec", "int8"])
                .unwrap()
                .pull_codec,
            Some(ps_client::PullCodec::Int8)
        );
        let e = parse(&["--job", "j", "--pull-codec", "sign"]).unwrap_err();
        assert!(e.to_string().contains("not a pull codec"), "{e}");
        let d = parse(&["--job", "j", "--name", "w"]).unwrap();
        assert_eq!((d.name.as_str(), d.prefetch_depth), ("w", 4));
        d.check().unwrap();
    }
}
