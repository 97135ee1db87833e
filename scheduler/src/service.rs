//! The gRPC edge of the scheduler: wire → domain (validating), the call, domain → wire, and one
//! exhaustive mapping of [`SchedError`] to a status code and a `google.rpc.ErrorInfo` reason.
//! Nothing past this file sees prost types.

use ps_core::status::JobStatus;
use ps_core::wire::reason;
use ps_core::{JobSpec, ValidationError};
use ps_proto::v1 as pb;
use ps_proto::v1::scheduler_server::Scheduler as SchedulerApi;
use ps_runtime::auth::Caller;
use ps_runtime::status::{invalid_field, refusal};
use tokio::time::{Duration, Instant};
use tonic::{Code, Request, Response, Status};
use tracing::instrument;

use crate::core::Scheduler;
use crate::state::{Assignment, ClockReport, SchedError};

impl From<SchedError> for Status {
    fn from(e: SchedError) -> Self {
        let message = e.to_string();
        match e {
            SchedError::Invalid(v) => invalid_field(&v),
            SchedError::NoSuchJob { job } => refusal(
                Code::NotFound,
                reason::JOB_NOT_FOUND,
                message,
                [("job", job)],
            ),
            SchedError::JobExists { job } => refusal(
                Code::AlreadyExists,
                reason::JOB_EXISTS,
                message,
                [("job", job)],
            ),
            SchedError::NotMember { job, worker } => refusal(
                Code::NotFound,
                reason::NOT_A_MEMBER,
                message,
                [("job", job), ("worker_id", worker.to_string())],
            ),
            SchedError::ClockOutOfOrder {
                job,
                worker,
                clock,
                reported,
            } => refusal(
                Code::FailedPrecondition,
                reason::CLOCK_OUT_OF_ORDER,
                message,
                [
                    ("job", job),
                    ("worker_id", worker.to_string()),
                    ("clock", clock.to_string()),
                    ("reported", reported.to_string()),
                ],
            ),
            SchedError::JobEnded { job, state, .. } | SchedError::NotRunning { job, state, .. } => {
                refusal(
                    Code::FailedPrecondition,
                    reason::JOB_STATE,
                    message,
                    [("job", job), ("state", state.name().to_owned())],
                )
            }
            SchedError::Busy { job } => refusal(
                Code::FailedPrecondition,
                reason::JOB_STATE,
                message,
                [("job", job), ("state", "checkpointing".to_owned())],
            ),
            SchedError::NoSuchCheckpoint { job, name } => refusal(
                Code::NotFound,
                reason::CHECKPOINT_NOT_FOUND,
                message,
                [("job", job), ("checkpoint", name)],
            ),
            SchedError::NoCheckpointYet { job } => refusal(
                Code::NotFound,
                reason::CHECKPOINT_NOT_FOUND,
                message,
                [("job", job)],
            ),
            SchedError::CheckpointShards { name, .. } => refusal(
                Code::FailedPrecondition,
                reason::SHARD_CONFLICT,
                message,
                [("checkpoint", name)],
            ),
            SchedError::ShardConflict { index, .. } => refusal(
                Code::FailedPrecondition,
                reason::SHARD_CONFLICT,
                message,
                [("shard", index.to_string())],
            ),
            SchedError::ShardNotRegistered { index, .. } => refusal(
                Code::NotFound,
                reason::SHARD_NOT_REGISTERED,
                message,
                [("shard", index.to_string())],
            ),
            SchedError::Unreachable { .. } => refusal(
                Code::FailedPrecondition,
                reason::SHARD_UNREACHABLE,
                message,
                [],
            ),
            SchedError::UnknownWorker { job, worker } => refusal(
                Code::NotFound,
                reason::NOT_A_MEMBER,
                message,
                [("job", job), ("worker_id", worker.to_string())],
            ),
            SchedError::NotYours { holder, .. } => refusal(
                Code::PermissionDenied,
                reason::NOT_YOURS,
                message,
                [("holder", holder)],
            ),
            SchedError::ShardsIncomplete => refusal(
                Code::Unavailable,
                reason::SHARDS_UNAVAILABLE,
                message,
                [("action", "registering".to_owned())],
            ),
            SchedError::Shards { action, .. } => refusal(
                Code::Unavailable,
                reason::SHARDS_UNAVAILABLE,
                message,
                [("action", action.to_owned())],
            ),
            SchedError::TimedOut { job, .. } => refusal(
                Code::DeadlineExceeded,
                reason::TIMED_OUT,
                message,
                [("job", job)],
            ),
            SchedError::TableCreation { .. } | SchedError::Storage { .. } => {
                refusal(Code::Internal, reason::INTERNAL, message, [])
            }
        }
    }
}

/// The `ps.v1.Scheduler` service.
#[derive(Debug, Clone)]
pub struct SchedulerService {
    sched: Scheduler,
}

impl SchedulerService {
    pub fn new(sched: Scheduler) -> Self {
        Self { sched }
    }

