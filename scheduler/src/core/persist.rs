//! The state file: jobs (specs, members, clocks, data assignment, checkpoints), the shard map
//! and the next worker id, written atomically (at once for submissions, cancels,
//! registrations and checkpoints; clocks lazily, by the ticker) and read at start-up.

use tokio::time::Instant;

use super::{Scheduler, SchedulerConfig, State};
use crate::error::{Result, SchedError};
use crate::state::{Job, Saved};

const STATE_FILE: &str = "scheduler-state.json";
const FORMAT: u32 = 1;

/// Reads the state file into `state`, when there is one.
pub(super) fn load(cfg: &SchedulerConfig, state: &mut State, now: Instant) -> anyhow::Result<()> {
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
    Ok(())
}

impl Scheduler {
    pub(super) fn snapshot(&self) -> Saved {
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
    pub(super) async fn save(&self) -> Result<()> {
        let Some(dir) = self.inner.cfg.data_dir.clone() else {
            return Ok(());
        };
        let _g = self.inner.save_lock.lock().await;
        let saved = self.snapshot();
        let bytes = serde_json::to_vec(&saved).map_err(|e| SchedError::Storage {
            what: "encoding the scheduler state",
            cause: e.to_string(),
        })?;
        tokio::task::spawn_blocking(move || {
            ps_runtime::config::write_atomic(&dir.join(STATE_FILE), &bytes)
        })
        .await
        .map_err(|e| SchedError::Storage {
            what: "writing the scheduler state",
            cause: e.to_string(),
        })?
        .map_err(|e| SchedError::Storage {
            what: "writing the scheduler state",
            cause: e.to_string(),
        })
    }
}
