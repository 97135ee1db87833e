//! The training loop of one worker: join the job, then per clock pull what the step needs
//! (dense tables when the cache is older than the consistency bound allows; the sparse rows the
//! batch touches), compute (with optional gradient accumulation over micro-batches), push the
//! compressed gradients, report the clock and wait as the scheduler says. One worker of a job
//! also evaluates on the test set at intervals and writes the run's results.
//!
//! What moves over the job ([`crate::schedule`]), slow-machine emulation
//! ([`crate::emulate`]), momentum correction ([`crate::momentum`]), the model cache
//! ([`crate::cache`]) and the run directory ([`crate::run`]) each live in their own file.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::future::try_join_all;
use ps_client::scheduler::{ClockDone, Grant, SchedulerClient, WorkerSession};
use ps_client::{ClientConfig, PsClient};
use ps_core::JobSpec;
use rand_xoshiro::Xoshiro256PlusPlus;
use rand_xoshiro::rand_core::SeedableRng;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::backend::{Backend, Cpu, Selected};
use crate::cache::ModelCache;
use crate::config::WorkerConfig;
use crate::data::{Batch, DatasetSpec, Prefetcher, ShardPlan, Split};
use crate::emulate::Emulation;
use crate::eval::{Window, auc};
use crate::metrics::{StepFigures, StepTimes, WorkerMetrics};
use crate::model::{ModelSpec, Net, SparseRows};
use crate::momentum::LocalMomentum;
use crate::run::{EvalRecord, RunDir, StepRecord, Summary};
use crate::schedule::{LrSchedule, SparsityWarmup};

/// Runs a worker until its job ends or `shutdown` is cancelled.
pub async fn run(cfg: WorkerConfig, shutdown: CancellationToken) -> anyhow::Result<Summary> {
    cfg.check()?;
    // The device first: asking for CUDA where there is none fails before joining the job.
    let device = crate::backend::cuda::select(cfg.device).map_err(anyhow::Error::msg)?;
    let readiness = ps_runtime::readiness::Readiness::default();
    let listener = match cfg.metrics_listen {
        Some(a) => Some(
            tokio::net::TcpListener::bind(a)
                .await
                .with_context(|| format!("cannot listen on {a} for metrics"))?,
        ),
        None => None,
    };
    ps_runtime::metrics::start("worker", listener, None, &readiness, &shutdown)?;
    let credentials = cfg.security.credentials()?;
    // The shards' connections take the same credentials (SchedulerClient::ps_client).
    let sched = SchedulerClient::connect_with(&cfg.scheduler, None, credentials).await?;
    let session = WorkerSession::join(sched, &cfg.job, &cfg.name)
        .await
        .with_context(|| format!("joining job `{}` at {}", cfg.job, cfg.scheduler))?;
    readiness.set(true);
    match device {
        Selected::Cpu => train_on(Cpu, cfg, session, shutdown).await,
        Selected::Cuda(c) => train_on(c, cfg, session, shutdown).await,
    }
}

