//! The scheduler's state: the cluster's shards and their map epoch, and every job with its
//! members, clocks, data-shard assignment and checkpoints. Plain data behind one mutex; the
//! async parts (waiting, talking to shards, writing files) live in [`crate::core`].
//!
//! Time is passed in (`now`), never read here, so lease logic runs the same under paused time.

use std::collections::{BTreeMap, VecDeque};

use ps_core::JobSpec;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::time::{Duration, Instant};

use crate::assign::{DataShards, batch_sizes};
use crate::cost::{CostMeter, SavedCost};
pub use ps_core::status::{JobCheckpoint, JobState, ShardCheckpointRef};
use ps_core::status::{JobStatus, StalenessStats, WorkerStatus};

pub use crate::error::{Result, SchedError};
use crate::policy::{ClockError, Clocks, Report, WorkerId};

/// A shard as registered.
#[derive(Debug, Clone)]
pub struct ShardMember {
    pub endpoint: String,
    pub lease_until: Instant,
    /// The authenticated caller that registered it (empty without authentication).
    pub owner: String,
}

/// The cluster's shards. The partitioning (count, virtual nodes) is fixed by the first shard
/// to register; each registration starts a new epoch.
#[derive(Debug, Clone, Default)]
pub struct Cluster {
    pub num_shards: u32,
    pub virtual_nodes: u32,
    pub shards: Vec<Option<ShardMember>>,
    /// The last endpoint each shard registered with (kept across lease losses and restarts):
    /// the epoch changes only when one of these does.
    pub known: Vec<String>,
    pub epoch: u64,
}

impl Cluster {
    pub fn complete(&self) -> bool {
        self.num_shards > 0 && self.shards.iter().all(Option::is_some)
    }

    pub fn endpoints(&self) -> Vec<String> {
        self.shards
            .iter()
            .map(|s| s.as_ref().map(|m| m.endpoint.clone()).unwrap_or_default())
            .collect()
    }

    fn missing(&self) -> Vec<usize> {
        self.shards
            .iter()
            .enumerate()
            .filter(|(_, s)| s.is_none())
            .map(|(i, _)| i)
            .collect()
    }
}

/// Staleness and waiting of one worker (or a whole job), as measured.
#[derive(Debug, Clone, Default)]
pub struct Staleness {
    pub advances: u64,
    pub gap_sum: u64,
    pub max_gap: u64,
    pub wait_total: Duration,
    /// The last waits, for a p99.
    pub waits: VecDeque<Duration>,
    pub age_sum_us: u64,
    pub age_reports: u64,
}

const WAIT_WINDOW: usize = 1024;

impl Staleness {
    fn granted(&mut self, gap: u64, waited: Duration) {
        self.advances += 1;
        self.gap_sum += gap;
        self.max_gap = self.max_gap.max(gap);
        self.wait_total += waited;
        if self.waits.len() == WAIT_WINDOW {
            self.waits.pop_front();
        }
        self.waits.push_back(waited);
    }

    pub fn mean_gap(&self) -> f64 {
        if self.advances == 0 {
            0.0
        } else {
            self.gap_sum as f64 / self.advances as f64
        }
    }

    pub fn wait_p99(&self) -> Duration {
        let mut w: Vec<Duration> = self.waits.iter().copied().collect();
        if w.is_empty() {
            return Duration::ZERO;
        }
        w.sort_unstable();
        w[((w.len() as f64 * 0.99).ceil() as usize).clamp(1, w.len()) - 1]
    }

    pub fn mean_age_ms(&self) -> f64 {
        if self.age_reports == 0 {
            0.0
        } else {
            self.age_sum_us as f64 / self.age_reports as f64 / 1000.0
        }
    }

    /// The figures a status reports.
    pub fn stats(&self) -> StalenessStats {
        StalenessStats {
            max_gap: self.max_gap,
            mean_gap: self.mean_gap(),
            wait_ms_total: self.wait_total.as_secs_f64() * 1e3,
            wait_ms_p99: self.wait_p99().as_secs_f64() * 1e3,
            param_age_ms_mean: self.mean_age_ms(),
            advances: self.advances,
        }
    }
}

