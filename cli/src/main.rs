//! `psctl`: the command-line client of the scheduler.
//!
//! Exit codes scripts can rely on: 0 done; 2 bad usage or an invalid job file; 3 the scheduler
//! cannot be reached (or is not ready); 4 no such job or checkpoint; 5 refused (the request
//! conflicts with the job's state, or the scheduler found it invalid); 1 anything else.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use ps_client::ClientError;
use ps_client::scheduler::SchedulerClient;
use ps_proto::v1 as pb;

#[derive(Debug, Parser)]
#[command(
    name = "psctl",
    version,
    about = "Controls jobs on a parameter-server scheduler"
)]
struct Cli {
    /// The scheduler's URL.
    #[arg(long, env = "PS_SCHEDULER", default_value = "http://127.0.0.1:7000")]
    scheduler: String,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Submits the job described by a TOML file.
    Submit { file: PathBuf },
    /// Shows one job (members, clocks, staleness, throughput), or every job.
    Status { job: Option<String> },
    /// Cancels a job: its workers stop at their next clock report.
    Cancel { job: String },
    /// Takes a coordinated checkpoint of a job now.
    Checkpoint { job: String },
    /// Lists a job's complete checkpoints, oldest first.
    Checkpoints { job: String },
    /// Restores a job's shards to a checkpoint (the latest by default) and restarts its workers
    /// at that clock.
    Resume {
        job: String,
        #[arg(long)]
        checkpoint: Option<String>,
    },
    /// Shows the shard map.
    Shards,
    /// Starts a whole cluster on 127.0.0.1 (a scheduler, shards and workers as child
    /// processes), trains one job to the end with a progress bar, and prints the test accuracy
    /// and where the run's files are. Needs no running scheduler.
    Local(Box<ps_cli::local::LocalArgs>),
    /// Trains the same models under each codec and consistency model, several seeds each,
    /// through local clusters, and writes EXPERIMENTS.md (mean ± std of the test accuracy,
    /// bytes pushed per step, time to a target accuracy, the targets checked) with plots.
    Experiments(Box<ps_cli::experiments::ExperimentArgs>),
}

const EXIT_USAGE: u8 = 2;
const EXIT_UNREACHABLE: u8 = 3;
const EXIT_NOT_FOUND: u8 = 4;
const EXIT_REFUSED: u8 = 5;

fn exit_code(e: &ClientError) -> u8 {
    match e.code() {
        Some(tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Unknown) => {
            EXIT_UNREACHABLE
        }
        Some(tonic::Code::NotFound) => EXIT_NOT_FOUND,
        Some(
            tonic::Code::FailedPrecondition
            | tonic::Code::AlreadyExists
            | tonic::Code::InvalidArgument,
        ) => EXIT_REFUSED,
        _ => 1,
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Usage(m)) => {
            eprintln!("psctl: {m}");
            ExitCode::from(EXIT_USAGE)
        }
        Err(Failure::Other(m)) => {
            eprintln!("psctl: {m}");
            ExitCode::FAILURE
        }
        Err(Failure::Client(e)) => {
            let code = exit_code(&e);
            if code == EXIT_UNREACHABLE {
                eprintln!(
                    "psctl: cannot reach the scheduler at {} ({e}); is it running? (set --scheduler or PS_SCHEDULER)",
                    cli.scheduler
                );
            } else {
                eprintln!("psctl: {e}");
            }
            ExitCode::from(code)
        }
    }
}

enum Failure {
    Usage(String),
    Other(String),
    Client(ClientError),
}

impl From<ClientError> for Failure {
    fn from(e: ClientError) -> Self {
        Self::Client(e)
    }
}