    fn status(&self, job: &str) -> Result<pb::JobStatus, Status> {
        let epoch = self.sched.shard_map().epoch;
        let status: JobStatus = self
            .sched
            .with_job(job, |j, _| j.status(epoch, Instant::now()))?;
        Ok(status.into())
    }
}

fn assignment_pb(a: Assignment) -> pb::Assignment {
    pb::Assignment {
        version: a.version,
        data_shards: a.data_shards,
        num_data_shards: a.num_data_shards,
        batch_size: a.batch_size,
    }
}

fn job_name(name: &str) -> Result<&str, Status> {
    if name.is_empty() {
        return Err(invalid_field(&ValidationError::new(
            "job",
            "is empty; name the job",
        )));
    }
    Ok(name)
}

/// The job a request names, when its caller may touch it.
fn job_of<'a>(caller: &Caller, name: &'a str) -> Result<&'a str, Status> {
    let name = job_name(name)?;
    caller.may_touch_job(name)?;
    Ok(name)
}

#[tonic::async_trait]
impl SchedulerApi for SchedulerService {
    #[instrument(skip_all)]
    async fn submit_job(
        &self,
        req: Request<pb::SubmitJobRequest>,
    ) -> Result<Response<pb::JobStatus>, Status> {
        let caller = Caller::of(&req);
        let spec = req
            .into_inner()
            .spec
            .ok_or_else(|| invalid_field(&ValidationError::new("spec", "is missing")))?;
        let spec = JobSpec::try_from(spec).map_err(|e| invalid_field(&e.within("spec")))?;
        caller.may_touch_job(&spec.name)?;
        let name = spec.name.clone();
        self.sched.submit(spec).await?;
        Ok(Response::new(self.status(&name)?))
    }

    async fn get_job(
        &self,
        req: Request<pb::GetJobRequest>,
    ) -> Result<Response<pb::JobStatus>, Status> {
        let caller = Caller::of(&req);
        let r = req.into_inner();
        Ok(Response::new(self.status(job_of(&caller, &r.job)?)?))
    }

    async fn list_jobs(
        &self,
        req: Request<pb::ListJobsRequest>,
    ) -> Result<Response<pb::ListJobsResponse>, Status> {
        // A caller limited to some jobs sees those.
        let caller = Caller::of(&req);
        let jobs = self
            .sched
            .job_names()
            .iter()
            .filter(|n| caller.may_touch_job(n).is_ok())
            .filter_map(|n| self.status(n).ok())
            .collect();
        Ok(Response::new(pb::ListJobsResponse { jobs }))
    }

    #[instrument(skip_all)]
    async fn cancel_job(
        &self,
        req: Request<pb::CancelJobRequest>,
    ) -> Result<Response<pb::JobStatus>, Status> {
        let caller = Caller::of(&req);
        let r = req.into_inner();
        self.sched.cancel(job_of(&caller, &r.job)?).await?;
        Ok(Response::new(self.status(&r.job)?))
    }

    #[instrument(skip_all, fields(shard = req.get_ref().shard_index))]
    async fn register_shard(
        &self,
        req: Request<pb::RegisterShardRequest>,
    ) -> Result<Response<pb::RegisterShardResponse>, Status> {
        let caller = Caller::of(&req);
        let r = req.into_inner();
        if !(r.endpoint.starts_with("http://") || r.endpoint.starts_with("https://")) {
            return Err(invalid_field(&ValidationError::new(
                "endpoint",
                format!("`{}` must be a URL (http://host:port)", r.endpoint),
            )));
        }
        let (epoch, lease) = self
            .sched
            .register_shard(
                r.shard_index,
                r.num_shards,
                r.virtual_nodes,
                r.endpoint,
                caller.name(),
            )
            .await?;
        Ok(Response::new(pb::RegisterShardResponse {
            map_epoch: epoch,
            lease_ms: lease.as_millis() as u64,
        }))
    }

    async fn shard_heartbeat(
        &self,
        req: Request<pb::ShardHeartbeatRequest>,
    ) -> Result<Response<pb::ShardHeartbeatResponse>, Status> {
        let caller = Caller::of(&req);
        let r = req.into_inner();
        let epoch = self
            .sched
            .shard_heartbeat(r.shard_index, &r.endpoint, caller.name())?;
        Ok(Response::new(pb::ShardHeartbeatResponse {
            map_epoch: epoch,
        }))
    }

    async fn get_shard_map(
        &self,
        _req: Request<pb::GetShardMapRequest>,
    ) -> Result<Response<pb::ShardMap>, Status> {
        Ok(Response::new(self.sched.shard_map().into()))
    }