#[derive(Debug)]
pub struct Worker {
    pub name: String,
    /// The authenticated caller that joined with this id (empty without authentication): only
    /// it may report, heartbeat, leave or join again under the id.
    pub owner: String,
    pub live: bool,
    pub lease_until: Instant,
    /// Granted a clock and has not reported it yet.
    pub running: bool,
    /// Set by a resume: the next answer restarts the worker at this clock, whatever it reports.
    pub restart_at: Option<u64>,
    /// Restored after a scheduler restart: its first report may be ahead of the recorded clock.
    pub resync: bool,
    pub waiting_since: Option<Instant>,
    /// Examples per second of compute, smoothed.
    pub throughput: f64,
    pub batch: u64,
    pub version: u64,
    pub stats: Staleness,
}

#[derive(Debug)]
pub struct Job {
    pub spec: JobSpec,
    pub state: JobState,
    pub message: String,
    pub clocks: Clocks,
    pub workers: BTreeMap<WorkerId, Worker>,
    pub data: DataShards,
    /// Distinct workers that ever joined: clock 0 is granted once num_workers have.
    pub joined_ever: u32,
    pub tables_ready: bool,
    pub creating_tables: bool,
    pub checkpoints: Vec<JobCheckpoint>,
    /// Checkpoint attempts begun, saved before the shards are asked: every attempt gets a name
    /// of its own, so one that reached some shards but was never recorded (a shard or the
    /// scheduler died mid-way) cannot make every later attempt collide with its leftovers.
    pub checkpoint_attempts: u64,
    /// Shard-side checkpoints to delete: off the job's list (deleted, pruned, or attempts that
    /// failed), not yet deleted from every shard. Tried again after each checkpoint.
    pub deleting: Vec<String>,
    /// Scheduled checkpoints that failed in a row, and when the ticker may try the next one
    /// (backing off, so a shard that is down is not asked every tick).
    pub checkpoint_failures: u32,
    pub checkpoint_retry_at: Option<Instant>,
    /// A checkpoint, a resume or a deletion is in progress (one at a time).
    pub checkpointing: bool,
    /// A resume holds every worker until the shards are restored.
    pub resuming: bool,
    /// Woken (the value bumped) when anything a waiting worker depends on changes.
    pub wake: watch::Sender<u64>,
    pub stats: Staleness,
    /// Times of recent advances, for advances per second.
    pub recent: VecDeque<Instant>,
    pub cost: CostMeter,
}

/// What a worker gets when it joins.
#[derive(Debug, Clone)]
pub struct Joined {
    pub worker_id: WorkerId,
    pub clock: u64,
    pub assignment: Assignment,
    pub lease: Duration,
    pub spec: JobSpec,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assignment {
    pub version: u64,
    pub data_shards: Vec<u32>,
    pub num_data_shards: u32,
    pub batch_size: u64,
}

/// The answer to a clock report.
#[derive(Debug, Clone)]
pub struct Grant {
    pub ready: bool,
    pub clock: u64,
    pub min_clock: u64,
    pub assignment: Assignment,
    pub state: JobState,
    pub stop: bool,
}

/// What a clock report says about the finished clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct ClockReport {
    pub finished: Option<u64>,
    pub examples: u64,
    pub compute: Duration,
    pub param_age: Duration,
    /// CPU time the worker's process has used so far (zero: not reported).
    pub cpu: Duration,
}

impl Job {
    pub fn new(spec: JobSpec) -> Self {
        let mut clocks = Clocks::new(spec.consistency.bound());
        clocks.set_barrier(next_boundary(spec.checkpoint_every, 0));
        Self {
            data: DataShards::new(spec.data_shards),
            clocks,
            state: JobState::Waiting,
            message: "waiting for the shards".into(),
            workers: BTreeMap::new(),
            joined_ever: 0,
            tables_ready: false,
            creating_tables: false,
            checkpoints: Vec::new(),
            checkpoint_attempts: 0,
            deleting: Vec::new(),
            checkpoint_failures: 0,
            checkpoint_retry_at: None,
            checkpointing: false,
            resuming: false,
            wake: watch::channel(0).0,
            stats: Staleness::default(),
            recent: VecDeque::new(),
            cost: CostMeter::submitted_now(),
            spec,
        }
    }

