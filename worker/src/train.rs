//! The training loop of one worker: join the job, then per clock pull what the step needs
//! (dense tables when the cache is older than the consistency bound allows; the sparse rows the
//! batch touches), compute (with optional gradient accumulation over micro-batches), push the
//! compressed gradients, report the clock and wait as the scheduler says. One worker of a job
//! also evaluates on the test set at intervals and writes the run's results.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::future::try_join_all;
use ps_client::scheduler::{ClockDone, Grant, SchedulerClient, WorkerSession};
use ps_client::{ClientConfig, PsClient};
use ps_core::JobSpec;
use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;
use tokio_util::sync::CancellationToken;

use crate::backend::{Backend, Cpu, DeviceChoice, Selected};
use crate::data::{Batch, DatasetSpec, Prefetcher, ShardPlan, Split};
use crate::model::{ModelSpec, Net, SparseRows};
use crate::run::{EvalRecord, RunDir, StepRecord};

/// How one worker runs.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    pub scheduler: String,
    pub job: String,
    /// The worker's name in the job (unique per job).
    pub name: String,
    /// Where the data set's files are, when not in their default place.
    pub data: Option<PathBuf>,
    /// The run directory: per-worker metrics; the evaluator's results, curves and model.
    pub run_dir: Option<PathBuf>,
    /// This worker evaluates on the test set and writes the final results.
    pub evaluate: bool,
    /// Clocks between evaluations (0: once per epoch of this worker).
    pub eval_every: u64,
    /// Gradient accumulation: the batch is computed in this many parts.
    pub micro_batches: usize,
    /// Examples per clock when the job sets no global batch.
    pub default_batch: usize,
    /// Emulated link bandwidth for pushes and pulls, in megabits per second.
    pub link_mbps: Option<f64>,
    /// Each clock takes `straggler_factor` times longer with this probability.
    pub straggler_prob: f64,
    pub straggler_factor: f64,
    /// Every clock takes this many times longer (a persistently slower machine).
    pub slowdown: f64,
    /// When an SSP worker refreshes its copy of the dense tables.
    pub ssp_refresh: SspRefresh,
    /// Keep the error-feedback residual for the lossy codecs that want one (top-k, sign, int8,
    /// the 16-bit casts). Off only to measure what it buys.
    pub error_feedback: bool,
    /// Momentum applied on the worker before the codec (Deep Gradient Compression's momentum
    /// correction): the worker pushes its velocity `u = m u + g` and the shards apply plain
    /// SGD, so what a sparse codec holds back in the residual is momentum, not raw gradient.
    /// 0: off (the shards' optimizer does the momentum).
    pub local_momentum: f32,
    /// Sparsity warm-up, in epochs of the job: a top-k or random-k table pushes a share that
    /// falls geometrically from [`WARMUP_START_RATIO`] to its codec's ratio over these epochs
    /// (Deep Gradient Compression), so the first, largest gradients are not held back in the
    /// residual for long. 0: off.
    pub sparsity_warmup: f64,
    /// How the step size moves over the job (the workers scale their gradients).
    pub lr_schedule: LrSchedule,
    /// Where the model computes: `auto` (CUDA when it works, else the CPU), `cpu`, `cuda:N`.
    pub device: DeviceChoice,
    pub prefetch_depth: usize,
}

impl WorkerConfig {
    pub fn new(scheduler: &str, job: &str, name: &str) -> Self {
        Self {
            scheduler: scheduler.to_owned(),
            job: job.to_owned(),
            name: name.to_owned(),
            data: None,
            run_dir: None,
            evaluate: false,
            eval_every: 0,
            micro_batches: 1,
            default_batch: 64,
            link_mbps: None,
            straggler_prob: 0.0,
            straggler_factor: 4.0,
            slowdown: 1.0,
            ssp_refresh: SspRefresh::EveryClock,
            error_feedback: true,
            local_momentum: 0.0,
            sparsity_warmup: 0.0,
            lr_schedule: LrSchedule::Constant,
            device: DeviceChoice::Auto,
            prefetch_depth: 4,
        }
    }
}