/// Checks that the job holds every table the model trains, under optimizers the step-size
/// schedule can drive.
fn check_tables<B: Backend + Clone>(
    spec: &JobSpec,
    net: &Net<B>,
    schedule: LrSchedule,
) -> anyhow::Result<()> {
    let trained = || net.dense_tables().iter().chain(net.sparse_tables());
    if let Some(extra) = spec
        .tables
        .iter()
        .find(|t| trained().all(|(name, _)| name != t.spec.name.as_str()))
    {
        bail!(
            "job `{}` lists table `{}`, which model `{}` does not train (it trains {}): the job's \
             tables must be the model's",
            spec.name,
            extra.spec.name,
            spec.model,
            trained()
                .map(|(t, _)| format!("`{t}`"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    for (t, _) in trained() {
        let Some(table) = spec.table(t) else {
            bail!(
                "job `{}` has no table `{t}`, which model `{}` needs: submit the job with the \
                 model's tables (psctl submit and psctl local add them)",
                spec.name,
                spec.model
            );
        };
        if schedule != LrSchedule::Constant
            && !matches!(
                table.spec.optimizer,
                ps_core::Optimizer::Sgd { .. } | ps_core::Optimizer::Momentum { .. }
            )
        {
            bail!(
                "--lr-schedule {schedule} scales the gradients, a learning-rate schedule only for \
                 sgd and momentum tables; table `{t}` uses {}",
                table.spec.optimizer.name()
            );
        }
    }
    Ok(())
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
    check_tables(&spec, &net, cfg.lr_schedule)?;
    let mut client_cfg = ClientConfig::new(Vec::<String>::new());
    // Ride out a shard restart: the client follows the scheduler's map meanwhile.
    client_cfg.max_attempts = 200;
    client_cfg.max_backoff = Duration::from_millis(500);
    client_cfg.link_mbps = cfg.link_mbps;
    client_cfg.link_speed_mbps = cfg.link_speed_mbps;
    client_cfg.row_residual_mib = cfg.row_residual_mib as usize;
    client_cfg.held_rows_mib = cfg.held_rows_mib as usize;
    let Some(ps) = shards(&session, client_cfg, &shutdown).await? else {
        return Ok(Summary::default());
    };
    let tables: Vec<&str> = net
        .dense_tables()
        .iter()
        .chain(net.sparse_tables())
        .map(|(t, _)| t.as_str())
        .collect();
    if !cfg.error_feedback {
        for &t in &tables {
            let mut codec = ps.table_codec(t)?;
            codec.push.error_feedback = false;
            ps.set_table_codec(t, codec)?;
        }
    }
    if let Some(pull) = cfg.pull_codec {
        let dense = net.dense_tables().iter().map(|(t, _)| (t, pull));
        let rows = net
            .sparse_tables()
            .iter()
            .map(|(t, _)| (t, pull.for_rows()));
        for (t, pull) in dense.chain(rows) {
            ps.set_table_codec(
                t,
                ps_client::TableCodec {
                    pull,
                    ..ps.table_codec(t)?
                },
            )?;
        }
    }
    let warmup = SparsityWarmup::new(&ps, &tables, cfg.sparsity_warmup)?;
    let rng = Xoshiro256PlusPlus::seed_from_u64(ps_core::hash::combine(
        seed,
        ps_core::hash::fnv1a(cfg.name.as_bytes()),
    ));
    let trainer = Trainer {
        metrics: WorkerMetrics::new(&spec.name, &cfg.name),
        run: RunDir::open(cfg.run_dir.as_deref(), &cfg.name, cfg.evaluate)?,
        emulation: Emulation::new(cfg.slowdown, cfg.straggler_prob, cfg.straggler_factor, rng),
        momentum: LocalMomentum::new(cfg.local_momentum),
        cache: ModelCache::new(&spec, net.dense_tables(), cfg.ssp_refresh),
        warmup,
        cfg,
        ps,
        net,
        split,
        started: Instant::now(),
        eval_time: Duration::ZERO,
    };
    trainer.train(session, shutdown).await
}

/// The job's shards, once every one has registered and answers: workers started beside the
/// shards (every container of a cluster restarted at once, pods in any order) wait for them,
/// as the job does. `None` when `shutdown` came first.
async fn shards(
    session: &WorkerSession,
    cfg: ClientConfig,
    shutdown: &CancellationToken,
) -> anyhow::Result<Option<PsClient>> {
    let mut told = None::<Instant>;
    loop {
        let why = match session.ps_client(cfg.clone()).await {
            Ok(ps) => return Ok(Some(ps)),
            Err(e) if e.is_unavailable() => e,
            Err(e) => return Err(e.into()),
        };
        if told.is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
            tracing::info!(error = %why, "waiting for the job's shards");
            told = Some(Instant::now());
        }
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(500)) => {}
            () = shutdown.cancelled() => return Ok(None),
        }
    }
}

struct Trainer<B: Backend + Clone> {
    cfg: WorkerConfig,
    ps: PsClient,
    net: Net<B>,
    split: Split,
    /// The run directory, which keeps the worker's totals.
    run: RunDir,
    metrics: WorkerMetrics,
    emulation: Emulation,
    momentum: Option<LocalMomentum>,
    cache: ModelCache,
    warmup: SparsityWarmup,
    started: Instant,
    /// Time spent evaluating, left out of the run's training time.
    eval_time: Duration,
}

/// What one clock's push sent.
struct Pushed {
    wire_bytes: u64,
    raw_bytes: u64,
}

impl<B: Backend + Clone> Trainer<B> {
    async fn train(
        mut self,
        mut session: WorkerSession,
        shutdown: CancellationToken,
    ) -> anyhow::Result<Summary> {
        let spec = session.spec().clone();
        let mut grant = tokio::select! {
            g = session.start() => g?,
            () = shutdown.cancelled() => return Ok(self.run.into_summary(None)),
        };
        // Training time counts from the first grant (not from joining and loading).
        self.started = Instant::now();
        let plan = ShardPlan::new(
            self.split.train.len(),
            grant.num_data_shards.max(1) as usize,
            spec.seed,
        );
        let default_batch = self.cfg.default_batch as usize;
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
            self.cfg.prefetch_depth as usize,
            spec.seed,
        );
        let mut last_eval_epoch = 0;
        let mut window = Window::default();
        while !grant.stop {
            if shutdown.is_cancelled() {
                break;
            }
            prefetch.control().set_shards(&grant.data_shards);
            prefetch.control().set_batch(batch_of(&grant));
            let step_start = Instant::now();
            // One trace per step: its pulls, compute, pushes (with their encoding) and the
            // clock report are children, and the shards' handling of them joins it.
            let step = tracing::info_span!(
                "step",
                otel.name = "train.step",
                clock = grant.clock,
                worker = %self.cfg.name,
                ps_job = %spec.name,
            );
            let mut times = StepTimes::default();
            let pulled_before = self.ps.pulled_bytes();
            let asked_before = self.ps.pull_request_bytes();
            // The clock this step's sparse pushes carry (tables with ttl_clocks age by it).
            self.ps.set_clock(grant.clock);
            let batch = tokio::task::block_in_place(|| prefetch.next())
                .context("the prefetch thread stopped")?;
            let waited_data = step_start.elapsed();
            times.data = waited_data;
            let pull_start = Instant::now();
            let stale = self.cache.stale(grant.clock);
            self.pull_step(&batch, stale.then_some(grant.min_clock), &step)
                .await?;
            times.pull = pull_start.elapsed();
            let pulled = self.ps.pulled_bytes();
            let (pull_wire, pull_raw) = (pulled.0 - pulled_before.0, pulled.1 - pulled_before.1);
            let pull_asked = self.ps.pull_request_bytes() - asked_before;
            // Scale so the sum over every worker's push is the mean over the global batch.
            let global = if spec.global_batch > 0 {
                spec.global_batch as f32
            } else {
                (batch.len() * spec.num_workers as usize) as f32
            };
            let lr = self.cfg.lr_schedule.factor(grant.clock, spec.max_clocks);
            let compute_start = Instant::now();
            let computing = tracing::info_span!(parent: &step, "compute", examples = batch.len());
            let (loss, correct) = computing.in_scope(|| {
                tokio::task::block_in_place(|| self.compute(&batch, lr / global.max(1.0)))
            })?;
            let mut compute = compute_start.elapsed();
            compute += self
                .emulation
                .slow_compute(compute)
                .instrument(computing)
                .await;
            let epochs = self.job_epochs(&spec, grant.clock);
            self.warmup.apply(&self.ps, epochs)?;
            let (push_start, encoded_before) = (Instant::now(), self.ps.encode_time());
            let pushed = self
                .push()
                .instrument(tracing::info_span!(parent: &step, "push"))
                .await?;
            times.encode = self.ps.encode_time().saturating_sub(encoded_before);
            times.push = push_start.elapsed().saturating_sub(times.encode);
            compute += self.emulation.straggle(step_start.elapsed()).await;
            times.compute = compute;
            let param_age = self.cache.age();
            window.add(batch.len(), loss, correct);
            let done_clock = grant.clock;
            let wait_start = Instant::now();
            grant = tokio::select! {
                g = session.advance(ClockDone {
                    examples: batch.len() as u64,
                    compute: Some(compute),
                    param_age,
                    cpu: Some(Duration::from_secs_f64(ps_runtime::metrics::cpu_seconds())),
                }).instrument(tracing::info_span!(parent: &step, "clock_wait")) => g?,
                () = shutdown.cancelled() => break,
            };
            let wait = wait_start.elapsed();
            times.wait = wait;
            drop(step);
            let row_residuals = self.row_residuals();
            self.metrics.step(&StepFigures {
                clock: done_clock,
                examples: batch.len(),
                loss: loss / batch.len().max(1) as f64,
                accuracy: correct as f64 / batch.len().max(1) as f64,
                wire_bytes: pushed.wire_bytes,
                raw_bytes: pushed.raw_bytes,
                pull_wire_bytes: pull_wire,
                pull_raw_bytes: pull_raw,
                row_residuals,
                times,
            });
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
                pull_ms: times.pull.as_secs_f64() * 1e3,
                encode_ms: times.encode.as_secs_f64() * 1e3,
                push_ms: times.push.as_secs_f64() * 1e3,
                wire_bytes: pushed.wire_bytes,
                raw_bytes: pushed.raw_bytes,
                pull_wire_bytes: pull_wire,
                pull_raw_bytes: pull_raw,
                pull_request_bytes: pull_asked,
                row_residual_rows: row_residuals.0,
                row_residuals_evicted: row_residuals.1,
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
        let mut final_eval = None;
        if self.cfg.evaluate && !shutdown.is_cancelled() {
            let epoch = self.job_epochs(&spec, grant.clock) as u64;
            let e = self.evaluate(grant.clock, epoch, &window).await?;
            self.run.finish(&e, &self.ps, &self.net, &spec).await?;
            final_eval = Some(e);
        }
        self.run.flush()?;
        session.leave().await.ok();
        Ok(self.run.into_summary(final_eval))
    }

    /// Epochs of the job before `clock`: every worker's examples, not this worker's (with
    /// balanced batches the workers see different shares).
    fn job_epochs(&self, spec: &JobSpec, clock: u64) -> f64 {
        let examples = if spec.global_batch > 0 {
            clock * spec.global_batch
        } else {
            self.run.summary().examples * u64::from(spec.num_workers)
        };
        examples as f64 / self.split.train.len().max(1) as f64
    }

    /// Pulls what a training step needs, under the tables' pull codecs, in one round: every
    /// dense table when `dense` holds the job's minimum clock (the cached copy is stale), and
    /// the rows `batch` touches. The two go at once, not one after the other, the rows asked
    /// first: their requests and answers are the step's long pole (ids and digests up, rows
    /// down), and the dense tables' requests are a few bytes each, so they queue behind them
    /// on a link at no cost (asking the dense tables first held the rows back by about half a
    /// millisecond a step: README, the CTR link suites).
    async fn pull_step(
        &mut self,
        batch: &Batch,
        dense: Option<u64>,
        step: &tracing::Span,
    ) -> anyhow::Result<()> {
        let (ps, dense_tables, sparse_tables) =
            (&self.ps, self.net.dense_tables(), self.net.sparse_tables());
        let (rows, tables) = tokio::try_join!(
            async {
                if sparse_tables.is_empty() {
                    Ok(None)
                } else {
                    fetch_rows(ps, sparse_tables, batch, false)
                        .instrument(tracing::info_span!(parent: step, "pull", kind = "sparse"))
                        .await
                        .map(Some)
                }
            },
            async {
                match dense {
                    Some(_) => fetch_dense(ps, dense_tables, false)
                        .instrument(tracing::info_span!(parent: step, "pull", kind = "dense"))
                        .await
                        .map(Some),
                    None => Ok(None),
                }
            }
        )?;
        if let (Some(pulled), Some(min_clock)) = (tables, dense) {
            self.set_dense(pulled)?;
            self.cache.pulled_at(min_clock);
        }
        if let Some(rows) = rows {
            self.net.set_rows(&rows)?;
        }
        Ok(())
    }

    /// Pulls every dense table into the model and the cached copy, under the tables' pull
    /// codecs, or `exact`ly (f32, for evaluating what the shards hold).
    async fn refresh_dense(&mut self, exact: bool) -> anyhow::Result<()> {
        let pulled = fetch_dense(&self.ps, self.net.dense_tables(), exact).await?;
        self.set_dense(pulled)
    }

    /// Takes pulled dense tables (from [`fetch_dense`]) into the model and the cached
    /// copy.
    fn set_dense(&mut self, pulled: Vec<Vec<f32>>) -> anyhow::Result<()> {
        let tables = self.net.dense_tables().to_vec();
        for ((t, _), v) in tables.iter().zip(&pulled) {
            self.net.set_dense(t, v)?;
        }
        self.cache.set_values(pulled);
        self.run.dense_pull();
        Ok(())
    }

    /// Rows holding a residual and rows that gave theirs up, over every sparse table.
    fn row_residuals(&self) -> (usize, u64) {
        self.net
            .sparse_tables()
            .iter()
            .filter_map(|(t, _)| self.ps.row_residuals(t).ok())
            .fold((0, 0), |(r, e), (rows, evicted)| (r + rows, e + evicted))
    }

    /// Forward and backward over the batch in micro-batches; returns the summed loss and hits.
    fn compute(&mut self, batch: &Batch, scale: f32) -> anyhow::Result<(f64, usize)> {
        self.net.zero_grads()?;
        let parts = (self.cfg.micro_batches as usize).clamp(1, batch.len().max(1));
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
    async fn push(&mut self) -> anyhow::Result<Pushed> {
        let mut grads = self.net.grads()?;
        if let Some(m) = &mut self.momentum {
            m.apply(&mut grads.dense);
        }
        let ps = &self.ps;
        let dense = try_join_all(grads.dense.iter().map(|(t, g)| ps.push_dense(t, g)));
        let sparse = try_join_all(
            grads
                .sparse
                .iter()
                .map(|(t, ids, rows)| ps.push_sparse(t, ids, rows)),
        );
        let (dense, sparse) = tokio::try_join!(dense, sparse)?;
        if let Some(m) = &mut self.momentum {
            // Momentum factor masking, for codecs that send some positions and keep the rest
            // in their residual.
            for (i, ((t, _), summary)) in grads.dense.iter().zip(&dense).enumerate() {
                if let Some(sent) = &summary.sent
                    && ps.table_codec(t)?.push.keeps_residual()
                {
                    m.mask(i, sent);
                }
            }
        }
        // Read-my-writes: the cached copy moves as the shards will move it for these gradients.
        for (t, values) in self.cache.own_push(&grads.dense) {
            self.net.set_dense(t, values)?;
        }
        // The ids the sparse pushes sent, 8 bytes each.
        let ids: u64 = sparse.iter().map(|s| s.rows * 8).sum();
        let all = || dense.iter().chain(&sparse);
        Ok(Pushed {
            wire_bytes: all().map(|s| s.wire_bytes).sum::<u64>() + ids,
            raw_bytes: all().map(|s| s.raw_bytes).sum::<u64>() + ids,
        })
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
        self.refresh_dense(true).await?;
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
                let rows = fetch_rows(&self.ps, self.net.sparse_tables(), &batch, true).await?;
                self.net.set_rows(&rows)?;
            }
            let s = tokio::task::block_in_place(|| self.net.step(&batch, 1.0, false, &mut probs))?;
            loss += s.loss;
            correct += s.correct;
            scored.extend(probs.iter().copied().zip(batch.labels.iter().copied()));
        }
        let summary = self.run.summary();
        let e = EvalRecord {
            clock,
            epoch,
            test_loss: loss / n.max(1) as f64,
            test_accuracy: correct as f64 / n.max(1) as f64,
            auc: (!scored.is_empty()).then(|| auc(&mut scored)),
            train_loss: window.loss(),
            train_accuracy: window.accuracy(),
            examples: summary.examples,
            wire_bytes: summary.wire_bytes,
            elapsed_s: self.started.elapsed().as_secs_f64(),
            train_s,
        };
        self.eval_time += eval_start.elapsed();
        self.metrics.evaluated(e.test_accuracy, e.test_loss);
        self.run.eval(&e)?;
        Ok(e)
    }
}