async fn run(cli: &Cli) -> Result<(), Failure> {
    match &cli.cmd {
        Cmd::Local(args) => return local(args, cli.json).await,
        Cmd::Experiments(args) => {
            return ps_cli::experiments::run(args)
                .await
                .map_err(|e| Failure::Other(format!("experiments: {e:#}")));
        }
        _ => {}
    }
    let s = SchedulerClient::connect(&cli.scheduler).await?;
    match &cli.cmd {
        Cmd::Submit { file } => {
            let text = std::fs::read_to_string(file)
                .map_err(|e| Failure::Usage(format!("reading {}: {e}", file.display())))?;
            let spec = ps_worker::job::job_from_toml(&text)
                .map_err(|e| Failure::Usage(format!("{}: {e}", file.display())))?;
            let st = s.submit(&spec).await?;
            if cli.json {
                print_json(&job_json(&st));
            } else {
                println!("submitted job `{}`", spec.name);
                print_job(&st);
            }
        }
        Cmd::Status { job: Some(job) } => {
            let st = s.job(job).await?;
            if cli.json {
                print_json(&job_json(&st));
            } else {
                print_job(&st);
            }
        }
        Cmd::Status { job: None } => {
            let jobs = s.jobs().await?;
            if cli.json {
                print_json(&serde_json::Value::Array(
                    jobs.iter().map(job_json).collect(),
                ));
            } else if jobs.is_empty() {
                println!("no jobs");
            } else {
                println!(
                    "{:<24} {:<10} {:<8} {:>7} {:>7} {:>8} {:>9}",
                    "JOB", "STATE", "MODEL", "WORKERS", "MIN", "MAX", "ADV/S"
                );
                for j in &jobs {
                    let spec = j.spec.clone().unwrap_or_default();
                    println!(
                        "{:<24} {:<10} {:<8} {:>7} {:>7} {:>8} {:>9.1}",
                        spec.name,
                        state_name(j.state),
                        consistency(&spec),
                        j.workers.iter().filter(|w| w.live).count(),
                        j.min_clock,
                        j.max_clock,
                        j.advances_per_sec
                    );
                }
            }
        }
        Cmd::Cancel { job } => {
            let st = s.cancel(job).await?;
            println!("job `{job}` is {}", state_name(st.state));
        }
        Cmd::Checkpoint { job } => {
            let c = s.checkpoint(job).await?;
            if cli.json {
                print_json(&checkpoint_json(&c));
            } else {
                println!(
                    "checkpoint `{}` of job `{job}` at clock {} ({} shards, {} bytes)",
                    c.name,
                    c.clock,
                    c.shards.len(),
                    c.shards.iter().map(|x| x.bytes).sum::<u64>()
                );
            }
        }
        Cmd::Checkpoints { job } => {
            let cs = s.checkpoints(job).await?;
            if cli.json {
                print_json(&serde_json::Value::Array(
                    cs.iter().map(checkpoint_json).collect(),
                ));
            } else if cs.is_empty() {
                println!("job `{job}` has no checkpoints");
            } else {
                println!(
                    "{:<32} {:>8} {:>7} {:>12}",
                    "NAME", "CLOCK", "SHARDS", "BYTES"
                );
                for c in &cs {
                    println!(
                        "{:<32} {:>8} {:>7} {:>12}",
                        c.name,
                        c.clock,
                        c.shards.len(),
                        c.shards.iter().map(|x| x.bytes).sum::<u64>()
                    );
                }
            }
        }
        Cmd::Resume { job, checkpoint } => {
            let st = s.resume(job, checkpoint.as_deref()).await?;
            println!(
                "job `{job}` resumed from {}; workers restart at clock {}",
                if st.latest_checkpoint.is_empty() {
                    "its checkpoint".to_string()
                } else {
                    format!(
                        "`{}`",
                        checkpoint.clone().unwrap_or(st.latest_checkpoint.clone())
                    )
                },
                st.min_clock
            );
        }
        Cmd::Shards => {
            let m = s.shard_map().await?;
            if cli.json {
                print_json(&serde_json::json!({
                    "epoch": m.epoch, "num_shards": m.num_shards,
                    "virtual_nodes": m.virtual_nodes, "endpoints": m.endpoints,
                    "complete": m.complete,
                }));
            } else {
                println!(
                    "map epoch {}, {} shards ({}):",
                    m.epoch,
                    m.num_shards,
                    if m.complete { "complete" } else { "incomplete" }
                );
                for (i, e) in m.endpoints.iter().enumerate() {
                    println!(
                        "  shard {i}: {}",
                        if e.is_empty() { "(not registered)" } else { e }
                    );
                }
            }
        }
        Cmd::Local(_) | Cmd::Experiments(_) => unreachable!("handled above"),
    }
    Ok(())
}

/// `psctl local`: the whole cluster as child processes, one job to the end.
async fn local(args: &ps_cli::local::LocalArgs, json: bool) -> Result<(), Failure> {
    match ps_cli::local::run(args).await {
        Ok(o) => {
            let e = &o.result.eval;
            if json {
                print_json(&serde_json::json!({
                    "run_dir": o.run_dir, "result": o.result, "wall_s": o.wall.as_secs_f64(),
                }));
            } else {
                let auc = e.auc.map(|a| format!(", AUC {a:.4}")).unwrap_or_default();
                println!(
                    "{} on {}: test accuracy {:.2}%{auc} after {} epochs ({} clocks, {:.0} s)",
                    o.result.model,
                    o.result.dataset,
                    e.test_accuracy * 100.0,
                    e.epoch,
                    o.result.clocks,
                    o.wall.as_secs_f64()
                );
                println!(
                    "run directory: {} (eval.jsonl, curves.svg, model.safetensors, logs/)",
                    o.run_dir.display()
                );
            }
            Ok(())
        }
        Err(e) => Err(Failure::Other(format!("local: {e:#}"))),
    }
}