/// What a worker did.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    pub clocks: u64,
    pub examples: u64,
    pub wire_bytes: u64,
    pub raw_bytes: u64,
    pub dense_pulls: u64,
    pub final_eval: Option<EvalRecord>,
}

/// When an SSP worker refreshes its copy of the dense tables. Either way the scheduler's clock
/// gate bounds how far ahead of the slowest worker any worker runs, and no copy is ever older
/// than the bound allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum SspRefresh {
    /// Pull at every clock (eager SSP): a worker computes on the freshest model the shards
    /// hold, and the bound only stops it from running ahead. The default: at the same epochs
    /// it trains as well as BSP (EXPERIMENTS.md).
    #[default]
    EveryClock,
    /// Pull only when the bound requires it (the SSP cache rule: at clock c, when the last
    /// pull was made while the slowest worker was below c - s), applying this worker's own
    /// pushes to the copy in between. Pulls up to s + 1 times less often, for links where the
    /// pulls dominate, and pays for it in accuracy.
    Bound,
}

impl std::fmt::Display for SspRefresh {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::EveryClock => "every-clock",
            Self::Bound => "bound",
        })
    }
}

/// How the step size moves over a job of a known number of clocks. The workers apply it by
/// scaling their gradients, which for SGD and momentum tables is exactly a learning-rate
/// schedule (the rate inside the velocity): the shards' optimizers need no change. Tables under
/// Adagrad, Adam or FTRL normalise the gradient's scale away, so a schedule is refused there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LrSchedule {
    /// The tables' learning rate throughout.
    #[default]
    Constant,
    /// Cosine decay from the tables' rate to 0 over the job's clocks: big steps early, small
    /// ones at the end, where a constant rate keeps the model bouncing around the optimum.
    Cosine,
}

impl LrSchedule {
    /// The factor on the learning rate at `clock` of a job of `clocks`.
    pub fn factor(self, clock: u64, clocks: u64) -> f32 {
        match self {
            Self::Constant => 1.0,
            Self::Cosine if clocks == 0 => 1.0,
            Self::Cosine => {
                let p = (clock as f64 / clocks as f64).clamp(0.0, 1.0);
                (0.5 * (1.0 + (std::f64::consts::PI * p).cos())) as f32
            }
        }
    }
}

impl std::fmt::Display for LrSchedule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Constant => "constant",
            Self::Cosine => "cosine",
        })
    }
}

/// Runs a worker until its job ends or `shutdown` is cancelled.
pub async fn run(cfg: WorkerConfig, shutdown: CancellationToken) -> anyhow::Result<Summary> {
    // The device first: asking for CUDA where there is none fails before joining the job.
    let device = crate::backend::cuda::select(cfg.device).map_err(anyhow::Error::msg)?;
    let sched = SchedulerClient::connect(&cfg.scheduler).await?;
    let session = WorkerSession::join(sched, &cfg.job, &cfg.name)
        .await
        .with_context(|| format!("joining job `{}` at {}", cfg.job, cfg.scheduler))?;
    match device {
        Selected::Cpu => train_on(Cpu, cfg, session, shutdown).await,
        Selected::Cuda(c) => train_on(c, cfg, session, shutdown).await,
    }
}

