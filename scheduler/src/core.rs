//! The scheduler's behaviour: membership and leases, long-polled clock grants, the shard map,
//! coordinated checkpoints and resume, and the durable state file. The gRPC layer
//! (`service.rs`) only converts messages and calls these methods, so tests can drive them with
//! paused time.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use ps_client::{ClientConfig, PsClient};
use ps_core::JobSpec;
use tokio::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

use crate::metrics as m;
use crate::policy::WorkerId;
use crate::state::{
    ClockReport, Cluster, Grant, Job, JobCheckpoint, JobState, Joined, Result, Saved, SchedError,
    ShardCheckpointRef, ShardMember,
};

/// How the scheduler behaves.
#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// Where the job state and job checkpoint manifests are kept; `None` keeps nothing.
    pub data_dir: Option<PathBuf>,
    /// Lease of shards, and of workers of jobs that set none.
    pub lease: Duration,
    /// Longest wait of one AdvanceClock call before it answers `ready = false`.
    pub max_wait: Duration,
    /// How often leases are checked and lazily saved state is written.
    pub tick: Duration,
    /// Longest time a checkpoint or resume waits for the workers to reach its boundary.
    pub checkpoint_timeout: Duration,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            data_dir: None,
            lease: Duration::from_secs(5),
            max_wait: Duration::from_secs(10),
            tick: Duration::from_millis(100),
            checkpoint_timeout: Duration::from_secs(300),
        }
    }
}

const STATE_FILE: &str = "scheduler-state.json";
const FORMAT: u32 = 1;

#[derive(Debug)]
struct State {
    cluster: Cluster,
    jobs: std::collections::BTreeMap<String, Job>,
    next_worker_id: WorkerId,
    dirty: bool,
}

/// The scheduler. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Scheduler {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    cfg: SchedulerConfig,
    state: Mutex<State>,
    /// Serializes writes of the state file.
    save_lock: tokio::sync::Mutex<()>,
    /// Wakes the ticker before its next tick.
    kick: tokio::sync::Notify,
    /// Cancelled when the service shuts down: long polls answer at once.
    shutdown: CancellationToken,
    /// Stops the ticker ([`Scheduler::close`]).
    stop: CancellationToken,
}