    pub fn name(&self) -> &str {
        &self.spec.name
    }

    pub fn wake(&self) {
        self.wake.send_modify(|g| *g += 1);
    }

    pub fn live(&self) -> Vec<WorkerId> {
        self.workers
            .iter()
            .filter(|(_, w)| w.live)
            .map(|(id, _)| *id)
            .collect()
    }

    pub fn lease(&self, default: Duration) -> Duration {
        if self.spec.lease_ms == 0 {
            default
        } else {
            Duration::from_millis(self.spec.lease_ms)
        }
    }

    pub fn assignment(&self, w: WorkerId) -> Assignment {
        let (version, batch) = self
            .workers
            .get(&w)
            .map(|x| (x.version, x.batch))
            .unwrap_or_default();
        Assignment {
            version,
            data_shards: self.data.of(w),
            num_data_shards: self.data.len(),
            batch_size: batch,
        }
    }

    fn bump(&mut self, ws: &[WorkerId]) {
        for w in ws {
            if let Some(x) = self.workers.get_mut(w) {
                x.version += 1;
            }
        }
    }

    /// Recomputes each live worker's batch from the global batch and the measured throughput.
    pub fn rebalance_batches(&mut self) {
        if self.spec.global_batch == 0 {
            return;
        }
        let live = self.live();
        let tps: Vec<(WorkerId, f64)> = live
            .iter()
            .map(|w| {
                let tp = if self.spec.balance_batches {
                    self.workers[w].throughput
                } else {
                    0.0
                };
                (*w, tp)
            })
            .collect();
        for (w, b) in batch_sizes(self.spec.global_batch, &tps) {
            if let Some(x) = self.workers.get_mut(&w)
                && x.batch != b
            {
                x.batch = b;
                x.version += 1;
            }
        }
    }

    /// Recomputes the state from the shards, tables and members. Returns whether it changed.
    pub fn refresh(&mut self, cluster: &Cluster) -> bool {
        if self.state.is_terminal() {
            return false;
        }
        let before = (self.state, self.message.clone());
        (self.state, self.message) =
            if cluster.num_shards != 0 && cluster.num_shards != self.spec.num_shards {
                (
                    JobState::Failed,
                    format!(
                        "the job wants {} shards but the cluster has {}",
                        self.spec.num_shards, cluster.num_shards
                    ),
                )
            } else if !cluster.complete() {
                let missing = if cluster.num_shards == 0 {
                    "no shard has registered".to_string()
                } else {
                    format!("shards {:?} are not registered", cluster.missing())
                };
                if self.tables_ready {
                    (JobState::Paused, format!("paused: {missing}"))
                } else {
                    (JobState::Waiting, format!("waiting for shards: {missing}"))
                }
            } else if !self.tables_ready {
                (
                    JobState::Waiting,
                    "creating the tables on the shards".into(),
                )
            } else if self.joined_ever < self.spec.num_workers {
                (
                    JobState::Waiting,
                    format!(
                        "waiting for workers: {} of {} joined",
                        self.joined_ever, self.spec.num_workers
                    ),
                )
            } else if self.resuming {
                (JobState::Paused, "resuming from a checkpoint".into())
            } else if self.live().is_empty() {
                (
                    JobState::Paused,
                    format!(
                        "no live worker: all {} workers left or lost their leases; start \
                         workers (they rejoin where the job is) to go on",
                        self.workers.len()
                    ),
                )
            } else {
                (JobState::Running, String::new())
            };
        let changed = before != (self.state, self.message.clone());
        if changed {
            self.wake();
        }
        changed
    }