    #[instrument(skip_all, fields(job = %req.get_ref().job))]
    async fn join_job(
        &self,
        req: Request<pb::JoinJobRequest>,
    ) -> Result<Response<pb::JoinJobResponse>, Status> {
        let caller = Caller::of(&req);
        let r = req.into_inner();
        if r.worker_name.len() > 256 {
            return Err(invalid_field(&ValidationError::new(
                "worker_name",
                "is longer than 256 bytes",
            )));
        }
        let (j, map) = self
            .sched
            .join_saved(
                job_of(&caller, &r.job)?,
                &r.worker_name,
                r.worker_id,
                caller.name(),
            )
            .await?;
        Ok(Response::new(pb::JoinJobResponse {
            worker_id: j.worker_id,
            lease_ms: j.lease.as_millis() as u64,
            clock: j.clock,
            assignment: Some(assignment_pb(j.assignment)),
            shard_map: Some(map.into()),
            spec: Some((&j.spec).into()),
        }))
    }

    async fn worker_heartbeat(
        &self,
        req: Request<pb::WorkerHeartbeatRequest>,
    ) -> Result<Response<pb::WorkerHeartbeatResponse>, Status> {
        let caller = Caller::of(&req);
        let r = req.into_inner();
        let (epoch, state) =
            self.sched
                .worker_heartbeat(job_of(&caller, &r.job)?, r.worker_id, caller.name())?;
        Ok(Response::new(pb::WorkerHeartbeatResponse {
            map_epoch: epoch,
            state: pb::JobState::from(state) as i32,
        }))
    }

    async fn advance_clock(
        &self,
        req: Request<pb::AdvanceClockRequest>,
    ) -> Result<Response<pb::AdvanceClockResponse>, Status> {
        let caller = Caller::of(&req);
        let r = req.into_inner();
        let report = ClockReport {
            finished: r.finished,
            examples: r.examples,
            compute: Duration::from_micros(r.compute_us),
            param_age: Duration::from_micros(r.param_age_us),
            cpu: Duration::from_micros(r.cpu_us),
        };
        let wait = (r.wait_ms > 0).then(|| Duration::from_millis(r.wait_ms));
        let (g, epoch) = self
            .sched
            .advance(
                job_of(&caller, &r.job)?,
                r.worker_id,
                caller.name(),
                report,
                wait,
            )
            .await?;
        Ok(Response::new(pb::AdvanceClockResponse {
            ready: g.ready,
            clock: g.clock,
            min_clock: g.min_clock,
            assignment: Some(assignment_pb(g.assignment)),
            map_epoch: epoch,
            state: pb::JobState::from(g.state) as i32,
            stop: g.stop,
        }))
    }

    async fn leave_job(
        &self,
        req: Request<pb::LeaveJobRequest>,
    ) -> Result<Response<pb::LeaveJobResponse>, Status> {
        let caller = Caller::of(&req);
        let r = req.into_inner();
        self.sched
            .leave(job_of(&caller, &r.job)?, r.worker_id, caller.name())?;
        Ok(Response::new(pb::LeaveJobResponse {}))
    }

    #[instrument(skip_all, fields(job = %req.get_ref().job))]
    async fn checkpoint_job(
        &self,
        req: Request<pb::CheckpointJobRequest>,
    ) -> Result<Response<pb::JobCheckpoint>, Status> {
        let caller = Caller::of(&req);
        let r = req.into_inner();
        let c = self
            .sched
            .checkpoint(job_of(&caller, &r.job)?, true)
            .await?;
        Ok(Response::new(c.into()))
    }

    async fn list_checkpoints(
        &self,
        req: Request<pb::ListCheckpointsRequest>,
    ) -> Result<Response<pb::ListCheckpointsResponse>, Status> {
        let caller = Caller::of(&req);
        let r = req.into_inner();
        let cs = self.sched.checkpoints(job_of(&caller, &r.job)?)?;
        Ok(Response::new(pb::ListCheckpointsResponse {
            checkpoints: cs.into_iter().map(Into::into).collect(),
        }))
    }

    #[instrument(skip_all, fields(job = %req.get_ref().job, name = %req.get_ref().name))]
    async fn delete_checkpoint(
        &self,
        req: Request<pb::DeleteJobCheckpointRequest>,
    ) -> Result<Response<pb::DeleteJobCheckpointResponse>, Status> {
        let caller = Caller::of(&req);
        let r = req.into_inner();
        let freed_bytes = self
            .sched
            .delete_checkpoint(job_of(&caller, &r.job)?, &r.name)
            .await?;
        Ok(Response::new(pb::DeleteJobCheckpointResponse {
            freed_bytes,
        }))
    }

    #[instrument(skip_all, fields(job = %req.get_ref().job))]
    async fn resume_job(
        &self,
        req: Request<pb::ResumeJobRequest>,
    ) -> Result<Response<pb::JobStatus>, Status> {
        let caller = Caller::of(&req);
        let r = req.into_inner();
        let name = (!r.checkpoint.is_empty()).then_some(r.checkpoint.as_str());
        self.sched.resume(job_of(&caller, &r.job)?, name).await?;
        Ok(Response::new(self.status(&r.job)?))
    }
}