/// Every dense table of `tables`, in order, under the tables' pull codecs or `exact`ly (f32,
/// for evaluating what the shards hold).
async fn fetch_dense(
    ps: &PsClient,
    tables: &[(String, usize)],
    exact: bool,
) -> anyhow::Result<Vec<Vec<f32>>> {
    Ok(try_join_all(tables.iter().map(|(t, _)| async move {
        if exact {
            ps.pull_dense_f32(t).await
        } else {
            ps.pull_dense(t).await
        }
    }))
    .await?)
}

/// The rows `batch` touches in the sparse `tables` (`wide`, then `emb`), under the tables'
/// pull codecs or `exact`ly.
///
/// Tables placed alike (the model places `wide` with `emb`) come in one request per shard,
/// which sends the batch's ids once. Tables placed apart each send them: the table with the
/// widest rows is asked first, so that over a link its answers come down while the other
/// tables' ids are still going up (at 100 Mbit/s on the CTR set, 1.5 ms of a 13.5 ms pull).
async fn fetch_rows(
    ps: &PsClient,
    tables: &[(String, usize)],
    batch: &Batch,
    exact: bool,
) -> anyhow::Result<SparseRows> {
    let ids = SparseRows::ids_of(batch);
    let mut order: Vec<usize> = (0..tables.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(tables[i].1));
    let names: Vec<&str> = order.iter().map(|&i| tables[i].0.as_str()).collect();
    let fetched = if exact {
        ps.pull_sparse_tables_f32(&names, &ids).await?
    } else {
        ps.pull_sparse_tables(&names, &ids).await?
    };
    let mut pulled = vec![Vec::new(); tables.len()];
    for (i, rows) in order.into_iter().zip(fetched) {
        pulled[i] = rows;
    }
    let mut pulled = pulled.into_iter();
    Ok(SparseRows {
        ids,
        wide: pulled.next().unwrap_or_default(),
        emb: pulled.next().unwrap_or_default(),
    })
}