fn state_name(s: i32) -> &'static str {
    match pb::JobState::try_from(s) {
        Ok(pb::JobState::Waiting) => "waiting",
        Ok(pb::JobState::Running) => "running",
        Ok(pb::JobState::Paused) => "paused",
        Ok(pb::JobState::Succeeded) => "succeeded",
        Ok(pb::JobState::Canceled) => "canceled",
        Ok(pb::JobState::Failed) => "failed",
        _ => "unknown",
    }
}

fn consistency(spec: &pb::JobSpec) -> String {
    match pb::ConsistencyModel::try_from(spec.consistency) {
        Ok(pb::ConsistencyModel::Bsp) => "BSP".into(),
        Ok(pb::ConsistencyModel::Ssp) => format!("SSP({})", spec.staleness),
        Ok(pb::ConsistencyModel::Asp) => "ASP".into(),
        _ => "?".into(),
    }
}

fn print_job(j: &pb::JobStatus) {
    let spec = j.spec.clone().unwrap_or_default();
    let st = j.staleness.unwrap_or_default();
    println!(
        "job {}  {}  {}  shards {}  map epoch {}",
        spec.name,
        state_name(j.state),
        consistency(&spec),
        spec.num_shards,
        j.map_epoch
    );
    if !j.message.is_empty() {
        println!("  {}", j.message);
    }
    println!(
        "  clocks {}..{}  {:.1} advances/s  gap max {} mean {:.2}  wait total {:.0} ms p99 {:.2} ms  param age {:.1} ms",
        j.min_clock,
        j.max_clock,
        j.advances_per_sec,
        st.max_gap,
        st.mean_gap,
        st.wait_ms_total,
        st.wait_ms_p99,
        st.param_age_ms_mean
    );
    if !j.latest_checkpoint.is_empty() {
        println!("  latest checkpoint {}", j.latest_checkpoint);
    }
    println!(
        "  {:>6} {:<16} {:<5} {:>7} {:>5} {:>6} {:>10} {:>7} {:>9} {:<12}",
        "ID", "NAME", "LIVE", "CLOCK", "GAP", "BATCH", "EX/S", "MAXGAP", "WAIT MS", "DATA"
    );
    for w in &j.workers {
        let ws = w.staleness.unwrap_or_default();
        println!(
            "  {:>6} {:<16} {:<5} {:>7} {:>5} {:>6} {:>10.0} {:>7} {:>9.1} {:<12}",
            w.worker_id,
            w.name,
            if w.live { "yes" } else { "no" },
            w.clock,
            if w.live {
                w.clock - j.min_clock.min(w.clock)
            } else {
                0
            },
            w.batch_size,
            w.examples_per_sec,
            ws.max_gap,
            ws.wait_ms_total,
            format!("{:?}", w.data_shards)
        );
    }
}

fn job_json(j: &pb::JobStatus) -> serde_json::Value {
    let spec = j.spec.clone().unwrap_or_default();
    let st = j.staleness.unwrap_or_default();
    serde_json::json!({
        "job": spec.name,
        "state": state_name(j.state),
        "message": j.message,
        "consistency": consistency(&spec),
        "min_clock": j.min_clock,
        "max_clock": j.max_clock,
        "map_epoch": j.map_epoch,
        "advances_per_sec": j.advances_per_sec,
        "latest_checkpoint": j.latest_checkpoint,
        "staleness": {
            "max_gap": st.max_gap, "mean_gap": st.mean_gap, "wait_ms_total": st.wait_ms_total,
            "wait_ms_p99": st.wait_ms_p99, "param_age_ms_mean": st.param_age_ms_mean,
            "advances": st.advances,
        },
        "workers": j.workers.iter().map(|w| serde_json::json!({
            "id": w.worker_id, "name": w.name, "live": w.live, "clock": w.clock,
            "data_shards": w.data_shards, "batch_size": w.batch_size,
            "examples_per_sec": w.examples_per_sec,
            "max_gap": w.staleness.unwrap_or_default().max_gap,
        })).collect::<Vec<_>>(),
    })
}

fn checkpoint_json(c: &pb::JobCheckpoint) -> serde_json::Value {
    serde_json::json!({
        "job": c.job, "name": c.name, "clock": c.clock, "created_unix_ms": c.created_unix_ms,
        "map_epoch": c.map_epoch,
        "shards": c.shards.iter().map(|s| serde_json::json!({
            "shard": s.shard_index, "endpoint": s.endpoint, "name": s.name, "path": s.path,
            "files": s.files, "bytes": s.bytes, "sequence": s.sequence,
        })).collect::<Vec<_>>(),
    })
}

fn print_json(v: &serde_json::Value) {
    println!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
}
