//! Workers: join (a new member, or an earlier one taken up again), heartbeats, leave, and the
//! clock advance: a report, then a long poll until the policy allows the next clock (or the
//! wait runs out, or the service shuts down).

use tokio::time::{Duration, Instant};

use super::{Scheduler, ShardMap, State};
use crate::error::{Result, SchedError};
use crate::metrics as m;
use crate::policy::WorkerId;
use crate::state::{ClockReport, Grant, JobState, Joined};

impl Scheduler {
    /// `owner`: the authenticated caller (empty without authentication); a worker id is its
    /// joiner's.
    pub fn join(
        &self,
        job: &str,
        name: &str,
        id: WorkerId,
        owner: &str,
    ) -> Result<(Joined, ShardMap)> {
        let default_lease = self.inner.cfg.lease;
        let joined = {
            let mut st = self.inner.state.lock();
            let known = match st.jobs.get(job) {
                Some(j) => {
                    j.check_owner(id, owner)?;
                    id != 0 && j.workers.contains_key(&id)
                }
                None => return Err(SchedError::no_such_job(job)),
            };
            // Ids are the scheduler's to issue, one after another, never reused: a join under
            // an id is a member taken up again, and an id the job never had is refused.
            let id = if id == 0 {
                let id = st.next_worker_id;
                st.next_worker_id = id.checked_add(1).ok_or_else(|| SchedError::Storage {
                    what: "issuing a worker id",
                    cause: "every worker id has been issued".into(),
                })?;
                id
            } else if known {
                id
            } else {
                return Err(SchedError::UnknownWorker {
                    job: job.to_owned(),
                    worker: id,
                });
            };
            st.dirty = true;
            let State { cluster, jobs, .. } = &mut *st;
            let j = jobs
                .get_mut(job)
                .ok_or_else(|| SchedError::no_such_job(job))?;
            if j.state.is_terminal() {
                return Err(SchedError::JobEnded {
                    job: job.to_owned(),
                    state: j.state,
                    message: j.message.clone(),
                });
            }
            let lease = j.lease(default_lease);
            let joined = j.join(id, name, owner, Instant::now(), lease);
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

    /// [`Scheduler::join`], with a newly issued worker id saved before it is answered: a
    /// scheduler killed right after the answer still knows the id when its worker rejoins
    /// under it (a lazy save could lose it, and the rejoin would be refused).
    pub async fn join_saved(
        &self,
        job: &str,
        name: &str,
        id: WorkerId,
        owner: &str,
    ) -> Result<(Joined, ShardMap)> {
        let answer = self.join(job, name, id, owner)?;
        if id == 0 {
            self.save().await?;
        }
        Ok(answer)
    }

    pub fn worker_heartbeat(
        &self,
        job: &str,
        id: WorkerId,
        owner: &str,
    ) -> Result<(u64, JobState)> {
        let default_lease = self.inner.cfg.lease;
        let mut st = self.inner.state.lock();
        let epoch = st.cluster.epoch;
        let j = st
            .jobs
            .get_mut(job)
            .ok_or_else(|| SchedError::no_such_job(job))?;
        j.check_owner(id, owner)?;
        let lease = j.lease(default_lease);
        let state = j.state;
        j.member(id)?.lease_until = Instant::now() + lease;
        Ok((epoch, state))
    }

    pub fn leave(&self, job: &str, id: WorkerId, owner: &str) -> Result<()> {
        self.with_job(job, |j, c| {
            j.check_owner(id, owner)?;
            j.member(id)?;
            j.remove(id);
            j.refresh(c);
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
        owner: &str,
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
            j.check_owner(id, owner)?;
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
                    .ok_or_else(|| SchedError::no_such_job(job))?;
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
                            min_clock: j.clocks.current(),
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
}
