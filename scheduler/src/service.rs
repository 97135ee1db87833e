//! The gRPC edge of the scheduler: wire → domain (validating), the call, domain → wire, and one
//! mapping of [`SchedError`] to a status. Nothing past this file sees prost types.

use ps_core::JobSpec;
use ps_proto::v1 as pb;
use ps_proto::v1::scheduler_server::Scheduler as SchedulerApi;
use tokio::time::{Duration, Instant};
use tonic::{Request, Response, Status};
use tracing::instrument;

use crate::core::{Scheduler, ShardMap};
use crate::state::{Assignment, ClockReport, Job, JobCheckpoint, JobState, SchedError, Staleness};

impl From<SchedError> for Status {
    fn from(e: SchedError) -> Self {
        match e {
            SchedError::InvalidArgument(m) => Status::invalid_argument(m),
            SchedError::NotFound(m) => Status::not_found(m),
            SchedError::AlreadyExists(m) => Status::already_exists(m),
            SchedError::FailedPrecondition(m) => Status::failed_precondition(m),
            SchedError::Unavailable(m) => Status::unavailable(m),
            SchedError::Internal(m) => Status::internal(m),
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
}

fn state_pb(s: JobState) -> pb::JobState {
    match s {
        JobState::Waiting => pb::JobState::Waiting,
        JobState::Running => pb::JobState::Running,
        JobState::Paused => pb::JobState::Paused,
        JobState::Succeeded => pb::JobState::Succeeded,
        JobState::Canceled => pb::JobState::Canceled,
        JobState::Failed => pb::JobState::Failed,
    }
}

fn staleness_pb(s: &Staleness) -> pb::StalenessStats {
    pb::StalenessStats {
        max_gap: s.max_gap,
        mean_gap: s.mean_gap(),
        wait_ms_total: s.wait_total.as_secs_f64() * 1e3,
        wait_ms_p99: s.wait_p99().as_secs_f64() * 1e3,
        param_age_ms_mean: s.mean_age_ms(),
        advances: s.advances,
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

fn map_pb(m: ShardMap) -> pb::ShardMap {
    pb::ShardMap {
        epoch: m.epoch,
        num_shards: m.num_shards,
        virtual_nodes: m.virtual_nodes,
        endpoints: m.endpoints,
        complete: m.complete,
    }
}

fn checkpoint_pb(c: JobCheckpoint) -> pb::JobCheckpoint {
    pb::JobCheckpoint {
        job: c.job,
        name: c.name,
        clock: c.clock,
        created_unix_ms: c.created_unix_ms,
        map_epoch: c.map_epoch,
        shards: c
            .shards
            .into_iter()
            .map(|s| pb::ShardCheckpointRef {
                shard_index: s.shard_index,
                endpoint: s.endpoint,
                name: s.name,
                path: s.path,
                files: s.files,
                bytes: s.bytes,
                sequence: s.sequence,
            })
            .collect(),
    }
}

fn status_pb(j: &Job, epoch: u64) -> pb::JobStatus {
    let now = Instant::now();
    pb::JobStatus {
        spec: Some((&j.spec).into()),
        state: state_pb(j.state) as i32,
        message: j.message.clone(),
        min_clock: j.clocks.min().unwrap_or(0),
        max_clock: j.clocks.max().unwrap_or(0),
        map_epoch: epoch,
        workers: j
            .workers
            .iter()
            .map(|(id, w)| pb::WorkerStatus {
                worker_id: *id,
                name: w.name.clone(),
                live: w.live,
                clock: j.clocks.clock(*id).unwrap_or(0),
                data_shards: if w.live { j.data.of(*id) } else { Vec::new() },
                batch_size: w.batch,
                examples_per_sec: w.throughput,
                staleness: Some(staleness_pb(&w.stats)),
            })
            .collect(),
        staleness: Some(staleness_pb(&j.stats)),
        latest_checkpoint: j
            .checkpoints
            .last()
            .map(|c| c.name.clone())
            .unwrap_or_default(),
        advances_per_sec: j.advances_per_sec(now),
    }
}

fn job_name(name: &str) -> Result<&str, Status> {
    if name.is_empty() {
        return Err(Status::invalid_argument("`job` is empty; name the job"));
    }
    Ok(name)
}

impl SchedulerService {
    fn status(&self, job: &str) -> Result<pb::JobStatus, Status> {
        let epoch = self.sched.shard_map().epoch;
        Ok(self.sched.with_job(job, |j, _| status_pb(j, epoch))?)
    }
}

#[tonic::async_trait]
impl SchedulerApi for SchedulerService {
    #[instrument(skip_all)]
    async fn submit_job(
        &self,
        req: Request<pb::SubmitJobRequest>,
    ) -> Result<Response<pb::JobStatus>, Status> {
        let spec = req
            .into_inner()
            .spec
            .ok_or_else(|| Status::invalid_argument("`spec` is missing"))?;
        let spec = JobSpec::try_from(spec)
            .map_err(|e| ps_runtime::status::invalid_field(&e.within("spec")))?;
        let name = spec.name.clone();
        self.sched.submit(spec).await?;
        Ok(Response::new(self.status(&name)?))
    }

    async fn get_job(
        &self,
        req: Request<pb::GetJobRequest>,
    ) -> Result<Response<pb::JobStatus>, Status> {
        let r = req.into_inner();
        Ok(Response::new(self.status(job_name(&r.job)?)?))
    }

    async fn list_jobs(
        &self,
        _req: Request<pb::ListJobsRequest>,
    ) -> Result<Response<pb::ListJobsResponse>, Status> {
        let jobs = self
            .sched
            .job_names()
            .iter()
            .filter_map(|n| self.status(n).ok())
            .collect();
        Ok(Response::new(pb::ListJobsResponse { jobs }))
    }

    #[instrument(skip_all)]
    async fn cancel_job(
        &self,
        req: Request<pb::CancelJobRequest>,
    ) -> Result<Response<pb::JobStatus>, Status> {
        let r = req.into_inner();
        self.sched.cancel(job_name(&r.job)?).await?;
        Ok(Response::new(self.status(&r.job)?))
    }

    #[instrument(skip_all, fields(shard = req.get_ref().shard_index))]
    async fn register_shard(
        &self,
        req: Request<pb::RegisterShardRequest>,
    ) -> Result<Response<pb::RegisterShardResponse>, Status> {
        let r = req.into_inner();
        if !(r.endpoint.starts_with("http://") || r.endpoint.starts_with("https://")) {
            return Err(Status::invalid_argument(format!(
                "endpoint `{}` must be a URL (http://host:port)",
                r.endpoint
            )));
        }
        let (epoch, lease) = self
            .sched
            .register_shard(r.shard_index, r.num_shards, r.virtual_nodes, r.endpoint)
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
        let r = req.into_inner();
        let epoch = self.sched.shard_heartbeat(r.shard_index, &r.endpoint)?;
        Ok(Response::new(pb::ShardHeartbeatResponse {
            map_epoch: epoch,
        }))
    }

    async fn get_shard_map(
        &self,
        _req: Request<pb::GetShardMapRequest>,
    ) -> Result<Response<pb::ShardMap>, Status> {
        Ok(Response::new(map_pb(self.sched.shard_map())))
    }

    #[instrument(skip_all, fields(job = %req.get_ref().job))]
    async fn join_job(
        &self,
        req: Request<pb::JoinJobRequest>,
    ) -> Result<Response<pb::JoinJobResponse>, Status> {
        let r = req.into_inner();
        if r.worker_name.len() > 256 {
            return Err(Status::invalid_argument(
                "`worker_name` is longer than 256 bytes",
            ));
        }
        let (j, map) = self
            .sched
            .join(job_name(&r.job)?, &r.worker_name, r.worker_id)?;
        Ok(Response::new(pb::JoinJobResponse {
            worker_id: j.worker_id,
            lease_ms: j.lease.as_millis() as u64,
            clock: j.clock,
            assignment: Some(assignment_pb(j.assignment)),
            shard_map: Some(map_pb(map)),
            spec: Some((&j.spec).into()),
        }))
    }

    async fn worker_heartbeat(
        &self,
        req: Request<pb::WorkerHeartbeatRequest>,
    ) -> Result<Response<pb::WorkerHeartbeatResponse>, Status> {
        let r = req.into_inner();
        let (epoch, state) = self
            .sched
            .worker_heartbeat(job_name(&r.job)?, r.worker_id)?;
        Ok(Response::new(pb::WorkerHeartbeatResponse {
            map_epoch: epoch,
            state: state_pb(state) as i32,
        }))
    }

    async fn advance_clock(
        &self,
        req: Request<pb::AdvanceClockRequest>,
    ) -> Result<Response<pb::AdvanceClockResponse>, Status> {
        let r = req.into_inner();
        let report = ClockReport {
            finished: r.finished,
            examples: r.examples,
            compute: Duration::from_micros(r.compute_us),
            param_age: Duration::from_micros(r.param_age_us),
        };
        let wait = (r.wait_ms > 0).then(|| Duration::from_millis(r.wait_ms));
        let (g, epoch) = self
            .sched
            .advance(job_name(&r.job)?, r.worker_id, report, wait)
            .await?;
        Ok(Response::new(pb::AdvanceClockResponse {
            ready: g.ready,
            clock: g.clock,
            min_clock: g.min_clock,
            assignment: Some(assignment_pb(g.assignment)),
            map_epoch: epoch,
            state: state_pb(g.state) as i32,
            stop: g.stop,
        }))
    }

    async fn leave_job(
        &self,
        req: Request<pb::LeaveJobRequest>,
    ) -> Result<Response<pb::LeaveJobResponse>, Status> {
        let r = req.into_inner();
        self.sched.leave(job_name(&r.job)?, r.worker_id)?;
        Ok(Response::new(pb::LeaveJobResponse {}))
    }

    #[instrument(skip_all, fields(job = %req.get_ref().job))]
    async fn checkpoint_job(
        &self,
        req: Request<pb::CheckpointJobRequest>,
    ) -> Result<Response<pb::JobCheckpoint>, Status> {
        let r = req.into_inner();
        let c = self.sched.checkpoint(job_name(&r.job)?, true).await?;
        Ok(Response::new(checkpoint_pb(c)))
    }

    async fn list_checkpoints(
        &self,
        req: Request<pb::ListCheckpointsRequest>,
    ) -> Result<Response<pb::ListCheckpointsResponse>, Status> {
        let r = req.into_inner();
        let cs = self.sched.checkpoints(job_name(&r.job)?)?;
        Ok(Response::new(pb::ListCheckpointsResponse {
            checkpoints: cs.into_iter().map(checkpoint_pb).collect(),
        }))
    }

    #[instrument(skip_all, fields(job = %req.get_ref().job))]
    async fn resume_job(
        &self,
        req: Request<pb::ResumeJobRequest>,
    ) -> Result<Response<pb::JobStatus>, Status> {
        let r = req.into_inner();
        let name = (!r.checkpoint.is_empty()).then_some(r.checkpoint.as_str());
        self.sched.resume(job_name(&r.job)?, name).await?;
        Ok(Response::new(self.status(&r.job)?))
    }
}
