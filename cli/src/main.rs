//! `psctl`: the command-line client of the scheduler.
//!
//! Exit codes scripts can rely on: 0 done; 2 bad usage or an invalid job file; 3 the scheduler
//! cannot be reached (or is not ready); 4 no such job or checkpoint; 5 refused (the request
//! conflicts with the job's state, or the scheduler found it invalid); 1 anything else.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use ps_cli::print::{checkpoint_json, job_json, print_job, print_json};
use ps_client::scheduler::SchedulerClient;
use ps_client::{ClientConfig, ClientError};

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
    /// TLS to the scheduler and the shards (--tls-ca; --tls-cert and --tls-key for mutual
    /// TLS) and the token (--token-file, or PS_TOKEN).
    #[command(flatten)]
    security: ps_runtime::service::ClientSecurity,
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
    /// Deletes one of a job's checkpoints from every shard and from its list, and prints the
    /// bytes freed (a job's `keep_checkpoints` does this for the older ones by itself).
    DeleteCheckpoint { job: String, name: String },
    /// Restores a job's shards to a checkpoint (the latest by default) and restarts its workers
    /// at that clock.
    Resume {
        job: String,
        #[arg(long)]
        checkpoint: Option<String>,
    },
    /// Writes one of a job's checkpoints (the latest by default) into DIR for serving: dense
    /// tables as safetensors, sparse tables as sorted key/row files per shard, and a manifest
    /// with every file's CRC-32 (docs/EXPORT.md). With --since, an incremental export: the
    /// sparse rows changed since that earlier checkpoint and the keys gone.
    Export {
        job: String,
        dir: PathBuf,
        #[arg(long)]
        checkpoint: Option<String>,
        #[arg(long)]
        since: Option<String>,
    },
    /// Shows the shard map.
    Shards,
    /// Reads a dense table through the shards the scheduler maps and prints its length, min,
    /// max, mean and sum (with --values, every value too).
    Pull {
        table: String,
        /// Print every value (one per line; in --json, a "values" array).
        #[arg(long)]
        values: bool,
    },
    /// Starts a whole cluster on 127.0.0.1 (a scheduler, shards and workers as child
    /// processes), trains one job to the end with a progress bar, and prints the test accuracy
    /// and where the run's files are. Needs no running scheduler.
    Local(Box<ps_cli::local::LocalArgs>),
    /// Makes a bearer token: writes it to --out (readable by its owner only) and prints the
    /// entry for the services' --auth-tokens file (its SHA-256, never the token).
    Token {
        /// Who holds it, as refusals and logs name it.
        #[arg(long)]
        name: String,
        /// worker, operator, shard or reader.
        #[arg(long)]
        role: String,
        /// The jobs it may touch (comma-separated), or `*` for every job.
        #[arg(long, value_delimiter = ',', default_value = "*")]
        jobs: Vec<String>,
        /// The file the token is written to.
        #[arg(long)]
        out: PathBuf,
    },
    /// Trains the same models under each codec and consistency model, several seeds each,
    /// through local clusters, and writes EXPERIMENTS.md (mean ± std of the test accuracy,
    /// bytes pushed per step, time to a target accuracy, the targets checked) with plots.
    Experiments(Box<ps_cli::experiments::ExperimentArgs>),
}

impl Cmd {
    /// The subcommand's name, as typed.
    fn name(&self) -> &'static str {
        match self {
            Self::Submit { .. } => "submit",
            Self::Status { .. } => "status",
            Self::Cancel { .. } => "cancel",
            Self::Checkpoint { .. } => "checkpoint",
            Self::Checkpoints { .. } => "checkpoints",
            Self::DeleteCheckpoint { .. } => "delete-checkpoint",
            Self::Resume { .. } => "resume",
            Self::Export { .. } => "export",
            Self::Shards => "shards",
            Self::Pull { .. } => "pull",
            Self::Local(_) => "local",
            Self::Token { .. } => "token",
            Self::Experiments(_) => "experiments",
        }
    }
}

