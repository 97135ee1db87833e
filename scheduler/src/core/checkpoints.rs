//! Coordinated checkpoints and resume: every worker is held at one clock boundary and none is
//! computing while every shard checkpoints; the job manifest is written atomically after every
//! shard answered. A resume holds the workers, restores every shard, and restarts every worker
//! at the checkpoint's clock.

use std::path::PathBuf;

use tokio::time::Instant;

use super::{Scheduler, unix_ms};

/// How long the ticker waits before trying a failed scheduled checkpoint again: doubling from
/// the first, up to the last.
const RETRY_FIRST: std::time::Duration = std::time::Duration::from_millis(500);
const RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(30);
use crate::error::{Result, SchedError};
use crate::metrics as m;
use crate::state::{Job, JobCheckpoint, JobState, ShardCheckpointRef};

impl Scheduler {
    pub(super) fn checkpoint_dir(&self, job: &str) -> Option<PathBuf> {
        self.inner
            .cfg
            .data_dir
            .as_ref()
            .map(|d| d.join("jobs").join(job).join("checkpoints"))
    }

    /// Waits until `ready(job)` holds, waking on every job change, up to the checkpoint timeout.
    pub(super) async fn wait_for(
        &self,
        job: &str,
        what: &'static str,
        ready: impl Fn(&Job) -> bool,
    ) -> Result<()> {
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
                    return Err(SchedError::TimedOut {
                        job: job.to_owned(),
                        what,
                        after: self.inner.cfg.checkpoint_timeout,
                    });
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
                return Err(SchedError::NotRunning {
                    job: job.to_owned(),
                    state: j.state,
                    message: j.message.clone(),
                });
            }
            if j.checkpointing {
                return Err(SchedError::Busy {
                    job: job.to_owned(),
                });
            }
            let b = if on_demand {
                let next = j.clocks.max().map_or(0, |m| m + 1);
                j.clocks.barrier().map_or(next, |b| b.min(next))
            } else {
                // The ticker starts a scheduled checkpoint only at a set boundary.
                j.clocks.barrier().ok_or_else(|| SchedError::Busy {
                    job: job.to_owned(),
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
            if result.is_ok() {
                j.checkpoint_failures = 0;
                j.checkpoint_retry_at = None;
            } else {
                let wait = RETRY_FIRST
                    .saturating_mul(1 << j.checkpoint_failures.min(10))
                    .min(RETRY_MAX);
                j.checkpoint_failures = j.checkpoint_failures.saturating_add(1);
                j.checkpoint_retry_at = Some(Instant::now() + wait);
            }
        });
        match &result {
            Ok(c) => tracing::info!(job, name = %c.name, clock = c.clock, "checkpoint complete"),
            Err(e) => tracing::warn!(job, clock = boundary, error = %e, "checkpoint failed"),
        }
        m::checkpoint(job, result.is_ok());
        // The workers go on meanwhile: the barrier is lifted.
        if let Err(e) = self.prune(job).await {
            tracing::warn!(job, error = %e, "deleting old checkpoints failed; tried again after the next checkpoint");
        }
        result
    }

    /// Deletes the job's checkpoint `name`: off its list at once (saved before any shard is
    /// asked, so the list never shows a checkpoint some shard has lost), then from every shard.
    /// The bytes freed on the shards' disks.
    pub async fn delete_checkpoint(&self, job: &str, name: &str) -> Result<u64> {
        self.with_job(job, |j, _| {
            if j.checkpointing {
                return Err(SchedError::Busy {
                    job: job.to_owned(),
                });
            }
            let i = j
                .checkpoints
                .iter()
                .position(|c| c.name == name)
                .ok_or_else(|| SchedError::NoSuchCheckpoint {
                    job: job.to_owned(),
                    name: name.to_owned(),
                })?;
            j.checkpoints.remove(i);
            j.deleting.push(name.to_owned());
            j.checkpointing = true;
            Ok(())
        })??;
        let freed = self.sweep(job).await;
        self.release(job).await;
        freed
    }

    /// Keeps the job's newest `keep_checkpoints` checkpoints and deletes the rest, with any
    /// deletion an earlier attempt left unfinished. Skipped while a checkpoint, resume or
    /// deletion runs (the next checkpoint prunes).
    async fn prune(&self, job: &str) -> Result<()> {
        let start = self.with_job(job, |j, _| {
            if j.checkpointing {
                return false;
            }
            let keep = j.spec.keep_checkpoints as usize;
            if keep > 0 && j.checkpoints.len() > keep {
                let old = j.checkpoints.len() - keep;
                let names: Vec<String> = j.checkpoints.drain(..old).map(|c| c.name).collect();
                j.deleting.extend(names);
            }
            j.checkpointing = !j.deleting.is_empty();
            j.checkpointing
        })?;
        if !start {
            return Ok(());
        }
        let swept = self.sweep(job).await;
        self.release(job).await;
        swept.map(|freed| {
            tracing::info!(job, freed_bytes = freed, "old checkpoints deleted");
        })
    }

