//! `psctl local`: a whole cluster on 127.0.0.1 as real child processes (a scheduler, the
//! shards, the workers) training one job to the end, with a progress bar, then the test
//! accuracy and the run directory.
//!
//! The binaries are found next to the running executable (`target/release/` after
//! `cargo build --release`). Every process logs to `<run>/logs/`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use indicatif::{ProgressBar, ProgressStyle};
use ps_client::scheduler::SchedulerClient;
use ps_core::JobSpec;
use ps_launch::{Service, binary};
use ps_runtime::auth::Role;

use ps_worker::data::DatasetSpec;
use ps_worker::run::{EvalRecord, FinalRecord};
use ps_worker::{LrSchedule, SspRefresh};

/// What `psctl local` trains, and how.
#[derive(Debug, Clone, clap::Args)]
pub struct LocalArgs {
    /// A job file (TOML) to train instead of the flags below (its name, model, data set and
    /// tables; `--epochs` still sets its length when it has no max_clocks).
    #[arg(long)]
    pub job: Option<PathBuf>,
    /// The job's name.
    #[arg(long, default_value = "local")]
    pub name: String,
    /// The model: softmax, mlp:H1,H2,..., sparse-lr or wide-deep:DIM[:H1,...].
    #[arg(long, default_value = "mlp:256")]
    pub model: String,
    /// The data set: fashion-mnist, adult, idx:DIR, libsvm:TRAIN[,TEST],
    /// synthetic-dense:N:DIM:CLASSES or synthetic-ctr:N:IDS:FIELDS.
    #[arg(long, default_value = "fashion-mnist")]
    pub dataset: String,
    /// Where the data set's files are (Fashion-MNIST's directory, or the Adult file).
    #[arg(long)]
    pub data: Option<PathBuf>,
    #[arg(long, default_value_t = 20.0)]
    pub epochs: f64,
    /// Examples per clock over all workers.
    #[arg(long, default_value_t = 128)]
    pub batch: u64,
    #[arg(long, default_value_t = 2)]
    pub workers: u32,
    #[arg(long, default_value_t = 2)]
    pub shards: u32,
    /// bsp, ssp or asp.
    #[arg(long, default_value = "bsp")]
    pub consistency: String,
    /// The SSP bound.
    #[arg(long, default_value_t = 3)]
    pub staleness: u64,
    /// The shards' optimizer for the model's tables: sgd, momentum, adagrad, adam, ftrl.
    #[arg(long, default_value = "momentum")]
    pub optimizer: String,
    #[arg(long, default_value_t = 0.05)]
    pub lr: f32,
    /// The gradient codec of every table (f32, fp16, bf16, int8, int4, sign, qsgd, topk:0.01,
    /// ...).
    #[arg(long, default_value = "f32")]
    pub codec: String,
    /// How every table's pulls come back: f32, fp16, bf16, int8 (a byte a value, a scale per
    /// block of whole rows), int4 (half a byte a value, the same scales), or delta-topk:R (dense tables as the top R of each chunk's change
    /// since the worker's last pull; sparse tables then in fp16).
    #[arg(long, default_value = "f32")]
    pub pull_codec: String,
    /// How the sparse tables' rows come back, where it should differ from --pull-codec: f32,
    /// fp16, bf16, int8 or int4 (with --pull-codec delta-topk:R, the dense tables' delta pulls
    /// beside compact rows).
    #[arg(long, default_value = "")]
    pub row_pull_codec: String,
    /// Give workers batches in proportion to their measured throughput.
    #[arg(long)]
    pub balance: bool,
    /// A coordinated checkpoint every this many clocks (0: none).
    #[arg(long, default_value_t = 0)]
    pub checkpoint_every: u64,
    /// The newest checkpoints kept; older ones are deleted (0: all).
    #[arg(long, default_value_t = 0)]
    pub keep_checkpoints: u32,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Where the run's files go (default: runs/<name>-<unix time>).
    #[arg(long)]
    pub run_dir: Option<PathBuf>,
    /// Clocks between evaluations (0: once per epoch).
    #[arg(long, default_value_t = 0)]
    pub eval_every: u64,
    /// Emulated link speed of each worker, in megabits per second.
    #[arg(long)]
    pub link_mbps: Option<f64>,
    /// MiB each worker keeps for each sparse table's row residuals under a lossy codec.
    #[arg(long)]
    pub row_residual_mib: Option<u32>,
    /// MiB each worker keeps for each sparse table's rows from its pulls (pulls then get only
    /// the rows that changed; 0: none kept; the worker's default otherwise).
    #[arg(long)]
    pub held_rows_mib: Option<u32>,
    /// Probability that a worker's clock takes --straggler-factor times longer.
    #[arg(long, default_value_t = 0.0)]
    pub straggler_prob: f64,
    #[arg(long, default_value_t = 4.0)]
    pub straggler_factor: f64,
    /// Make the last worker this many times slower (a persistently slow machine).
    #[arg(long, default_value_t = 1.0)]
    pub slow_worker: f64,
    /// Under SSP: the workers pull the dense tables at every clock, or only when the
    /// staleness bound requires it (fewer pulls, lower accuracy).
    #[arg(long, value_enum, default_value_t = SspRefresh::EveryClock)]
    pub ssp_refresh: SspRefresh,
    /// Lossy codecs without the error-feedback residual (to measure what it buys).
    #[arg(long)]
    pub no_error_feedback: bool,
    /// Momentum correction (Deep Gradient Compression): the workers apply the momentum (0.9)
    /// before the codec and the shards plain SGD at --lr. Needs --optimizer momentum; pays
    /// with sparse codecs, whose error feedback the shards' momentum would amplify.
    #[arg(long)]
    pub momentum_correction: bool,
    /// Sparsity warm-up over this many epochs: top-k and random-k tables push 25% of their
    /// values at first, falling geometrically to the codec's ratio. 0: off.
    #[arg(long, default_value_t = 0.0)]
    pub sparsity_warmup: f64,
    /// How the step size moves over the job: constant, or cosine decay to 0 (the workers scale
    /// their gradients: for sgd and momentum tables only).
    #[arg(long, value_enum, default_value_t = LrSchedule::Constant)]
    pub lr_schedule: LrSchedule,
    /// Where the workers compute: auto (CUDA when a device works, else the CPU), cpu, cuda:N.
    #[arg(long, default_value = "auto")]
    pub device: ps_worker::backend::DeviceChoice,
    /// No progress bar (for logs and scripts).
    #[arg(long)]
    pub quiet: bool,
    /// Keep the shards' data directories (`<run>/shard-N`: their RocksDB, push log and body
    /// ring) once the run ends. By default they are removed after a run that ended well
    /// unless the job takes checkpoints, which live there: each shard reserves its push log
    /// and body ring whole on disk (1 GiB each by default), so a few runs would fill a small
    /// disk. The run's results (`final.json`, `eval.jsonl`, `model.safetensors`, `logs/`) stay.
    #[arg(long)]
    pub keep_data: bool,
    /// Mutual TLS on every connection, with the certificates `scripts/dev-certs.sh DIR` made
    /// (ca.pem; server.pem and server.key serve and identify every process).
    #[arg(long)]
    pub tls_dir: Option<PathBuf>,
    /// A bearer token for every process (the scheduler and psctl operators, the shards, the
    /// workers), checked by every service: `<run>/security/` holds them and the tokens file.
    #[arg(long)]
    pub auth: bool,
}