async fn train_on<B: Backend + Clone>(
    backend: B,
    cfg: WorkerConfig,
    session: WorkerSession,
    shutdown: CancellationToken,
) -> anyhow::Result<Summary> {
    let spec = session.spec().clone();
    let dataset = DatasetSpec::parse(&spec.dataset)?;
    let model = ModelSpec::parse(&spec.model)?;
    let data_dir = cfg.data.clone();
    let seed = spec.seed;
    let split =
        tokio::task::spawn_blocking(move || dataset.load(data_dir.as_deref(), seed)).await??;
    tracing::info!(
        job = %spec.name, worker = %cfg.name, model = %model.name(), backend = backend.name(),
        ?split, "joined; data loaded"
    );
    let net = Net::new(
        backend,
        model,
        &spec.name,
        split.train.input(),
        split.train.classes(),
    )?;
    for (t, _) in net.dense_tables().iter().chain(net.sparse_tables()) {
        if spec.table(t).is_none() {
            bail!(
                "job `{}` has no table `{t}`, which model `{}` needs: submit the job with the \
                 model's tables (psctl submit and psctl local add them)",
                spec.name,
                spec.model
            );
        }
    }
    if cfg.lr_schedule != LrSchedule::Constant {
        for (t, _) in net.dense_tables().iter().chain(net.sparse_tables()) {
            let Some(table) = spec.table(t) else { continue };
            if !matches!(
                table.spec.optimizer,
                ps_core::Optimizer::Sgd { .. } | ps_core::Optimizer::Momentum { .. }
            ) {
                bail!(
                    "--lr-schedule {} scales the gradients, a learning-rate schedule only for \
                     sgd and momentum tables; table `{t}` uses {}",
                    cfg.lr_schedule,
                    table.spec.optimizer.name()
                );
            }
        }
    }
    let mut client_cfg = ClientConfig::new(Vec::<String>::new());
    // Ride out a shard restart: the client follows the scheduler's map meanwhile.
    client_cfg.max_attempts = 200;
    client_cfg.max_backoff = Duration::from_millis(500);
    client_cfg.link_mbps = cfg.link_mbps;
    let ps = session.ps_client(client_cfg).await?;
    if !cfg.error_feedback {
        for (t, _) in net.dense_tables().iter().chain(net.sparse_tables()) {
            let mut codec = ps.table_codec(t)?;
            codec.push.error_feedback = false;
            ps.set_table_codec(t, codec)?;
        }
    }
    let mut sparsified = Vec::new();
    if cfg.sparsity_warmup > 0.0 {
        for (t, _) in net.dense_tables().iter().chain(net.sparse_tables()) {
            let push = ps.table_codec(t)?.push;
            if let ps_codec::Codec::TopK { ratio, .. } | ps_codec::Codec::RandomK { ratio, .. } =
                push.codec
                && push.keeps_residual()
            {
                sparsified.push((t.clone(), ratio));
            }
        }
    }
    let trainer = Trainer {
        run: RunDir::open(cfg.run_dir.as_deref(), &cfg.name, cfg.evaluate)?,
        rng: Xoshiro256PlusPlus::seed_from_u64(ps_core::hash::combine(
            seed,
            ps_core::hash::fnv1a(cfg.name.as_bytes()),
        )),
        cfg,
        ps,
        net,
        split,
        summary: Summary::default(),
        started: Instant::now(),
        eval_time: Duration::ZERO,
        own: None,
        velocity: Vec::new(),
        sparsified,
    };
    trainer.train(session, shutdown).await
}

struct Trainer<B: Backend + Clone> {
    cfg: WorkerConfig,
    ps: PsClient,
    net: Net<B>,
    split: Split,
    run: RunDir,
    rng: Xoshiro256PlusPlus,
    summary: Summary,
    started: Instant,
    /// Time spent evaluating, left out of the run's training time.
    eval_time: Duration,
    /// Under SSP with a bound above 0: the cache with this worker's own updates.
    own: Option<Vec<OwnTable>>,
    /// The worker-side momentum of each dense table (with `local_momentum`).
    velocity: Vec<Vec<f32>>,
    /// The tables pushed with top-k or random-k and error feedback, with their codec's ratio:
    /// what the sparsity warm-up moves (emptied once it has ended).
    sparsified: Vec<(String, f64)>,
}

/// The share of its values a top-k or random-k table pushes when a sparsity warm-up starts.
pub const WARMUP_START_RATIO: f64 = 0.25;