    /// Ends what `delete_checkpoint` or `prune` began (they hold `checkpointing`).
    async fn release(&self, job: &str) {
        let _ = self.with_job(job, |j, _| {
            j.checkpointing = false;
            j.wake();
        });
        let _ = self.save().await;
    }

    /// Deletes every checkpoint in the job's `deleting` list from every shard, and its job
    /// manifest; each leaves the list once every shard has deleted it. Stops at the first
    /// failure (the rest stay listed for the next sweep). The caller holds `checkpointing`.
    async fn sweep(&self, job: &str) -> Result<u64> {
        // Off the list before any shard is asked: saved first.
        self.save().await?;
        let names = self.with_job(job, |j, _| j.deleting.clone())?;
        let mut freed = 0;
        if names.is_empty() {
            return Ok(0);
        }
        let failed = |cause: String| SchedError::Shards {
            action: "deleting checkpoints from the shards (they are off the job's list; tried \
                     again after the next checkpoint or deletion)",
            cause,
        };
        let ps = self.shards_client().await?;
        for name in names {
            let done = ps
                .delete_checkpoint(&name)
                .await
                .map_err(|e| failed(e.to_string()))?;
            freed += done.iter().map(|d| d.freed_bytes).sum::<u64>();
            if let Some(dir) = self.checkpoint_dir(job) {
                let path = dir.join(format!("{name}.json"));
                match tokio::fs::remove_file(&path).await {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => {
                        return Err(SchedError::Storage {
                            what: "deleting a job manifest",
                            cause: e.to_string(),
                        });
                    }
                }
            }
            self.with_job(job, |j, _| j.deleting.retain(|n| *n != name))?;
            tracing::info!(job, name, "checkpoint deleted from every shard");
        }
        self.save().await?;
        Ok(freed)
    }

    pub(super) async fn checkpoint_at(&self, job: &str, clock: u64) -> Result<JobCheckpoint> {
        self.wait_for(job, "the workers to reach the checkpoint's clock", |j| {
            j.clocks.min().is_none_or(|m| m >= clock)
                && j.workers.values().all(|w| !w.live || !w.running)
        })
        .await?;
        let n = self.with_job(job, |j, _| {
            let n = j.checkpoint_attempts.max(j.checkpoints.len() as u64);
            j.checkpoint_attempts = n + 1;
            n
        })?;
        // Recorded before any shard makes a checkpoint of this name (see `checkpoint_attempts`).
        self.save().await?;
        let name = format!("{job}-c{clock}-{n}");
        let result = self.checkpoint_named(job, clock, &name).await;
        if result.is_err() {
            // What some shards wrote of a failed attempt is deleted with the next sweep.
            let _ = self.with_job(job, |j, _| j.deleting.push(name));
        }
        result
    }

    async fn checkpoint_named(&self, job: &str, clock: u64, name: &str) -> Result<JobCheckpoint> {
        let name = name.to_owned();
        let ps = self.shards_client().await?;
        let done = ps.checkpoint(&name).await.map_err(|e| SchedError::Shards {
            action: "checkpointing the shards",
            cause: e.to_string(),
        })?;
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
            let failed = |cause: String| SchedError::Storage {
                what: "writing the job manifest",
                cause,
            };
            let bytes = serde_json::to_vec_pretty(&ckpt).map_err(|e| failed(e.to_string()))?;
            let path = dir.join(format!("{name}.json"));
            tokio::task::spawn_blocking(move || ps_runtime::config::write_atomic(&path, &bytes))
                .await
                .map_err(|e| failed(e.to_string()))?
                .map_err(|e| failed(e.to_string()))?;
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
            let c =
                match name {
                    Some(n) => j
                        .checkpoints
                        .iter()
                        .find(|c| c.name == n)
                        .cloned()
                        .ok_or_else(|| SchedError::NoSuchCheckpoint {
                            job: job.to_owned(),
                            name: n.to_owned(),
                        })?,
                    None => j.checkpoints.last().cloned().ok_or_else(|| {
                        SchedError::NoCheckpointYet {
                            job: job.to_owned(),
                        }
                    })?,
                };
            if j.checkpointing {
                return Err(SchedError::Busy {
                    job: job.to_owned(),
                });
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

    pub(super) async fn resume_from(&self, job: &str, ckpt: &JobCheckpoint) -> Result<()> {
        self.wait_for(job, "the workers to finish their clocks", |j| {
            j.workers.values().all(|w| !w.live || !w.running)
        })
        .await?;
        let ps = self.shards_client().await?;
        if ps.shards().len() != ckpt.shards.len() {
            return Err(SchedError::CheckpointShards {
                name: ckpt.name.clone(),
                has: ckpt.shards.len(),
                cluster: ps.shards().len(),
            });
        }
        let names: Vec<String> = ckpt.shards.iter().map(|s| s.name.clone()).collect();
        ps.restore_checkpoint(&names)
            .await
            .map_err(|e| SchedError::Shards {
                action: "restoring the shards",
                cause: e.to_string(),
            })?;
        tracing::info!(job, name = %ckpt.name, clock = ckpt.clock, "job resumed from checkpoint");
        Ok(())
    }
}