/// What a local cluster's processes are started with to run with TLS and tokens.
#[derive(Debug, Clone, Default)]
pub struct LocalSecurity {
    /// dev-certs.sh's directory: mutual TLS everywhere.
    pub tls_dir: Option<PathBuf>,
    /// `<run>/security/` when every process has a token.
    pub tokens_dir: Option<PathBuf>,
}

/// The token holders of a local cluster: name, role, file.
const LOCAL_TOKENS: [(&str, Role); 4] = [
    ("scheduler", Role::Operator),
    ("psctl", Role::Operator),
    ("shards", Role::Shard),
    ("workers", Role::Worker),
];

impl LocalSecurity {
    /// Makes the tokens (when `auth`) under `<run_dir>/security/`.
    pub fn new(tls_dir: Option<&Path>, auth: bool, run_dir: &Path) -> anyhow::Result<Self> {
        let tls_dir = match tls_dir {
            Some(d) => Some(
                d.canonicalize()
                    .with_context(|| format!("--tls-dir {}", d.display()))?,
            ),
            None => None,
        };
        let tokens_dir = if auth {
            let dir = run_dir.join("security");
            std::fs::create_dir_all(&dir)?;
            let mut entries = String::new();
            for (name, role) in LOCAL_TOKENS {
                let token = ps_runtime::auth::new_token()?;
                std::fs::write(dir.join(format!("{name}.token")), format!("{token}\n"))?;
                entries.push_str(&ps_runtime::auth::token_entry(
                    name,
                    role,
                    &["*".to_owned()],
                    &token,
                ));
            }
            std::fs::write(dir.join("tokens.toml"), entries)?;
            Some(dir.canonicalize()?)
        } else {
            None
        };
        Ok(Self {
            tls_dir,
            tokens_dir,
        })
    }