/// A shard map as published.
#[derive(Debug, Clone)]
pub struct ShardMap {
    pub epoch: u64,
    pub num_shards: u32,
    pub virtual_nodes: u32,
    pub endpoints: Vec<String>,
    pub complete: bool,
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl Scheduler {
    /// Opens the scheduler, reading its state file when there is one, and starts the ticker
    /// (leases, table creation, interval checkpoints, lazy saves) until [`Scheduler::close`].
    /// Long polls return early once `shutdown` is cancelled.
    pub fn open(cfg: SchedulerConfig, shutdown: CancellationToken) -> anyhow::Result<Self> {
        let now = Instant::now();
        let mut state = State {
            cluster: Cluster::default(),
            jobs: Default::default(),
            next_worker_id: 1,
            dirty: false,
        };
        if let Some(dir) = &cfg.data_dir {
            let path = dir.join(STATE_FILE);
            match std::fs::read(&path) {
                Ok(bytes) => {
                    let saved: Saved = serde_json::from_slice(&bytes).map_err(|e| {
                        anyhow::anyhow!("{} is not a valid state file: {e}", path.display())
                    })?;
                    if saved.format != FORMAT {
                        anyhow::bail!(
                            "{} has format {}; this scheduler reads {FORMAT}",
                            path.display(),
                            saved.format
                        );
                    }
                    state.cluster.epoch = saved.epoch;
                    state.cluster.num_shards = saved.num_shards;
                    state.cluster.virtual_nodes = saved.virtual_nodes;
                    state.cluster.shards = vec![None; saved.num_shards as usize];
                    state.cluster.known = saved.endpoints;
                    state.next_worker_id = saved.next_worker_id.max(1);
                    for j in saved.jobs {
                        let job = Job::restore(j, now, cfg.lease);
                        state.jobs.insert(job.spec.name.clone(), job);
                    }
                    tracing::info!(
                        jobs = state.jobs.len(),
                        epoch = saved.epoch,
                        "state restored"
                    );
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => anyhow::bail!("reading {}: {e}", path.display()),
            }
        }
        let this = Self {
            inner: Arc::new(Inner {
                cfg,
                state: Mutex::new(state),
                save_lock: tokio::sync::Mutex::new(()),
                kick: tokio::sync::Notify::new(),
                shutdown,
                stop: CancellationToken::new(),
            }),
        };
        let ticker = this.clone();
        tokio::spawn(async move { ticker.run_ticker().await });
        Ok(this)
    }

    /// Stops the ticker and writes the state file a last time.
    pub async fn close(&self) {
        self.inner.stop.cancel();
        if let Err(e) = self.save().await {
            tracing::error!(error = %e, "saving the scheduler state at shutdown");
        }
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.inner.cfg
    }

    // -----------------------------------------------------------------------------------------
    // Persistence

    fn snapshot(&self) -> Saved {
        let mut st = self.inner.state.lock();
        st.dirty = false;
        Saved {
            format: FORMAT,
            epoch: st.cluster.epoch,
            num_shards: st.cluster.num_shards,
            virtual_nodes: st.cluster.virtual_nodes,
            endpoints: st.cluster.known.clone(),
            next_worker_id: st.next_worker_id,
            jobs: st.jobs.values().map(Job::save).collect(),
        }
    }

    /// Writes the state file now (jobs submitted or canceled, epochs, checkpoints).
    async fn save(&self) -> Result<()> {
        let Some(dir) = self.inner.cfg.data_dir.clone() else {
            return Ok(());
        };
        let _g = self.inner.save_lock.lock().await;
        let saved = self.snapshot();
        let bytes = serde_json::to_vec(&saved).map_err(|e| SchedError::Internal(e.to_string()))?;
        tokio::task::spawn_blocking(move || {
            ps_runtime::config::write_atomic(&dir.join(STATE_FILE), &bytes)
        })
        .await
        .map_err(|e| SchedError::Internal(e.to_string()))?
        .map_err(|e| SchedError::Internal(format!("writing the scheduler state: {e}")))
    }

    // -----------------------------------------------------------------------------------------
    // Jobs

    /// Submits `spec`; the same spec again is fine, another spec under its name is refused.
    pub async fn submit(&self, spec: JobSpec) -> Result<()> {
        {
            let mut st = self.inner.state.lock();
            if let Some(j) = st.jobs.get(&spec.name) {
                if j.spec == spec {
                    return Ok(());
                }
                return Err(SchedError::AlreadyExists(format!(
                    "job `{}` exists with another spec; cancel it and submit under a new name",
                    spec.name
                )));
            }
            let mut job = Job::new(spec);
            let cluster = st.cluster.clone();
            job.refresh(&cluster);
            tracing::info!(job = job.name(), consistency = %job.spec.consistency, "job submitted");
            st.jobs.insert(job.spec.name.clone(), job);
        }
        self.save().await?;
        self.kick();
        Ok(())
    }

    /// Runs `f` on job `name` under the lock.
    pub fn with_job<T>(&self, name: &str, f: impl FnOnce(&mut Job, &Cluster) -> T) -> Result<T> {
        let mut st = self.inner.state.lock();
        let State { cluster, jobs, .. } = &mut *st;
        let job = jobs
            .get_mut(name)
            .ok_or_else(|| SchedError::NotFound(format!("no job named `{name}`")))?;
        Ok(f(job, cluster))
    }

    pub fn job_names(&self) -> Vec<String> {
        self.inner.state.lock().jobs.keys().cloned().collect()
    }

    pub async fn cancel(&self, name: &str) -> Result<()> {
        self.with_job(name, |job, _| {
            if !job.state.is_terminal() {
                job.state = JobState::Canceled;
                job.message = "canceled".into();
                job.wake();
            }
        })?;
        self.save().await
    }

    // -----------------------------------------------------------------------------------------
    // Shards

    pub async fn register_shard(
        &self,
        index: u32,
        num_shards: u32,
        virtual_nodes: u32,
        endpoint: String,
    ) -> Result<(u64, Duration)> {
        let lease = self.inner.cfg.lease;
        let epoch = {
            let mut st = self.inner.state.lock();
            let c = &mut st.cluster;
            if num_shards == 0 || index >= num_shards {
                return Err(SchedError::InvalidArgument(format!(
                    "shard index {index} is not below the shard count {num_shards}"
                )));
            }
            if c.num_shards != 0 && (c.num_shards != num_shards || c.virtual_nodes != virtual_nodes)
            {
                return Err(SchedError::FailedPrecondition(format!(
                    "this cluster has {} shards with {} virtual nodes; shard {index} says {num_shards} with {virtual_nodes}",
                    c.num_shards, c.virtual_nodes
                )));
            }
            c.num_shards = num_shards;
            c.virtual_nodes = virtual_nodes;
            c.shards.resize(num_shards as usize, None);
            c.shards[index as usize] = Some(ShardMember {
                endpoint: endpoint.clone(),
                lease_until: Instant::now() + lease,
            });
            c.known.resize(num_shards as usize, String::new());
            // A shard coming back at the same address changes no route: same epoch. A new
            // address is a new map, and clients routed with the old one are refused.
            if c.known[index as usize] != endpoint || c.epoch == 0 {
                c.known[index as usize] = endpoint.clone();
                c.epoch += 1;
            }
            let epoch = c.epoch;
            m::map_epoch(epoch);
            let cluster = st.cluster.clone();
            for job in st.jobs.values_mut() {
                job.refresh(&cluster);
                job.wake();
            }
            epoch
        };
        tracing::info!(shard = index, %endpoint, epoch, "shard registered");
        self.save().await?;
        self.kick();
        Ok((epoch, lease))
    }

    pub fn shard_heartbeat(&self, index: u32, endpoint: &str) -> Result<u64> {
        let lease = self.inner.cfg.lease;
        let mut st = self.inner.state.lock();
        let c = &mut st.cluster;
        match c.shards.get_mut(index as usize) {
            Some(Some(m)) if m.endpoint == endpoint => {
                m.lease_until = Instant::now() + lease;
                Ok(c.epoch)
            }
            _ => Err(SchedError::NotFound(format!(
                "shard {index} at {endpoint} is not registered (its lease expired or the scheduler restarted); register again"
            ))),
        }
    }

    pub fn shard_map(&self) -> ShardMap {
        let st = self.inner.state.lock();
        let c = &st.cluster;
        ShardMap {
            epoch: c.epoch,
            num_shards: c.num_shards,
            virtual_nodes: c.virtual_nodes,
            endpoints: c.endpoints(),
            complete: c.complete(),
        }
    }

    /// A client for the shards of the current map, or `unavailable` when one is missing.
    async fn shards_client(&self) -> Result<PsClient> {
        let map = self.shard_map();
        if !map.complete {
            return Err(SchedError::Unavailable(
                "not every shard is registered; try again when the job is running".into(),
            ));
        }
        let mut cfg = ClientConfig::new(map.endpoints);
        cfg.map_epoch = map.epoch;
        cfg.max_attempts = 5;
        PsClient::connect(cfg)
            .await
            .map_err(|e| SchedError::Unavailable(format!("reaching the shards: {e}")))
    }

    // -----------------------------------------------------------------------------------------
    // Workers

    pub fn join(&self, job: &str, name: &str, id: WorkerId) -> Result<(Joined, ShardMap)> {
        let default_lease = self.inner.cfg.lease;
        let joined = {
            let mut st = self.inner.state.lock();
            let id = if id == 0 {
                let id = st.next_worker_id;
                st.next_worker_id += 1;
                id
            } else {
                st.next_worker_id = st.next_worker_id.max(id + 1);
                id
            };
            st.dirty = true;
            let State { cluster, jobs, .. } = &mut *st;
            let j = jobs
                .get_mut(job)
                .ok_or_else(|| SchedError::NotFound(format!("no job named `{job}`")))?;
            if j.state.is_terminal() {
                return Err(SchedError::FailedPrecondition(format!(
                    "job `{job}` has ended ({:?}): {}",
                    j.state, j.message
                )));
            }
            let lease = j.lease(default_lease);
            let joined = j.join(id, name, Instant::now(), lease);
            j.refresh(cluster);
            m::live_workers(job, j.live().len());
            joined
        };
        tracing::info!(
            job,
            worker = joined.worker_id,
            name,
            clock = joined.clock,
            "worker joined"
        );
        Ok((joined, self.shard_map()))
    }

    pub fn worker_heartbeat(&self, job: &str, id: WorkerId) -> Result<(u64, JobState)> {
        let default_lease = self.inner.cfg.lease;
        let mut st = self.inner.state.lock();
        let epoch = st.cluster.epoch;
        let j = st
            .jobs
            .get_mut(job)
            .ok_or_else(|| SchedError::NotFound(format!("no job named `{job}`")))?;
        let lease = j.lease(default_lease);
        let state = j.state;
        j.member(id)?.lease_until = Instant::now() + lease;
        Ok((epoch, state))
    }

    pub fn leave(&self, job: &str, id: WorkerId) -> Result<()> {
        self.with_job(job, |j, _| {
            j.member(id)?;
            j.remove(id);
            m::live_workers(job, j.live().len());
            Ok::<_, SchedError>(())
        })??;
        self.inner.state.lock().dirty = true;
        self.kick();
        Ok(())
    }

    /// Records a clock report, then waits (up to `wait`, or the configured maximum) until the
    /// worker may start its next clock.
    pub async fn advance(
        &self,
        job: &str,
        id: WorkerId,
        report: ClockReport,
        wait: Option<Duration>,
    ) -> Result<(Grant, u64)> {
        let wait = wait
            .unwrap_or(self.inner.cfg.max_wait)
            .min(self.inner.cfg.max_wait);
        let deadline = Instant::now() + wait;
        let default_lease = self.inner.cfg.lease;
        let mut checkpoint_due = false;
        self.with_job(job, |j, _| {
            let lease = j.lease(default_lease);
            j.report(id, &report, Instant::now(), lease)?;
            checkpoint_due = j.checkpoint_due();
            Ok::<_, SchedError>(())
        })??;
        if report.finished.is_some() {
            self.inner.state.lock().dirty = true;
        }
        if checkpoint_due {
            self.kick();
        }
        loop {
            let (grant, mut rx, epoch) = {
                let mut st = self.inner.state.lock();
                let epoch = st.cluster.epoch;
                let j = st
                    .jobs
                    .get_mut(job)
                    .ok_or_else(|| SchedError::NotFound(format!("no job named `{job}`")))?;
                let rx = j.wake.subscribe();
                (j.try_grant(id, Instant::now())?, rx, epoch)
            };
            if let Some(g) = grant {
                return Ok((g, epoch));
            }
            let woke = tokio::select! {
                r = tokio::time::timeout_at(deadline, rx.changed()) => matches!(r, Ok(Ok(()))),
                () = self.inner.shutdown.cancelled() => false,
            };
            if !woke {
                return self.with_job(job, |j, c| {
                    let clock = j.clocks.clock(id).unwrap_or(0);
                    (
                        Grant {
                            ready: false,
                            clock,
                            min_clock: j.clocks.min().unwrap_or(0),
                            assignment: j.assignment(id),
                            state: j.state,
                            stop: false,
                        },
                        c.epoch,
                    )
                });
            }
        }
    }

    // -----------------------------------------------------------------------------------------
    // Checkpoints

    fn checkpoint_dir(&self, job: &str) -> Option<PathBuf> {
        self.inner
            .cfg
            .data_dir
            .as_ref()
            .map(|d| d.join("jobs").join(job).join("checkpoints"))
    }

    /// Waits until `ready(job)` holds, waking on every job change, up to the checkpoint timeout.
    async fn wait_for(&self, job: &str, what: &str, ready: impl Fn(&Job) -> bool) -> Result<()> {
        let deadline = Instant::now() + self.inner.cfg.checkpoint_timeout;
        loop {
            let mut rx = self.with_job(job, |j, _| {
                if ready(j) {
                    None
                } else {
                    Some(j.wake.subscribe())
                }
            })?;
            let Some(rx) = rx.as_mut() else {
                return Ok(());
            };
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => {}
                _ => {
                    return Err(SchedError::Unavailable(format!(
                        "job `{job}`: gave up waiting for {what} after {:?}",
                        self.inner.cfg.checkpoint_timeout
                    )));
                }
            }
        }
    }

    /// Takes a coordinated checkpoint: holds every worker at one clock boundary, checkpoints
    /// every shard, and writes the job manifest atomically. On demand the boundary is one past
    /// the furthest clock being computed; on schedule it is the next multiple of the interval.
    pub async fn checkpoint(&self, job: &str, on_demand: bool) -> Result<JobCheckpoint> {
        let boundary = self.with_job(job, |j, _| {
            if j.state != JobState::Running {
                return Err(SchedError::FailedPrecondition(format!(
                    "job `{job}` is not running ({:?}{}); a checkpoint needs live shards and tables",
                    j.state,
                    if j.message.is_empty() { String::new() } else { format!(": {}", j.message) }
                )));
            }
            if j.checkpointing {
                return Err(SchedError::FailedPrecondition(format!(
                    "job `{job}` is already taking a checkpoint or resuming; try again when it is done"
                )));
            }
            let b = if on_demand {
                let next = j.clocks.max().map_or(0, |m| m + 1);
                j.clocks.barrier().map_or(next, |b| b.min(next))
            } else {
                j.clocks.barrier().ok_or_else(|| {
                    SchedError::Internal("no checkpoint boundary is set".into())
                })?
            };
            j.checkpointing = true;
            j.clocks.set_barrier(Some(b));
            j.wake();
            Ok(b)
        })??;
        let result = self.checkpoint_at(job, boundary).await;
        let _ = self.with_job(job, |j, _| {
            j.checkpointing = false;
            // After a failure the next scheduled boundary is at or after the failed one, so a
            // failed scheduled checkpoint is tried again rather than skipped.
            let after = if result.is_ok() {
                boundary
            } else {
                boundary.saturating_sub(1)
            };
            j.lift_barrier_after(after);
        });
        match &result {
            Ok(c) => tracing::info!(job, name = %c.name, clock = c.clock, "checkpoint complete"),
            Err(e) => tracing::warn!(job, clock = boundary, error = %e, "checkpoint failed"),
        }
        m::checkpoint(job, result.is_ok());
        result
    }

    async fn checkpoint_at(&self, job: &str, clock: u64) -> Result<JobCheckpoint> {
        self.wait_for(job, "the workers to reach the checkpoint's clock", |j| {
            j.clocks.min().is_none_or(|m| m >= clock)
                && j.workers.values().all(|w| !w.live || !w.running)
        })
        .await?;
        let n = self.with_job(job, |j, _| j.checkpoints.len())?;
        let name = format!("{job}-c{clock}-{n}");
        let ps = self.shards_client().await?;
        let done = ps
            .checkpoint(&name)
            .await
            .map_err(|e| SchedError::Unavailable(format!("shard checkpoint failed: {e}")))?;
        let map = self.shard_map();
        let ckpt = JobCheckpoint {
            job: job.to_owned(),
            name: name.clone(),
            clock,
            created_unix_ms: unix_ms(),
            map_epoch: map.epoch,
            shards: done
                .into_iter()
                .map(|s| ShardCheckpointRef {
                    shard_index: s.shard as u32,
                    endpoint: map.endpoints.get(s.shard).cloned().unwrap_or_default(),
                    name: s.name,
                    path: s.path,
                    files: s.files,
                    bytes: s.bytes,
                    sequence: s.sequence,
                })
                .collect(),
        };
        if let Some(dir) = self.checkpoint_dir(job) {
            let bytes = serde_json::to_vec_pretty(&ckpt)
                .map_err(|e| SchedError::Internal(e.to_string()))?;
            let path = dir.join(format!("{name}.json"));
            tokio::task::spawn_blocking(move || ps_runtime::config::write_atomic(&path, &bytes))
                .await
                .map_err(|e| SchedError::Internal(e.to_string()))?
                .map_err(|e| SchedError::Internal(format!("writing the job manifest: {e}")))?;
        }
        self.with_job(job, |j, _| j.checkpoints.push(ckpt.clone()))?;
        self.save().await?;
        Ok(ckpt)
    }

    pub fn checkpoints(&self, job: &str) -> Result<Vec<JobCheckpoint>> {
        self.with_job(job, |j, _| j.checkpoints.clone())
    }

    /// Restores every shard to checkpoint `name` (the latest when `None`) and restarts every
    /// live worker at its clock. Workers are held until no clock is being computed.
    pub async fn resume(&self, job: &str, name: Option<&str>) -> Result<JobCheckpoint> {
        let ckpt = self.with_job(job, |j, cluster| {
            let c = match name {
                Some(n) => j
                    .checkpoints
                    .iter()
                    .find(|c| c.name == n)
                    .cloned()
                    .ok_or_else(|| {
                        SchedError::NotFound(format!("job `{job}` has no checkpoint named `{n}`"))
                    })?,
                None => j.checkpoints.last().cloned().ok_or_else(|| {
                    SchedError::NotFound(format!("job `{job}` has no complete checkpoint yet"))
                })?,
            };
            if j.checkpointing {
                return Err(SchedError::FailedPrecondition(format!(
                    "job `{job}` is already taking a checkpoint or resuming"
                )));
            }
            j.checkpointing = true;
            j.resuming = true;
            // Paused from now on: no clock is granted until the shards are restored.
            j.refresh(cluster);
            j.wake();
            Ok(c)
        })??;
        let result = self.resume_from(job, &ckpt).await;
        let cluster = self.inner.state.lock().cluster.clone();
        let _ = self.with_job(job, |j, _| {
            j.checkpointing = false;
            j.resuming = false;
            if result.is_ok() {
                let live = j.live();
                j.clocks.reset_all(ckpt.clock);
                for w in live {
                    if let Some(x) = j.workers.get_mut(&w) {
                        x.restart_at = Some(ckpt.clock);
                        x.running = false;
                    }
                }
                if j.state.is_terminal() {
                    j.state = JobState::Waiting;
                    j.message.clear();
                }
                j.lift_barrier_after(ckpt.clock);
            }
            j.refresh(&cluster);
            j.wake();
        });
        self.save().await?;
        result.map(|()| ckpt)
    }

    async fn resume_from(&self, job: &str, ckpt: &JobCheckpoint) -> Result<()> {
        self.wait_for(job, "the workers to finish their clocks", |j| {
            j.workers.values().all(|w| !w.live || !w.running)
        })
        .await?;
        let ps = self.shards_client().await?;
        if ps.shards().len() != ckpt.shards.len() {
            return Err(SchedError::FailedPrecondition(format!(
                "checkpoint `{}` has {} shards; the cluster has {}",
                ckpt.name,
                ckpt.shards.len(),
                ps.shards().len()
            )));
        }
        let names: Vec<String> = ckpt.shards.iter().map(|s| s.name.clone()).collect();
        ps.restore_checkpoint(&names)
            .await
            .map_err(|e| SchedError::Unavailable(format!("restoring the shards: {e}")))?;
        tracing::info!(job, name = %ckpt.name, clock = ckpt.clock, "job resumed from checkpoint");
        Ok(())
    }

    // -----------------------------------------------------------------------------------------
    // The ticker

    /// Wakes the ticker early (something changed that it acts on).
    fn kick(&self) {
        self.inner.state.lock().dirty = true;
        self.inner.kick.notify_one();
    }

    async fn run_ticker(&self) {
        let mut last_save = Instant::now();
        loop {
            tokio::select! {
                () = tokio::time::sleep(self.inner.cfg.tick) => {}
                () = self.inner.kick.notified() => {}
                () = self.inner.stop.cancelled() => return,
            }
            let now = Instant::now();
            let (create, due) = self.expire_and_collect(now);
            for job in create {
                let this = self.clone();
                tokio::spawn(async move { this.create_tables(&job).await });
            }
            for job in due {
                let this = self.clone();
                tokio::spawn(async move {
                    let _ = this.checkpoint(&job, false).await;
                });
            }
            let dirty = self.inner.state.lock().dirty;
            if dirty && now.duration_since(last_save) >= Duration::from_secs(1) {
                if let Err(e) = self.save().await {
                    tracing::warn!(error = %e, "saving the scheduler state");
                }
                last_save = now;
            }
        }
    }

    /// Expires leases; returns the jobs whose tables should be created and those due for a
    /// scheduled checkpoint.
    fn expire_and_collect(&self, now: Instant) -> (Vec<String>, Vec<String>) {
        let mut st = self.inner.state.lock();
        let State {
            cluster,
            jobs,
            dirty,
            ..
        } = &mut *st;
        let mut lost_shard = false;
        for (i, s) in cluster.shards.iter_mut().enumerate() {
            if s.as_ref().is_some_and(|m| m.lease_until <= now) {
                tracing::warn!(shard = i, "shard lease expired; its jobs pause");
                *s = None;
                lost_shard = true;
            }
        }
        let mut create = Vec::new();
        let mut due = Vec::new();
        for job in jobs.values_mut() {
            let expired: Vec<WorkerId> = job
                .workers
                .iter()
                .filter(|(_, w)| w.live && w.lease_until <= now)
                .map(|(id, _)| *id)
                .collect();
            for w in expired {
                tracing::warn!(
                    job = job.name(),
                    worker = w,
                    "worker lease expired; removed from the clocks"
                );
                job.remove(w);
                m::live_workers(job.name(), job.live().len());
                *dirty = true;
            }
            if lost_shard {
                job.refresh(cluster);
            }
            if !job.state.is_terminal()
                && cluster.complete()
                && cluster.num_shards == job.spec.num_shards
                && !job.tables_ready
                && !job.creating_tables
            {
                job.creating_tables = true;
                create.push(job.spec.name.clone());
            }
            if job.checkpoint_due() {
                due.push(job.spec.name.clone());
            }
            m::min_clock(job.name(), job.clocks.min().unwrap_or(0));
        }
        (create, due)
    }

    async fn create_tables(&self, job: &str) {
        let specs = match self.with_job(job, |j, _| j.spec.tables.clone()) {
            Ok(s) => s,
            Err(_) => return,
        };
        let result = async {
            let ps = self.shards_client().await?;
            for t in specs {
                ps.create_table(t.spec.clone()).await.map_err(|e| {
                    SchedError::FailedPrecondition(format!("creating table `{}`: {e}", t.spec.name))
                })?;
            }
            Ok::<_, SchedError>(())
        }
        .await;
        let cluster = self.inner.state.lock().cluster.clone();
        let _ = self.with_job(job, |j, _| {
            j.creating_tables = false;
            match &result {
                Ok(()) => {
                    j.tables_ready = true;
                    tracing::info!(job, tables = j.spec.tables.len(), "tables created");
                }
                Err(SchedError::FailedPrecondition(m)) => {
                    j.state = JobState::Failed;
                    j.message = m.clone();
                    j.wake();
                }
                Err(e) => tracing::warn!(job, error = %e, "creating tables; will retry"),
            }
            j.refresh(&cluster);
        });
        let _ = self.save().await;
    }
}

impl Job {
    /// Whether a scheduled checkpoint should start: every live worker is held at the boundary.
    pub fn checkpoint_due(&self) -> bool {
        self.spec.checkpoint_every > 0
            && self.state == JobState::Running
            && !self.checkpointing
            && !self.clocks.is_empty()
            && self
                .clocks
                .barrier()
                .is_some_and(|b| self.clocks.min().is_some_and(|m| m >= b))
    }
}
