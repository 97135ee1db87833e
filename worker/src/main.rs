//! `worker`: one training worker of a job. It joins the job at the scheduler, trains on the data
//! shards the scheduler assigns, and leaves when the job ends.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use ps_worker::{LrSchedule, SspRefresh, WorkerConfig};

#[derive(Debug, Parser)]
#[command(name = "worker", version, about = "A parameter-server training worker")]
struct Args {
    /// The scheduler's URL.
    #[arg(long, env = "PS_SCHEDULER", default_value = "http://127.0.0.1:7000")]
    scheduler: String,
    /// The job to join.
    #[arg(long, env = "PS_JOB")]
    job: String,
    /// This worker's name in the job (default: the host name and process id).
    #[arg(long, env = "PS_WORKER_NAME")]
    name: Option<String>,
    /// Where the data set's files are, when not in their default place.
    #[arg(long, env = "PS_DATA")]
    data: Option<PathBuf>,
    /// The run directory for metrics (and, with --evaluate, results, curves and the model).
    #[arg(long, env = "PS_RUN_DIR")]
    run_dir: Option<PathBuf>,
    /// Evaluate on the test set at intervals and write the run's final results.
    #[arg(long)]
    evaluate: bool,
    /// Clocks between evaluations (0: once per epoch).
    #[arg(long, default_value_t = 0)]
    eval_every: u64,
    /// Compute each batch in this many micro-batches, accumulating the gradients.
    #[arg(long, default_value_t = 1)]
    micro_batches: usize,
    /// Examples per clock when the job sets no global batch.
    #[arg(long, default_value_t = 64)]
    batch: usize,
    /// Emulate a link of this many megabits per second for pushes and pulls.
    #[arg(long, env = "PS_LINK_MBPS")]
    link_mbps: Option<f64>,
    /// Probability that a clock is a straggler (takes --straggler-factor times longer).
    #[arg(long, default_value_t = 0.0)]
    straggler_prob: f64,
    #[arg(long, default_value_t = 4.0)]
    straggler_factor: f64,
    /// Every clock takes this many times longer (a persistently slower machine).
    #[arg(long, default_value_t = 1.0)]
    slowdown: f64,
    /// Under SSP: pull the dense tables at every clock, or only when the staleness bound
    /// requires it (fewer pulls, lower accuracy).
    #[arg(long, value_enum, default_value_t = SspRefresh::EveryClock)]
    ssp_refresh: SspRefresh,
    /// Send lossy codecs' gradients without the error-feedback residual (to measure what it
    /// buys; training is worse without it).
    #[arg(long)]
    no_error_feedback: bool,
    /// Momentum applied here before the codec (momentum correction; the job's tables should
    /// then use plain SGD). 0: off.
    #[arg(long, default_value_t = 0.0)]
    local_momentum: f32,
    /// Sparsity warm-up (Deep Gradient Compression) over this many epochs of the job: top-k
    /// and random-k tables push 25% of their values at first, falling geometrically to their
    /// codec's ratio. 0: off.
    #[arg(long, default_value_t = 0.0)]
    sparsity_warmup: f64,
    /// How the step size moves over the job: constant, or cosine decay to 0 (applied by
    /// scaling the gradients: for sgd and momentum tables only).
    #[arg(long, value_enum, default_value_t = LrSchedule::Constant)]
    lr_schedule: LrSchedule,
    /// Where the model computes: auto (CUDA when a device works, else the CPU), cpu, cuda:N.
    #[arg(long, env = "PS_DEVICE", default_value = "auto")]
    device: ps_worker::backend::DeviceChoice,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let _telemetry = ps_runtime::telemetry::init("worker");
    let a = Args::parse();
    let name = a
        .name
        .unwrap_or_else(|| format!("worker-{}", std::process::id()));
    let mut cfg = WorkerConfig::new(&a.scheduler, &a.job, &name);
    cfg.data = a.data;
    cfg.run_dir = a.run_dir;
    cfg.evaluate = a.evaluate;
    cfg.eval_every = a.eval_every;
    cfg.micro_batches = a.micro_batches.max(1);
    cfg.default_batch = a.batch.max(1);
    cfg.link_mbps = a.link_mbps;
    cfg.straggler_prob = a.straggler_prob.clamp(0.0, 1.0);
    cfg.straggler_factor = a.straggler_factor;
    cfg.slowdown = a.slowdown;
    cfg.ssp_refresh = a.ssp_refresh;
    cfg.error_feedback = !a.no_error_feedback;
    cfg.local_momentum = a.local_momentum.clamp(0.0, 0.999);
    cfg.sparsity_warmup = a.sparsity_warmup.max(0.0);
    cfg.lr_schedule = a.lr_schedule;
    cfg.device = a.device;
    let shutdown = ps_runtime::shutdown::on_signals();
    match ps_worker::run_worker(cfg, shutdown).await {
        Ok(s) => {
            tracing::info!(clocks = s.clocks, examples = s.examples, "worker done");
            if let Some(e) = s.final_eval {
                println!("test accuracy {:.4}", e.test_accuracy);
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("worker: {e:#}");
            ExitCode::FAILURE
        }
    }
}