    /// The flags of the process holding token `who`; `service`: it serves (TLS on its ports,
    /// client certificates required, the tokens file checked).
    fn args(&self, who: &str, service: bool) -> Vec<String> {
        let mut a = Vec::new();
        if let Some(d) = &self.tls_dir {
            for (flag, file) in [
                ("--tls-ca", "ca.pem"),
                ("--tls-cert", "server.pem"),
                ("--tls-key", "server.key"),
            ] {
                a.extend([flag.to_owned(), d.join(file).display().to_string()]);
            }
            if service {
                a.extend([
                    "--tls-client-ca".to_owned(),
                    d.join("ca.pem").display().to_string(),
                ]);
            }
        }
        if let Some(d) = &self.tokens_dir {
            a.extend([
                "--token-file".to_owned(),
                d.join(format!("{who}.token")).display().to_string(),
            ]);
            if service {
                a.extend([
                    "--auth-tokens".to_owned(),
                    d.join("tokens.toml").display().to_string(),
                ]);
            }
        }
        a
    }

    /// What psctl's own calls carry.
    fn credentials(&self) -> anyhow::Result<ps_client::Credentials> {
        let d = self.tls_dir.as_ref();
        ps_runtime::service::ClientSecurity {
            tls_ca: d.map(|d| d.join("ca.pem")),
            tls_cert: d.map(|d| d.join("server.pem")),
            tls_key: d.map(|d| d.join("server.key")),
            token_file: self.tokens_dir.as_ref().map(|t| t.join("psctl.token")),
        }
        .credentials()
    }
}

/// How long a service may take to become ready (a shard replays its log first).
const READY: Duration = Duration::from_secs(60);
/// How long a stopping service may take to drain and close its store.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// A scheduler and its shards on 127.0.0.1, as child processes writing under one run
/// directory; workers are added with [`Cluster::worker`]. Every service binds a port of its
/// own choosing and announces it (`--ready-file`).
#[derive(Debug)]
pub struct Cluster {
    pub run_dir: PathBuf,
    pub logs: PathBuf,
    pub scheduler_url: String,
    security: LocalSecurity,
    worker_bin: PathBuf,
    scheduler: Service,
    shards: Vec<Service>,
}

impl Cluster {
    /// Starts the scheduler and `num_shards` shards and waits until every shard registered.
    pub async fn start(run_dir: &Path, num_shards: u32) -> anyhow::Result<Self> {
        Self::start_secure(run_dir, num_shards, LocalSecurity::default()).await
    }