/// The ratio a sparsity warm-up of `warmup` epochs sets after `epochs` epochs of the job:
/// geometric from [`WARMUP_START_RATIO`] down to `target`, then `target`.
pub fn warmup_ratio(target: f64, epochs: f64, warmup: f64) -> f64 {
    if target >= WARMUP_START_RATIO || epochs >= warmup {
        return target;
    }
    WARMUP_START_RATIO * (target / WARMUP_START_RATIO).powf(epochs.max(0.0) / warmup)
}

/// Read-my-writes for a cached model, one per dense table: the table as last pulled plus this
/// worker's own pushes since, applied with the table's own optimizer (a replica of the worker's
/// share of the optimizer state). Under SSP a worker computes up to `s` clocks on one pull; without its own
/// updates it would compute those clocks' gradients at the same point, and its momentum
/// overshoots.
struct OwnTable {
    name: String,
    optimizer: ps_core::Optimizer,
    values: Vec<f32>,
    state: Vec<f32>,
    step: u64,
}

/// When the dense tables were last pulled: the clock, the job's minimum clock then, the time.
struct Cache {
    min_clock: u64,
    at: Instant,
}

impl<B: Backend + Clone> Trainer<B> {
    async fn train(
        mut self,
        mut session: WorkerSession,
        shutdown: CancellationToken,
    ) -> anyhow::Result<Summary> {
        let spec = session.spec().clone();
        let bound = spec.consistency.bound();
        let lazy = self.cfg.ssp_refresh == SspRefresh::Bound;
        if lazy && bound.is_some_and(|s| s > 0) {
            let tables = self
                .net
                .dense_tables()
                .iter()
                .filter_map(|(t, len)| {
                    let optimizer = spec.table(t)?.spec.optimizer;
                    Some(OwnTable {
                        name: t.clone(),
                        state: ps_core::optim::initial_state(&optimizer, *len),
                        optimizer,
                        values: Vec::new(),
                        step: 0,
                    })
                })
                .collect();
            self.own = Some(tables);
        }
        let mut grant = tokio::select! {
            g = session.start() => g?,
            () = shutdown.cancelled() => return Ok(self.summary),
        };
        // Training time counts from the first grant (not from joining and loading).
        self.started = Instant::now();
        let plan = ShardPlan::new(
            self.split.train.len(),
            grant.num_data_shards.max(1) as usize,
            spec.seed,
        );
        let default_batch = self.cfg.default_batch;
        let batch_of = |g: &Grant| {
            if g.batch_size > 0 {
                g.batch_size as usize
            } else {
                default_batch
            }
        };
        let prefetch = Prefetcher::start(
            self.split.train.clone(),
            plan,
            &grant.data_shards,
            batch_of(&grant),
            self.cfg.prefetch_depth,
            spec.seed,
        );
        let mut cache: Option<Cache> = None;
        let mut last_eval_epoch = 0;
        let mut window = Window::default();
        while !grant.stop {
            if shutdown.is_cancelled() {
                break;
            }
            prefetch.control().set_shards(&grant.data_shards);
            prefetch.control().set_batch(batch_of(&grant));
            // Pull the dense tables when the cache is older than the bound allows: at clock c
            // the step must see every update of clocks below c - s, and a pull made when the
            // slowest worker was at m holds those below m.
            let stale = match (&cache, bound) {
                (None, _) | (_, None) => true,
                (Some(c), Some(s)) => !lazy || grant.clock > c.min_clock + s,
            };
            let step_start = Instant::now();
            if stale {
                self.pull_dense().await?;
                cache = Some(Cache {
                    min_clock: grant.min_clock,
                    at: Instant::now(),
                });
            }
            let t0 = Instant::now();
            let batch = tokio::task::block_in_place(|| prefetch.next())
                .context("the prefetch thread stopped")?;
            let waited_data = t0.elapsed();
            if !self.net.sparse_tables().is_empty() {
                self.pull_rows(&batch).await?;
            }
            // Scale so the sum over every worker's push is the mean over the global batch.
            let global = if spec.global_batch > 0 {
                spec.global_batch as f32
            } else {
                (batch.len() * spec.num_workers as usize) as f32
            };
            let lr = self.cfg.lr_schedule.factor(grant.clock, spec.max_clocks);
            let compute_start = Instant::now();
            let (loss, correct) =
                tokio::task::block_in_place(|| self.compute(&batch, lr / global.max(1.0)))?;
            let mut compute = compute_start.elapsed();
            // A persistently slower machine computes `slowdown` times slower (its network is
            // no slower): the batch's compute is stretched, which is what balanced batch
            // sizes can make up for.
            if self.cfg.slowdown > 1.0 {
                let extra = compute.mul_f64(self.cfg.slowdown - 1.0);
                tokio::time::sleep(extra).await;
                compute += extra;
            }
            if !self.sparsified.is_empty() {
                let epochs = self.job_epochs(&spec, grant.clock);
                for (t, target) in &self.sparsified {
                    let ratio = warmup_ratio(*target, epochs, self.cfg.sparsity_warmup);
                    self.ps.set_push_ratio(t, ratio)?;
                }
                if epochs >= self.cfg.sparsity_warmup {
                    // The codecs' own ratios are set: nothing moves any more.
                    self.sparsified.clear();
                }
            }
            let (wire, raw) = self.push().await?;
            // A transient straggler (a preempted or throttled step): the whole step, pulls and
            // push included, takes `straggler_factor` times longer. Sleeping costs no CPU, so
            // the emulation does not slow the other processes down.
            if self.cfg.straggler_prob > 0.0 && self.rng.random::<f64>() < self.cfg.straggler_prob {
                let extra = step_start
                    .elapsed()
                    .mul_f64(self.cfg.straggler_factor.max(1.0) - 1.0);
                tokio::time::sleep(extra).await;
                compute += extra;
            }
            let param_age = cache.as_ref().map_or(Duration::ZERO, |c| c.at.elapsed());
            self.summary.clocks += 1;
            self.summary.examples += batch.len() as u64;
            self.summary.wire_bytes += wire;
            self.summary.raw_bytes += raw;
            window.add(batch.len(), loss, correct);
            let done_clock = grant.clock;
            let wait_start = Instant::now();
            grant = tokio::select! {
                g = session.advance(ClockDone {
                    examples: batch.len() as u64,
                    compute: Some(compute),
                    param_age,
                }) => g?,
                () = shutdown.cancelled() => break,
            };
            let wait = wait_start.elapsed();
            self.run.step(&StepRecord {
                worker: self.cfg.name.clone(),
                clock: done_clock,
                epoch: batch.epoch,
                examples: batch.len(),
                loss: loss / batch.len().max(1) as f64,
                accuracy: correct as f64 / batch.len().max(1) as f64,
                compute_ms: compute.as_secs_f64() * 1e3,
                wait_ms: wait.as_secs_f64() * 1e3,
                data_wait_ms: waited_data.as_secs_f64() * 1e3,
                wire_bytes: wire,
                raw_bytes: raw,
                elapsed_s: self.started.elapsed().as_secs_f64(),
            })?;
            let due = if self.cfg.eval_every > 0 {
                (done_clock + 1).is_multiple_of(self.cfg.eval_every)
            } else {
                batch.epoch > last_eval_epoch
            };
            if self.cfg.evaluate && due && !grant.stop {
                last_eval_epoch = batch.epoch;
                let e = self.evaluate(done_clock + 1, batch.epoch, &window).await?;
                tracing::info!(
                    clock = done_clock + 1,
                    test_accuracy = e.test_accuracy,
                    "evaluated"
                );
                window = Window::default();
            }
        }
        drop(prefetch);
        if self.cfg.evaluate && !shutdown.is_cancelled() {
            let epoch = self.job_epochs(&spec, grant.clock) as u64;
            let e = self.evaluate(grant.clock, epoch, &window).await?;
            self.run
                .finish(&e, &self.summary, &self.ps, &self.net, &spec)
                .await?;
            self.summary.final_eval = Some(e);
        }
        self.run.flush()?;
        session.leave().await.ok();
        Ok(self.summary)
    }