const EXIT_USAGE: u8 = 2;
const EXIT_UNREACHABLE: u8 = 3;
const EXIT_NOT_FOUND: u8 = 4;
const EXIT_REFUSED: u8 = 5;
const EXIT_DENIED: u8 = 6;

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
        Some(tonic::Code::Unauthenticated | tonic::Code::PermissionDenied) => EXIT_DENIED,
        _ => 1,
    }
}

// Two threads: the trace exporter flushes on one while the command ends on the other.
#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    // With a collector set, a command is one trace: its calls to the scheduler under one span.
    let _telemetry = std::env::var_os("OTEL_EXPORTER_OTLP_ENDPOINT")
        .map(|_| ps_runtime::telemetry::init("psctl", &Default::default()));
    let span = tracing::info_span!("psctl", command = cli.cmd.name());
    match tracing::Instrument::instrument(run(&cli), span).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::NotFound(m)) => {
            eprintln!("psctl: {m}");
            ExitCode::from(EXIT_NOT_FOUND)
        }
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
            } else if cli.security.tls_ca.is_none() && e.to_string().contains("h2 protocol error") {
                // What a plaintext client reads from a TLS port.
                eprintln!(
                    "psctl: {e} (does the scheduler serve TLS? pass --tls-ca, or set PS_TLS_CA)"
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
    NotFound(String),
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
        Cmd::Token {
            name,
            role,
            jobs,
            out,
        } => return token(name, role, jobs, out),
        _ => {}
    }
    let credentials = cli
        .security
        .credentials()
        .map_err(|e| Failure::Usage(format!("{e:#}")))?;
    let s = SchedulerClient::connect_with(&cli.scheduler, None, credentials).await?;
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
                ps_cli::outln!("submitted job `{}`", spec.name);
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
                ps_cli::outln!("no jobs");
            } else {
                ps_cli::outln!(
                    "{:<24} {:<10} {:<8} {:>7} {:>7} {:>8} {:>9}",
                    "JOB",
                    "STATE",
                    "MODEL",
                    "WORKERS",
                    "MIN",
                    "MAX",
                    "ADV/S"
                );
                for j in &jobs {
                    ps_cli::outln!(
                        "{:<24} {:<10} {:<8} {:>7} {:>7} {:>8} {:>9.1}",
                        j.spec.name,
                        j.state,
                        j.spec.consistency,
                        j.live().count(),
                        j.min_clock,
                        j.max_clock,
                        j.advances_per_sec
                    );
                }
            }
        }
        Cmd::Cancel { job } => {
            let st = s.cancel(job).await?;
            ps_cli::outln!("job `{job}` is {}", st.state);
        }
        Cmd::Checkpoint { job } => {
            let c = s.checkpoint(job).await?;
            if cli.json {
                print_json(&checkpoint_json(&c));
            } else {
                ps_cli::outln!(
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
                ps_cli::outln!("job `{job}` has no checkpoints");
            } else {
                ps_cli::outln!(
                    "{:<32} {:>8} {:>7} {:>12}",
                    "NAME",
                    "CLOCK",
                    "SHARDS",
                    "BYTES"
                );
                for c in &cs {
                    ps_cli::outln!(
                        "{:<32} {:>8} {:>7} {:>12}",
                        c.name,
                        c.clock,
                        c.shards.len(),
                        c.shards.iter().map(|x| x.bytes).sum::<u64>()
                    );
                }
            }
        }
        Cmd::DeleteCheckpoint { job, name } => {
            let freed = s.delete_checkpoint(job, name).await?;
            if cli.json {
                print_json(&serde_json::json!({ "job": job, "name": name, "freed_bytes": freed }));
            } else {
                ps_cli::outln!("checkpoint `{name}` of job `{job}` deleted ({freed} bytes freed)");
            }
        }
        Cmd::Resume { job, checkpoint } => {
            let st = s.resume(job, checkpoint.as_deref()).await?;
            ps_cli::outln!(
                "job `{job}` resumed from {}; workers restart at clock {}",
                match checkpoint.clone().or(st.latest_checkpoint) {
                    Some(name) => format!("`{name}`"),
                    None => "its checkpoint".to_string(),
                },
                st.min_clock
            );
        }
        Cmd::Export {
            job,
            dir,
            checkpoint,
            since,
        } => {
            let ps = s.ps_client(ClientConfig::new(Vec::<String>::new())).await?;
            let args = ps_cli::export::ExportArgs {
                job,
                dir,
                checkpoint: checkpoint.as_deref(),
                since: since.as_deref(),
            };
            let m = ps_cli::export::run(&s, &ps, &args).await.map_err(|e| {
                if let Some(n) = e.downcast_ref::<ps_cli::export::NoSuchCheckpoint>() {
                    return Failure::NotFound(format!("export: {n}"));
                }
                match e.downcast::<ClientError>() {
                    Ok(c) => Failure::Client(c),
                    Err(e) => Failure::Other(format!("export: {e:#}")),
                }
            })?;
            if cli.json {
                print_json(&serde_json::to_value(&m).unwrap_or_default());
            } else {
                ps_cli::outln!("{}", ps_cli::export::describe(&m, dir));
            }
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
                ps_cli::outln!(
                    "map epoch {}, {} shards ({}):",
                    m.epoch,
                    m.num_shards,
                    if m.complete { "complete" } else { "incomplete" }
                );
                for (i, e) in m.endpoints.iter().enumerate() {
                    ps_cli::outln!(
                        "  shard {i}: {}",
                        if e.is_empty() { "(not registered)" } else { e }
                    );
                }
            }
        }
        Cmd::Pull { table, values } => {
            let ps = s.ps_client(ClientConfig::new(Vec::<String>::new())).await?;
            let v = ps.pull_dense(table).await?;
            let (min, max, sum) = v.iter().fold(
                (f64::INFINITY, f64::NEG_INFINITY, 0.0),
                |(lo, hi, sum), &x| {
                    let x = f64::from(x);
                    (lo.min(x), hi.max(x), sum + x)
                },
            );
            let mean = sum / v.len().max(1) as f64;
            if cli.json {
                let mut o = serde_json::json!({
                    "table": table, "len": v.len(), "min": min, "max": max,
                    "mean": mean, "sum": sum,
                });
                if *values {
                    o["values"] = serde_json::json!(v);
                }
                print_json(&o);
            } else {
                ps_cli::outln!(
                    "table `{table}`: {} values, min {min}, max {max}, mean {mean}, sum {sum}",
                    v.len()
                );
                if *values {
                    for x in &v {
                        ps_cli::outln!("{x}");
                    }
                }
            }
        }
        Cmd::Local(_) | Cmd::Experiments(_) | Cmd::Token { .. } => unreachable!("handled above"),
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
                ps_cli::outln!(
                    "{} on {}: test accuracy {:.2}%{auc} after {} epochs ({} clocks, {:.0} s)",
                    o.result.model,
                    o.result.dataset,
                    e.test_accuracy * 100.0,
                    e.epoch,
                    o.result.clocks,
                    o.wall.as_secs_f64()
                );
                ps_cli::outln!(
                    "run directory: {} (eval.jsonl, curves.svg, model.safetensors, logs/)",
                    o.run_dir.display()
                );
            }
            Ok(())
        }
        Err(e) => Err(Failure::Other(format!("local: {e:#}"))),
    }
}

/// `psctl token`: a new random token in `out` (mode 0600) and its tokens-file entry on stdout.
fn token(name: &str, role: &str, jobs: &[String], out: &std::path::Path) -> Result<(), Failure> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let Some(role) = ps_runtime::auth::Role::parse(role) else {
        return Err(Failure::Usage(format!(
            "--role {role}: one of worker, operator, shard, reader"
        )));
    };
    let secret = ps_runtime::auth::new_token().map_err(|e| Failure::Other(e.to_string()))?;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(out)
        .map_err(|e| Failure::Usage(format!("--out {}: {e}", out.display())))?;
    writeln!(f, "{secret}").map_err(|e| Failure::Other(format!("{}: {e}", out.display())))?;
    ps_cli::outln!(
        "{}",
        ps_runtime::auth::token_entry(name, role, jobs, &secret).trim_end()
    );
    Ok(())
}