    /// [`Cluster::start`] with every process started with `security`'s TLS and tokens.
    pub async fn start_secure(
        run_dir: &Path,
        num_shards: u32,
        security: LocalSecurity,
    ) -> anyhow::Result<Self> {
        let (scheduler_bin, shard_bin, worker_bin) = (
            binary("scheduler")?,
            binary("ps-server")?,
            binary("worker")?,
        );
        let logs = run_dir.join("logs");
        std::fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;
        let run_dir = run_dir.canonicalize()?;
        let logs = run_dir.join("logs");
        let mut scheduler = Service::spawn(
            &scheduler_bin,
            "scheduler",
            &[
                vec![
                    "--listen".into(),
                    "127.0.0.1:0".into(),
                    "--data-dir".into(),
                    run_dir.join("scheduler").display().to_string(),
                ],
                security.args("scheduler", true),
            ]
            .concat(),
            &logs,
            true,
        )?;
        let scheduler_url = scheduler.ready(READY).await?.url();
        let mut shards = Vec::new();
        for i in 0..num_shards {
            shards.push(Service::spawn(
                &shard_bin,
                &format!("shard-{i}"),
                &[
                    vec![
                        "--listen".into(),
                        "127.0.0.1:0".into(),
                        "--data-dir".into(),
                        run_dir.join(format!("shard-{i}")).display().to_string(),
                        "--shard-index".into(),
                        i.to_string(),
                        "--num-shards".into(),
                        num_shards.to_string(),
                        "--scheduler".into(),
                        scheduler_url.clone(),
                    ],
                    security.args("shards", true),
                ]
                .concat(),
                &logs,
                true,
            )?);
        }
        for s in &mut shards {
            s.ready(READY).await?;
        }
        let mut c = Self {
            run_dir,
            logs,
            scheduler_url,
            security,
            worker_bin,
            scheduler,
            shards,
        };
        let sched = c.client().await?;
        let deadline = Instant::now() + READY;
        while !sched.shard_map().await.is_ok_and(|m| m.complete) {
            // A process that died at start says why in its log.
            c.check()?;
            if Instant::now() > deadline {
                bail!(
                    "the shards did not register within {READY:?}; see {}",
                    c.logs.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(c)
    }

    pub async fn client(&self) -> anyhow::Result<SchedulerClient> {
        Ok(
            SchedulerClient::connect_with(&self.scheduler_url, None, self.security.credentials()?)
                .await?,
        )
    }

    /// Starts a worker process named `name` for `job`, with extra `worker` flags.
    pub fn worker(&self, job: &str, name: &str, extra: &[String]) -> anyhow::Result<Service> {
        let mut args = vec![
            "--scheduler".into(),
            self.scheduler_url.clone(),
            "--job".into(),
            job.to_owned(),
            "--name".into(),
            name.to_owned(),
            "--run-dir".into(),
            self.run_dir.display().to_string(),
        ];
        args.extend_from_slice(extra);
        args.extend(self.security.args("workers", false));
        Service::spawn(&self.worker_bin, name, &args, &self.logs, false)
    }

    /// An error when the scheduler or a shard has exited.
    pub fn check(&mut self) -> anyhow::Result<()> {
        for p in std::iter::once(&mut self.scheduler).chain(self.shards.iter_mut()) {
            p.check()?;
        }
        Ok(())
    }

    /// Stops the shards and the scheduler (SIGTERM, then a grace period), all at once.
    pub async fn stop(self) {
        let Self {
            scheduler, shards, ..
        } = self;
        futures::future::join_all(
            shards
                .into_iter()
                .chain(std::iter::once(scheduler))
                .map(|s| s.stop(STOP_GRACE)),
        )
        .await;
    }
}

/// The job the flags describe, as a job file would say it.
fn job_toml(a: &LocalArgs) -> String {
    format!(
        r#"name = "{name}"
consistency = "{consistency}"
staleness = {staleness}
num_shards = {shards}
num_workers = {workers}
dataset = "{dataset}"
model = "{model}"
global_batch = {batch}
balance_batches = {balance}
checkpoint_every = {ckpt}
keep_checkpoints = {keep}
seed = {seed}

[model_tables]
optimizer = "{optimizer}"
learning_rate = {lr}
codec = "{codec}"
pull_codec = "{pull_codec}"
row_pull_codec = "{row_pull_codec}"
"#,
        name = a.name,
        consistency = a.consistency,
        staleness = if a.consistency == "ssp" {
            a.staleness
        } else {
            0
        },
        shards = a.shards,
        workers = a.workers,
        dataset = a.dataset,
        model = a.model,
        batch = a.batch,
        balance = a.balance,
        ckpt = a.checkpoint_every,
        keep = a.keep_checkpoints,
        seed = a.seed,
        optimizer = if a.momentum_correction {
            "sgd"
        } else {
            a.optimizer.as_str()
        },
        lr = a.lr,
        codec = a.codec,
        pull_codec = a.pull_codec,
        row_pull_codec = a.row_pull_codec,
    )
}

/// The result of a local run.
#[derive(Debug, Clone)]
pub struct LocalOutcome {
    pub run_dir: PathBuf,
    pub result: FinalRecord,
    pub wall: Duration,
}

/// Removes a stopped cluster's shard data directories (`<run>/shard-N`), leaving the rest of
/// the run directory.
pub fn remove_shard_data(run: &Path) -> anyhow::Result<()> {
    for entry in std::fs::read_dir(run).with_context(|| format!("listing {}", run.display()))? {
        let entry = entry?;
        if entry.file_name().to_string_lossy().starts_with("shard-") && entry.path().is_dir() {
            std::fs::remove_dir_all(entry.path())
                .with_context(|| format!("removing {}", entry.path().display()))?;
        }
    }
    Ok(())
}

/// Runs the local cluster to the end of its job.
pub async fn run(a: &LocalArgs) -> anyhow::Result<LocalOutcome> {
    let started = Instant::now();
    if a.momentum_correction && (a.optimizer != "momentum" || a.job.is_some()) {
        bail!(
            "--momentum-correction moves the momentum optimizer to the workers: it needs \
             --optimizer momentum and no --job file"
        );
    }
    let text = match &a.job {
        Some(f) => {
            std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?
        }
        None => job_toml(a),
    };
    let mut spec: JobSpec =
        ps_worker::job::job_from_toml(&text).map_err(|e| anyhow::anyhow!("{e}"))?;
    // Load the data here first: a missing data set is reported before anything starts.
    let dataset = DatasetSpec::parse(&spec.dataset)?;
    let data_dir = a.data.clone();
    let seed = spec.seed;
    let split =
        tokio::task::spawn_blocking(move || dataset.load(data_dir.as_deref(), seed)).await??;
    // Examples per clock over all workers (a worker's default batch is 64).
    let batch = if spec.global_batch > 0 {
        spec.global_batch
    } else {
        64 * u64::from(spec.num_workers)
    };
    if spec.max_clocks == 0 {
        spec.max_clocks = ((a.epochs * split.train.len() as f64) / batch as f64)
            .ceil()
            .max(1.0) as u64;
    }
    let run_dir = match &a.run_dir {
        Some(d) => d.clone(),
        None => {
            let secs = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_secs();
            PathBuf::from("runs").join(format!("{}-{secs}", spec.name))
        }
    };
    let security = LocalSecurity::new(a.tls_dir.as_deref(), a.auth, &run_dir)?;
    let mut cluster = Cluster::start_secure(&run_dir, spec.num_shards, security).await?;
    let run_dir = cluster.run_dir.clone();
    if !a.quiet {
        eprintln!(
            "training {} on {} ({} train / {} test examples): {} shards, {} workers, {}, {} clocks of {} examples; logs in {}",
            spec.model,
            spec.dataset,
            split.train.len(),
            split.test.len(),
            spec.num_shards,
            spec.num_workers,
            spec.consistency,
            spec.max_clocks,
            spec.global_batch,
            cluster.logs.display()
        );
    }
    drop(split);
    let sched = cluster.client().await?;
    sched.submit(&spec).await?;

    // The workers.
    let mut workers = Vec::new();
    for i in 0..spec.num_workers {
        let mut args = vec![
            "--eval-every".into(),
            a.eval_every.to_string(),
            "--straggler-prob".into(),
            a.straggler_prob.to_string(),
            "--straggler-factor".into(),
            a.straggler_factor.to_string(),
        ];
        if i == 0 {
            args.push("--evaluate".into());
        }
        if let Some(d) = &a.data {
            args.extend(["--data".into(), d.display().to_string()]);
        }
        if let Some(l) = a.link_mbps {
            args.extend(["--link-mbps".into(), l.to_string()]);
        }
        if let Some(m) = a.row_residual_mib {
            args.extend(["--row-residual-mib".into(), m.to_string()]);
        }
        if let Some(m) = a.held_rows_mib {
            args.extend(["--held-rows-mib".into(), m.to_string()]);
        }
        args.extend(["--ssp-refresh".into(), a.ssp_refresh.to_string()]);
        args.extend(["--device".into(), a.device.to_string()]);
        if a.momentum_correction {
            args.extend(["--local-momentum".into(), "0.9".into()]);
        }
        args.extend(["--lr-schedule".into(), a.lr_schedule.to_string()]);
        if a.sparsity_warmup > 0.0 {
            args.extend(["--sparsity-warmup".into(), a.sparsity_warmup.to_string()]);
        }
        if a.no_error_feedback {
            args.push("--no-error-feedback".into());
        }
        if i + 1 == spec.num_workers && a.slow_worker > 1.0 {
            args.extend(["--slowdown".into(), a.slow_worker.to_string()]);
        }
        workers.push(cluster.worker(&spec.name, &format!("w{i}"), &args)?);
    }

    let bar = if a.quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(spec.max_clocks)
    };
    bar.set_style(
        ProgressStyle::with_template(
            "{elapsed_precise} [{bar:30}] clock {pos}/{len}  {msg}  eta {eta}",
        )
        .expect("a valid template")
        .progress_chars("=> "),
    );
    let eval_path = run_dir.join("eval.jsonl");
    loop {
        let mut running = 0;
        for w in &mut workers {
            match w.exited()? {
                None => running += 1,
                Some(s) if s.success() => {}
                Some(s) => {
                    bar.abandon();
                    bail!("worker {} exited with {s}:\n{}", w.name(), w.tail());
                }
            }
        }
        cluster.check()?;
        if running == 0 {
            break;
        }
        if let Ok(st) = sched.job(&spec.name).await {
            bar.set_position(st.min_clock.min(spec.max_clocks));
            let rate = bar.per_sec() * batch as f64;
            let last: Option<EvalRecord> = std::fs::read_to_string(&eval_path)
                .ok()
                .and_then(|t| t.lines().last().and_then(|l| serde_json::from_str(l).ok()));
            let msg = match last {
                Some(e) => format!(
                    "loss {:.3}  test acc {:.2}%  {:.0} examples/s",
                    e.train_loss,
                    e.test_accuracy * 100.0,
                    rate
                ),
                None => format!("{:.0} examples/s", rate),
            };
            bar.set_message(msg);
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let fin = run_dir.join("final.json");
    let result: FinalRecord = serde_json::from_slice(
        &std::fs::read(&fin).with_context(|| format!("reading {}", fin.display()))?,
    )?;
    // The bar ends on the run's own figures, not on the last poll's rate (0 once the workers
    // stopped).
    bar.set_position(result.clocks.min(spec.max_clocks));
    bar.finish_with_message(format!(
        "test acc {:.2}%  {:.0} examples/s",
        result.eval.test_accuracy * 100.0,
        (result.clocks * batch) as f64 / result.eval.train_s.max(1e-9)
    ));
    // The scheduler's graceful stop waits for its clients' connections to close.
    drop(sched);
    futures::future::join_all(workers.into_iter().map(|w| w.stop(STOP_GRACE))).await;
    cluster.stop().await;
    if !a.keep_data && spec.checkpoint_every == 0 {
        remove_shard_data(&run_dir)?;
    }
    Ok(LocalOutcome {
        run_dir,
        result,
        wall: started.elapsed(),
    })
}