    /// Epochs of the job before `clock`: every worker's examples, not this worker's (with
    /// balanced batches the workers see different shares).
    fn job_epochs(&self, spec: &JobSpec, clock: u64) -> f64 {
        let examples = if spec.global_batch > 0 {
            clock * spec.global_batch
        } else {
            self.summary.examples * u64::from(spec.num_workers)
        };
        examples as f64 / self.split.train.len().max(1) as f64
    }

    async fn pull_dense(&mut self) -> anyhow::Result<()> {
        let tables = self.net.dense_tables().to_vec();
        let ps = &self.ps;
        let pulled = try_join_all(tables.iter().map(|(t, _)| ps.pull_dense(t))).await?;
        for ((t, _), v) in tables.iter().zip(&pulled) {
            self.net.set_dense(t, v)?;
        }
        if let Some(own) = &mut self.own {
            for (o, v) in own.iter_mut().zip(pulled) {
                o.values = v;
            }
        }
        self.summary.dense_pulls += 1;
        Ok(())
    }

    async fn pull_rows(&mut self, batch: &Batch) -> anyhow::Result<()> {
        let ids = SparseRows::ids_of(batch);
        let tables = self.net.sparse_tables();
        let ps = &self.ps;
        let pulled = try_join_all(tables.iter().map(|(t, _)| ps.pull_sparse(t, &ids))).await?;
        // In the order of sparse_tables: wide, then emb.
        let mut pulled = pulled.into_iter();
        let rows = SparseRows {
            ids,
            wide: pulled.next().unwrap_or_default(),
            emb: pulled.next().unwrap_or_default(),
        };
        self.net.set_rows(&rows)?;
        Ok(())
    }

