//! The scheduler's behaviour: membership and leases, long-polled clock grants, the shard map,
//! coordinated checkpoints and resume, and the durable state file. The gRPC layer
//! (`service.rs`) only converts messages and calls these methods, so tests can drive them with
//! paused time.
//!
//! - [`persist`]: the state file (written atomically; read at start-up);
//! - [`jobs`]: submit and cancel;
//! - [`shards`]: registration, heartbeats, the published map, a client for the shards;
//! - [`workers`]: join, heartbeat, leave, and the long-polled clock advance;
//! - [`checkpoints`]: coordinated checkpoints and resume;
//! - [`ticker`]: leases, table creation, scheduled checkpoints and lazy saves.

mod checkpoints;
mod jobs;
mod persist;
mod shards;
mod ticker;
mod workers;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use tokio::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

use crate::policy::WorkerId;
use crate::state::{Cluster, Job, Result, SchedError};

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
    /// TLS and the token of the scheduler's calls to the shards (an operator's).
    pub credentials: ps_client::Credentials,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            data_dir: None,
            lease: Duration::from_secs(5),
            max_wait: Duration::from_secs(10),
            tick: Duration::from_millis(100),
            checkpoint_timeout: Duration::from_secs(300),
            credentials: ps_client::Credentials::default(),
        }
    }
}

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

pub use ps_core::status::ShardMap;

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
        persist::load(&cfg, &mut state, now)?;
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

    /// Runs `f` on job `name` under the lock.
    pub fn with_job<T>(&self, name: &str, f: impl FnOnce(&mut Job, &Cluster) -> T) -> Result<T> {
        let mut st = self.inner.state.lock();
        let State { cluster, jobs, .. } = &mut *st;
        let job = jobs
            .get_mut(name)
            .ok_or_else(|| SchedError::no_such_job(name))?;
        Ok(f(job, cluster))
    }

    pub fn job_names(&self) -> Vec<String> {
        self.inner.state.lock().jobs.keys().cloned().collect()
    }

    /// Wakes the ticker early (something changed that it acts on).
    fn kick(&self) {
        self.inner.state.lock().dirty = true;
        self.inner.kick.notify_one();
    }
}