    /// Adds (or revives) worker `id`.
    pub fn join(
        &mut self,
        id: WorkerId,
        name: &str,
        owner: &str,
        now: Instant,
        lease: Duration,
    ) -> Joined {
        let new = !self.workers.contains_key(&id);
        let w = self.workers.entry(id).or_insert_with(|| Worker {
            name: name.to_owned(),
            owner: owner.to_owned(),
            live: false,
            lease_until: now,
            running: false,
            restart_at: None,
            resync: false,
            waiting_since: None,
            throughput: 0.0,
            batch: 0,
            version: 0,
            stats: Staleness::default(),
        });
        w.lease_until = now + lease;
        if !w.live {
            w.live = true;
            w.running = false;
            w.resync = false;
            w.restart_at = None;
            if new {
                self.joined_ever += 1;
            }
            self.clocks.join(id);
            let live = self.live();
            let changed = self.data.join(id, &live);
            self.bump(&changed);
            self.rebalance_batches();
            self.wake();
        }
        Joined {
            worker_id: id,
            clock: self.clocks.clock(id).unwrap_or(0),
            assignment: self.assignment(id),
            lease,
            spec: self.spec.clone(),
        }
    }

    /// Removes worker `id` from the clocks and gives its data shards away.
    pub fn remove(&mut self, id: WorkerId) {
        let Some(w) = self.workers.get_mut(&id) else {
            return;
        };
        if !w.live {
            return;
        }
        w.live = false;
        w.running = false;
        self.clocks.remove(id);
        let live = self.live();
        let changed = self.data.leave(id, &live);
        self.bump(&changed);
        self.rebalance_batches();
        self.check_done();
        self.wake();
    }

    /// Refuses `caller` acting under worker `id` when another caller joined with it.
    pub fn check_owner(&self, id: WorkerId, caller: &str) -> Result<()> {
        match self.workers.get(&id) {
            Some(w) if w.owner != caller => Err(SchedError::NotYours {
                what: format!("worker {id} of job `{}`", self.spec.name),
                holder: w.owner.clone(),
                caller: caller.to_owned(),
            }),
            _ => Ok(()),
        }
    }

    /// The member `id`, live, or `not_found`.
    pub fn member(&mut self, id: WorkerId) -> Result<&mut Worker> {
        match self.workers.get_mut(&id) {
            Some(w) if w.live => Ok(w),
            _ => Err(SchedError::NotMember {
                job: self.spec.name.clone(),
                worker: id,
            }),
        }
    }

    /// Records a clock report. Nothing changes when it is refused.
    pub fn report(
        &mut self,
        id: WorkerId,
        r: &ClockReport,
        now: Instant,
        lease: Duration,
    ) -> Result<()> {
        let w = self.member(id)?;
        w.lease_until = now + lease;
        self.cost.worker_cpu(id, r.cpu);
        let w = self.member(id)?;
        // A worker that calls is not computing: it finished its clock or waits for a grant. A
        // grant whose answer was lost (the call was cut and retried) must not leave it marked
        // running, or a checkpoint or resume would wait for it forever.
        w.running = false;
        let Some(f) = r.finished else {
            return Ok(());
        };
        if w.restart_at.is_some() {
            // Reports from before a resume are void.
            return Ok(());
        }
        let outcome = if w.resync {
            let recorded = self.clocks.clock(id).unwrap_or(0);
            // A worker taken up again after a restart reports the clock it finished, which
            // may be ahead of what was recorded, but never past the job's end.
            let past_end = self.spec.max_clocks > 0 && f >= self.spec.max_clocks;
            if f.saturating_add(1) < recorded || past_end || f == u64::MAX {
                return Err(SchedError::clock(
                    &self.spec.name,
                    ClockError::OutOfOrder {
                        worker: id,
                        clock: recorded,
                        reported: f,
                    },
                ));
            }
            let before = self.clocks.min();
            self.clocks.insert(id, recorded.max(f.saturating_add(1)));
            Report::Advanced {
                min_changed: before != self.clocks.min(),
            }
        } else {
            self.clocks
                .finish(id, f)
                .map_err(|e| SchedError::clock(&self.spec.name, e))?
        };
        let Report::Advanced { min_changed } = outcome else {
            return Ok(());
        };
        let w = self.member(id)?;
        w.resync = false;
        w.running = false;
        if r.examples > 0 && !r.compute.is_zero() {
            let tp = r.examples as f64 / r.compute.as_secs_f64();
            w.throughput = if w.throughput == 0.0 {
                tp
            } else {
                0.7 * w.throughput + 0.3 * tp
            };
        }
        if !r.param_age.is_zero() {
            let us = r.param_age.as_micros() as u64;
            w.stats.age_sum_us += us;
            w.stats.age_reports += 1;
            self.stats.age_sum_us += us;
            self.stats.age_reports += 1;
            crate::metrics::param_age(&self.spec.name, r.param_age);
        }
        self.recent.push_back(now);
        while self
            .recent
            .front()
            .is_some_and(|t| now.duration_since(*t) > Duration::from_secs(5))
        {
            self.recent.pop_front();
        }
        if min_changed {
            if self.spec.balance_batches {
                self.rebalance_batches();
            }
            self.check_done();
            self.wake();
        }
        Ok(())
    }