    /// Forward and backward over the batch in micro-batches; returns the summed loss and hits.
    fn compute(&mut self, batch: &Batch, scale: f32) -> anyhow::Result<(f64, usize)> {
        self.net.zero_grads()?;
        let parts = self.cfg.micro_batches.clamp(1, batch.len().max(1));
        let mut probs = Vec::new();
        let (mut loss, mut correct) = (0.0, 0);
        for p in 0..parts {
            let range = p * batch.len() / parts..(p + 1) * batch.len() / parts;
            let part;
            let mb = if parts == 1 {
                batch
            } else {
                part = batch.slice(range);
                &part
            };
            let s = self.net.step(mb, scale, true, &mut probs)?;
            loss += s.loss;
            correct += s.correct;
        }
        Ok((loss, correct))
    }

    /// Pushes the clock's gradients; returns the bytes on the wire and their f32 size.
    async fn push(&mut self) -> anyhow::Result<(u64, u64)> {
        let mut grads = self.net.grads()?;
        let m = self.cfg.local_momentum;
        if m > 0.0 {
            self.velocity.resize_with(grads.dense.len(), Vec::new);
            for ((_, g), u) in grads.dense.iter_mut().zip(&mut self.velocity) {
                u.resize(g.len(), 0.0);
                for (u, g) in u.iter_mut().zip(g.iter_mut()) {
                    *u = m * *u + *g;
                    *g = *u;
                }
            }
        }
        // Momentum factor masking (Deep Gradient Compression), for sparse codecs: where the
        // codec sent a coordinate, its momentum is cleared so it is not sent again. A
        // coordinate was sent when the residual after the push differs from the residual
        // before it plus the velocity (an unsent one stays exactly that sum).
        let masked: Vec<Option<Vec<f32>>> = if m > 0.0 {
            grads
                .dense
                .iter()
                .map(|(t, g)| {
                    let codec = self.ps.table_codec(t).ok()?.push;
                    let sparse = matches!(
                        codec.codec,
                        ps_codec::Codec::TopK { .. } | ps_codec::Codec::RandomK { .. }
                    );
                    (sparse && codec.keeps_residual() && g.len() >= codec.min_values)
                        .then(|| self.ps.dense_residual(t).unwrap_or_default())
                })
                .collect()
        } else {
            Vec::new()
        };
        let ps = &self.ps;
        let dense = try_join_all(grads.dense.iter().map(|(t, g)| ps.push_dense(t, g)));
        let sparse = try_join_all(
            grads
                .sparse
                .iter()
                .map(|(t, ids, rows)| ps.push_sparse(t, ids, rows)),
        );
        let (dense, sparse) = tokio::try_join!(dense, sparse)?;
        for ((before, (t, g)), u) in masked.iter().zip(&grads.dense).zip(&mut self.velocity) {
            let Some(before) = before else {
                continue;
            };
            let after = self.ps.dense_residual(t)?;
            for (i, (u, a)) in u.iter_mut().zip(&after).enumerate() {
                if *a != before.get(i).copied().unwrap_or(0.0) + g[i] {
                    *u = 0.0;
                }
            }
        }
        if let Some(own) = &mut self.own {
            // Read-my-writes: the cache moves as the shards will move it for these gradients.
            for (o, (t, g)) in own.iter_mut().zip(&grads.dense) {
                if o.name != *t || o.values.len() != g.len() {
                    continue;
                }
                ps_core::optim::apply(&o.optimizer, &mut o.values, &mut o.state, &mut o.step, g);
                self.net.set_dense(t, &o.values)?;
            }
        }
        let ids: u64 = grads
            .sparse
            .iter()
            .map(|(_, ids, _)| ids.len() as u64 * 8)
            .sum();
        let wire = dense
            .iter()
            .chain(&sparse)
            .map(|s| s.wire_bytes)
            .sum::<u64>()
            + ids;
        let raw = dense
            .iter()
            .chain(&sparse)
            .map(|s| s.raw_bytes)
            .sum::<u64>()
            + ids;
        Ok((wire, raw))
    }

