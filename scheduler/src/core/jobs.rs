//! Jobs: submitted (the same spec again is fine) and canceled.

use ps_core::JobSpec;

use super::Scheduler;
use crate::error::{Result, SchedError};
use crate::state::{Job, JobState};

impl Scheduler {
    /// Submits `spec`; the same spec again is fine, another spec under its name is refused.
    pub async fn submit(&self, spec: JobSpec) -> Result<()> {
        {
            let mut st = self.inner.state.lock();
            if let Some(j) = st.jobs.get(&spec.name) {
                if j.spec == spec {
                    return Ok(());
                }
                return Err(SchedError::JobExists { job: spec.name });
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
}