    fn check_done(&mut self) {
        if self.spec.max_clocks > 0
            && !self.state.is_terminal()
            && self.clocks.min().is_some_and(|m| m >= self.spec.max_clocks)
        {
            self.state = JobState::Succeeded;
            self.message = format!("every worker finished {} clocks", self.spec.max_clocks);
        }
    }

    /// Grants worker `id` its next clock if the policy allows it now.
    pub fn try_grant(&mut self, id: WorkerId, now: Instant) -> Result<Option<Grant>> {
        let stop = self.state.is_terminal();
        let done = self.spec.max_clocks > 0
            && self
                .clocks
                .clock(id)
                .is_some_and(|c| c >= self.spec.max_clocks);
        let may = self.state == JobState::Running && self.clocks.may_start(id);
        let min = self.clocks.current();
        let gap = self.clocks.gap(id);
        let clock = self.clocks.clock(id).unwrap_or(0);
        let assignment = self.assignment(id);
        let state = self.state;
        let w = self.member(id)?;
        if stop {
            return Ok(Some(Grant {
                ready: false,
                clock,
                min_clock: min,
                assignment,
                state,
                stop: true,
            }));
        }
        if done {
            // A worker that has finished the job's clocks is told to stop only when every
            // worker has (the job has ended), so that what it reads then (a final evaluation,
            // an export) holds every worker's last push. Its wait is not a staleness wait.
            return Ok(None);
        }
        if !may {
            w.waiting_since.get_or_insert(now);
            return Ok(None);
        }
        let waited = w
            .waiting_since
            .take()
            .map(|t| now.duration_since(t))
            .unwrap_or_default();
        w.running = true;
        w.restart_at = None;
        w.stats.granted(gap, waited);
        self.stats.granted(gap, waited);
        crate::metrics::granted(&self.spec.name, id, gap, waited);
        Ok(Some(Grant {
            ready: true,
            clock,
            min_clock: min,
            assignment,
            state,
            stop: false,
        }))
    }

    /// The clock of the next coordinated checkpoint after one at `clock`.
    pub fn lift_barrier_after(&mut self, clock: u64) {
        self.clocks
            .set_barrier(next_boundary(self.spec.checkpoint_every, clock));
        self.wake();
    }

    /// The job as a status report, with the map at `epoch`.
    pub fn status(&self, epoch: u64, now: Instant) -> JobStatus {
        JobStatus {
            spec: self.spec.clone(),
            state: self.state,
            message: self.message.clone(),
            min_clock: self.clocks.current(),
            max_clock: self.clocks.max().unwrap_or(self.clocks.current()),
            map_epoch: epoch,
            workers: self
                .workers
                .iter()
                .map(|(id, w)| WorkerStatus {
                    worker_id: *id,
                    name: w.name.clone(),
                    live: w.live,
                    clock: self.clocks.clock(*id).unwrap_or(0),
                    data_shards: if w.live {
                        self.data.of(*id)
                    } else {
                        Vec::new()
                    },
                    batch_size: w.batch,
                    examples_per_sec: w.throughput,
                    staleness: w.stats.stats(),
                })
                .collect(),
            staleness: self.stats.stats(),
            latest_checkpoint: self.checkpoints.last().map(|c| c.name.clone()),
            advances_per_sec: self.advances_per_sec(now),
            cost: self.cost.cost(self.state.is_terminal()),
        }
    }

    pub fn advances_per_sec(&self, now: Instant) -> f64 {
        match self.recent.front() {
            Some(first) if self.recent.len() > 1 => {
                let span = now.duration_since(*first).as_secs_f64();
                if span > 0.0 {
                    self.recent.len() as f64 / span
                } else {
                    0.0
                }
            }
            _ => 0.0,
        }
    }
}