    /// Evaluates the current model (freshly pulled) on the test set.
    async fn evaluate(
        &mut self,
        clock: u64,
        epoch: u64,
        window: &Window,
    ) -> anyhow::Result<EvalRecord> {
        let eval_start = Instant::now();
        let train_s = (self.started.elapsed().saturating_sub(self.eval_time)).as_secs_f64();
        self.pull_dense().await?;
        let test = self.split.test.clone();
        let mut batch = Batch::empty(test.input());
        let (mut loss, mut correct) = (0.0, 0usize);
        let mut scored: Vec<(f32, u32)> = Vec::new();
        let mut probs = Vec::new();
        let n = test.len();
        let step = 1000;
        for start in (0..n).step_by(step) {
            let idx: Vec<usize> = (start..(start + step).min(n)).collect();
            test.gather(&idx, &mut batch);
            if !self.net.sparse_tables().is_empty() {
                self.pull_rows(&batch).await?;
            }
            let s = tokio::task::block_in_place(|| self.net.step(&batch, 1.0, false, &mut probs))?;
            loss += s.loss;
            correct += s.correct;
            scored.extend(probs.iter().copied().zip(batch.labels.iter().copied()));
        }
        let e = EvalRecord {
            clock,
            epoch,
            test_loss: loss / n.max(1) as f64,
            test_accuracy: correct as f64 / n.max(1) as f64,
            auc: (!scored.is_empty()).then(|| auc(&mut scored)),
            train_loss: window.loss(),
            train_accuracy: window.accuracy(),
            examples: self.summary.examples,
            wire_bytes: self.summary.wire_bytes,
            elapsed_s: self.started.elapsed().as_secs_f64(),
            train_s,
        };
        self.eval_time += eval_start.elapsed();
        self.run.eval(&e)?;
        Ok(e)
    }
}

/// Training loss and accuracy since the last evaluation.
#[derive(Debug, Default)]
struct Window {
    examples: usize,
    loss: f64,
    correct: usize,
}

impl Window {
    fn add(&mut self, n: usize, loss: f64, correct: usize) {
        self.examples += n;
        self.loss += loss;
        self.correct += correct;
    }

    fn loss(&self) -> f64 {
        self.loss / self.examples.max(1) as f64
    }

