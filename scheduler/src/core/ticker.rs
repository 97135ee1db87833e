//! The ticker: every tick (or sooner, when kicked) it expires leases, starts table creation
//! for jobs whose shards are all up, starts scheduled checkpoints, and writes the state file
//! when it changed (at most once a second).

use tokio::time::{Duration, Instant};

use super::{Scheduler, State};
use crate::error::SchedError;
use crate::metrics as m;
use crate::policy::WorkerId;
use crate::state::{Job, JobState};

/// How often the shards' statistics are read for the jobs' costs.
const COST_POLL: Duration = Duration::from_secs(5);

impl Scheduler {
    pub(super) async fn run_ticker(&self) {
        let mut last_save = Instant::now();
        let mut last_metrics = Instant::now() - Duration::from_secs(1);
        let mut last_poll = Instant::now();
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
            if now.duration_since(last_metrics) >= Duration::from_secs(1) {
                self.export_metrics(now);
                last_metrics = now;
            }
            if now.duration_since(last_poll) >= COST_POLL {
                last_poll = now;
                let this = self.clone();
                tokio::spawn(async move { this.poll_costs().await });
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

    /// Sets every job's gauges and the shards' (the families exist from the first tick).
    fn export_metrics(&self, now: Instant) {
        let st = self.inner.state.lock();
        let epoch = st.cluster.epoch;
        m::map_epoch(epoch);
        m::shards(
            st.cluster.shards.iter().filter(|s| s.is_some()).count(),
            st.cluster.num_shards,
        );
        // A status read also stops an ended job's wall time.
        for job in st.jobs.values() {
            m::job(&job.status(epoch, now));
        }
    }

    /// Reads every shard's statistics and charges each job for its tables: the shards' CPU
    /// time and bytes moved since the last poll, and the bytes its tables hold. Skipped while
    /// a shard is missing (the next poll counts what it missed).
    pub(super) async fn poll_costs(&self) {
        let stats = match self.shards_client().await {
            Ok(ps) => ps.stats().await,
            Err(_) => return,
        };
        let Ok(stats) = stats else {
            return;
        };
        let mut st = self.inner.state.lock();
        for job in st.jobs.values_mut() {
            let mut stored = 0u64;
            for shard in &stats {
                let tables: Vec<&ps_core::status::TableStats> = shard
                    .tables
                    .iter()
                    .filter(|t| job.spec.table(&t.name).is_some())
                    .collect();
                stored += tables.iter().map(|t| t.memory_bytes).sum::<u64>();
                job.cost.shard_tables(shard.shard_index, &tables);
            }
            job.cost.stored(stored);
        }
    }

    /// Expires leases; returns the jobs whose tables should be created and those due for a
    /// scheduled checkpoint.
    pub(super) fn expire_and_collect(&self, now: Instant) -> (Vec<String>, Vec<String>) {
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
            let mut lost_worker = false;
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
                lost_worker = true;
            }
            if lost_shard || lost_worker {
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
            if job.checkpoint_due() && job.checkpoint_retry_at.is_none_or(|t| now >= t) {
                due.push(job.spec.name.clone());
            }
            m::min_clock(job.name(), job.clocks.current());
        }
        (create, due)
    }

    pub(super) async fn create_tables(&self, job: &str) {
        let specs = match self.with_job(job, |j, _| j.spec.tables.clone()) {
            Ok(s) => s,
            Err(_) => return,
        };
        let result = async {
            let ps = self.shards_client().await?;
            for t in specs {
                ps.create_table(t.spec.clone())
                    .await
                    .map_err(|e| SchedError::TableCreation {
                        table: t.spec.name.to_string(),
                        cause: e.to_string(),
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
                Err(e @ SchedError::TableCreation { .. }) => {
                    j.state = JobState::Failed;
                    j.message = e.to_string();
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