/// The first multiple of `every` above `clock`; `None` when `every` is 0.
pub fn next_boundary(every: u64, clock: u64) -> Option<u64> {
    (every > 0).then(|| (clock / every + 1) * every)
}

// ---------------------------------------------------------------------------------------------
// The durable form

/// What survives a scheduler restart.
#[derive(Debug, Serialize, Deserialize, Default)]
pub struct Saved {
    pub format: u32,
    pub epoch: u64,
    pub num_shards: u32,
    pub virtual_nodes: u32,
    #[serde(default)]
    pub endpoints: Vec<String>,
    pub next_worker_id: u64,
    pub jobs: Vec<SavedJob>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct SavedJob {
    pub spec: JobSpec,
    pub state: JobState,
    pub message: String,
    pub joined_ever: u32,
    pub tables_ready: bool,
    pub data: DataShards,
    pub workers: Vec<SavedWorker>,
    pub checkpoints: Vec<JobCheckpoint>,
    /// [`Job::checkpoint_attempts`] (absent in older files: the checkpoints' count is used).
    #[serde(default)]
    pub checkpoint_attempts: u64,
    /// [`Job::deleting`].
    #[serde(default)]
    pub deleting: Vec<String>,
    /// The job's clock ([`Clocks::current`]): where workers join when none is live.
    #[serde(default)]
    pub clock: u64,
    /// What the job has cost so far.
    #[serde(default)]
    pub cost: SavedCost,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct SavedWorker {
    pub id: WorkerId,
    pub name: String,
    #[serde(default)]
    pub owner: String,
    pub live: bool,
    pub clock: u64,
    pub throughput: f64,
    pub batch: u64,
    pub version: u64,
}

impl Job {
    pub fn save(&self) -> SavedJob {
        SavedJob {
            spec: self.spec.clone(),
            state: self.state,
            message: self.message.clone(),
            joined_ever: self.joined_ever,
            tables_ready: self.tables_ready,
            data: self.data.clone(),
            workers: self
                .workers
                .iter()
                .map(|(id, w)| SavedWorker {
                    id: *id,
                    name: w.name.clone(),
                    owner: w.owner.clone(),
                    live: w.live,
                    clock: self.clocks.clock(*id).unwrap_or(0),
                    throughput: w.throughput,
                    batch: w.batch,
                    version: w.version,
                })
                .collect(),
            checkpoints: self.checkpoints.clone(),
            checkpoint_attempts: self.checkpoint_attempts,
            deleting: self.deleting.clone(),
            clock: self.clocks.current(),
            cost: self.cost.save(),
        }
    }

    /// Rebuilds a job after a restart. Live workers get a fresh lease and may report a clock
    /// ahead of the recorded one (clocks are saved lazily; the recorded one is never ahead).
    pub fn restore(s: SavedJob, now: Instant, default_lease: Duration) -> Self {
        let mut job = Job::new(s.spec);
        let lease = job.lease(default_lease);
        job.state = s.state;
        job.message = s.message;
        job.joined_ever = s.joined_ever;
        job.tables_ready = s.tables_ready;
        job.data = s.data;
        job.cost = CostMeter::restore(s.cost);
        let last = s.checkpoints.last().map(|c| c.clock).unwrap_or(0);
        job.checkpoints = s.checkpoints;
        job.checkpoint_attempts = s.checkpoint_attempts;
        job.deleting = s.deleting;
        job.clocks
            .set_barrier(next_boundary(job.spec.checkpoint_every, last));
        job.clocks.set_floor(s.clock);
        for w in s.workers {
            if w.live {
                job.clocks.insert(w.id, w.clock);
            }
            job.workers.insert(
                w.id,
                Worker {
                    name: w.name,
                    owner: w.owner,
                    live: w.live,
                    lease_until: now + lease,
                    running: false,
                    restart_at: None,
                    resync: w.live,
                    waiting_since: None,
                    throughput: w.throughput,
                    batch: w.batch,
                    version: w.version,
                    stats: Staleness::default(),
                },
            );
        }
        job
    }
}