    fn accuracy(&self) -> f64 {
        self.correct as f64 / self.examples.max(1) as f64
    }
}

/// Area under the ROC curve of (score, 0/1 label) pairs: the chance that a random positive
/// scores above a random negative (ties count half).
pub fn auc(scored: &mut [(f32, u32)]) -> f64 {
    scored.sort_by(|a, b| a.0.total_cmp(&b.0));
    let pos = scored.iter().filter(|s| s.1 == 1).count() as f64;
    let neg = scored.len() as f64 - pos;
    if pos == 0.0 || neg == 0.0 {
        return 0.5;
    }
    // Sum of the positives' ranks, ties given their mean rank.
    let mut rank_sum = 0.0;
    let mut i = 0;
    while i < scored.len() {
        let mut j = i;
        while j < scored.len() && scored[j].0 == scored[i].0 {
            j += 1;
        }
        let mean_rank = (i + j + 1) as f64 / 2.0;
        rank_sum += mean_rank * scored[i..j].iter().filter(|s| s.1 == 1).count() as f64;
        i = j;
    }
    (rank_sum - pos * (pos + 1.0) / 2.0) / (pos * neg)
}

#[cfg(test)]
mod tests {
    use super::{LrSchedule, WARMUP_START_RATIO, auc, warmup_ratio};

    #[test]
    fn auc_of_known_rankings() {
        assert_eq!(auc(&mut [(0.1, 0), (0.4, 0), (0.35, 1), (0.8, 1)]), 0.75);
        assert_eq!(auc(&mut [(0.9, 1), (0.1, 0)]), 1.0);
        assert_eq!(auc(&mut [(0.5, 1), (0.5, 0)]), 0.5);
    }

    #[test]
    fn a_cosine_schedule_falls_from_one_to_zero_over_the_job() {
        let close = |a: f32, b: f32| (a - b).abs() < 1e-6;
        let cos = LrSchedule::Cosine;
        assert!(close(cos.factor(0, 1000), 1.0));
        assert!(close(cos.factor(500, 1000), 0.5));
        assert!(close(cos.factor(250, 1000), 0.853_553_4));
        assert!(close(cos.factor(1000, 1000), 0.0));
        assert!(close(cos.factor(5000, 1000), 0.0));
        let mut last = f32::INFINITY;
        for c in 0..=100 {
            let f = cos.factor(c, 100);
            assert!(f <= last && f >= 0.0, "{f} after {last}");
            last = f;
        }
        // A job of unknown length, and the constant schedule, keep the tables' rate.
        assert_eq!(cos.factor(7, 0), 1.0);
        assert_eq!(LrSchedule::Constant.factor(999, 1000), 1.0);
    }

    #[test]
    fn a_sparsity_warmup_falls_geometrically_to_the_codec_ratio() {
        let close = |a: f64, b: f64| (a - b).abs() < 1e-12;
        assert!(close(warmup_ratio(0.01, 0.0, 1.0), WARMUP_START_RATIO));
        // Halfway in epochs is halfway in log-ratio: sqrt(0.25 * 0.01).
        assert!(close(warmup_ratio(0.01, 0.5, 1.0), 0.05));
        assert!(close(warmup_ratio(0.01, 1.0, 1.0), 0.01));
        assert!(close(warmup_ratio(0.01, 7.0, 1.0), 0.01));
        assert!(close(warmup_ratio(0.01, 1.0, 2.0), 0.05));
        // Falling all the way, and never below the target.
        let mut last = f64::INFINITY;
        for i in 0..=40 {
            let r = warmup_ratio(0.01, f64::from(i) * 0.05, 1.0);
            assert!(r <= last && r >= 0.01, "{r} after {last}");
            last = r;
        }
        // A codec that sends more than the start, or no warm-up at all, keeps its ratio.
        assert_eq!(warmup_ratio(0.5, 0.0, 1.0), 0.5);
        assert_eq!(warmup_ratio(0.01, 0.0, 0.0), 0.01);
    }
}
