//! The scheduler's client: job control ([`SchedulerClient`]) and a worker's membership in a job
//! ([`WorkerSession`]: join, lease renewal, clock reports under the job's consistency model).
//!
//! ```no_run
//! # async fn demo() -> Result<(), ps_client::ClientError> {
//! use ps_client::ClientConfig;
//! use ps_client::scheduler::{ClockDone, SchedulerClient, WorkerSession};
//!
//! let sched = SchedulerClient::connect("http://127.0.0.1:7000").await?;
//! let mut me = WorkerSession::join(sched, "fmnist", "worker-a").await?;
//! let ps = me.ps_client(ClientConfig::new(Vec::<String>::new())).await?; // endpoints: the job's
//! let mut grant = me.start().await?;
//! while !grant.stop {
//!     // pull, compute clock `grant.clock` on `grant.data_shards`, push (awaited), then:
//!     grant = me.advance(ClockDone { examples: 128, ..Default::default() }).await?;
//! }
//! # let _ = ps; Ok(()) }
//! ```
//!
//! What the scheduler reports comes back as `ps_core::status` types ([`JobStatus`],
//! [`JobCheckpoint`], [`ShardMap`]), converted from the wire once and checked.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ps_core::JobSpec;
use ps_core::status::{JobCheckpoint, JobStatus, ShardMap};
use ps_core::wire::{KEEPALIVE_INTERVAL, KEEPALIVE_TIMEOUT};
use ps_proto::v1 as pb;
use ps_proto::v1::scheduler_client::SchedulerClient as Raw;
use tokio::task::JoinHandle;
use tonic::transport::{Channel, Endpoint};

use crate::auth::Bearer;
use crate::trace::Traced;
use crate::{ClientConfig, ClientError, Credentials, PsClient};

/// The scheduler's gRPC channel: traced, with the client's token.
type SchedChannel = Traced<Bearer<Channel>>;

/// A connection to the scheduler. Cheap to clone.
#[derive(Debug, Clone)]
pub struct SchedulerClient {
    endpoint: String,
    raw: Raw<SchedChannel>,
    /// What this client connects with; also what [`SchedulerClient::ps_client`]'s shard
    /// connections use unless told otherwise.
    credentials: Credentials,
    /// Attempts for a call answered `unavailable` (a scheduler restarting).
    max_attempts: u32,
}

impl crate::MapSource for SchedulerClient {
    fn current(&self) -> futures::future::BoxFuture<'_, Result<(u64, Vec<String>), ClientError>> {
        Box::pin(async move {
            let map = self.shard_map().await?;
            Ok((map.epoch, map.endpoints))
        })
    }
}

impl SchedulerClient {
    /// Connects lazily: the first call reports an unreachable scheduler as `unavailable`.
    pub async fn connect(endpoint: &str) -> Result<Self, ClientError> {
        Self::connect_with_timeout(endpoint, None).await
    }

    /// [`SchedulerClient::connect`], with a deadline on every call (not for workers, whose
    /// clock reports wait as long as the consistency model says).
    pub async fn connect_with_timeout(
        endpoint: &str,
        timeout: Option<Duration>,
    ) -> Result<Self, ClientError> {
        Self::connect_with(endpoint, timeout, Credentials::default()).await
    }

    /// [`SchedulerClient::connect_with_timeout`] with TLS and a token as `credentials` say.
    pub async fn connect_with(
        endpoint: &str,
        timeout: Option<Duration>,
        credentials: Credentials,
    ) -> Result<Self, ClientError> {
        let ep = Endpoint::from_shared(endpoint.to_owned())
            .map_err(|e| ClientError::InvalidInput(format!("bad scheduler URL `{endpoint}`: {e}")))?
            .connect_timeout(Duration::from_secs(3))
            .tcp_nodelay(true)
            // A long-polled clock report on a connection whose peer went silent fails within
            // seconds and is retried, instead of waiting for the kernel's timeout.
            .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
            .keep_alive_timeout(KEEPALIVE_TIMEOUT)
            .keep_alive_while_idle(true);
        let ep = match timeout {
            Some(t) => ep.timeout(t),
            None => ep,
        };
        let channel = crate::tls::channel(&ep, credentials.tls.as_ref());
        Ok(Self {
            endpoint: endpoint.to_owned(),
            raw: Raw::new(Traced::new(
                Bearer::new(channel, credentials.token.as_ref()),
                endpoint,
            ))
            .max_decoding_message_size(256 << 20)
            .max_encoding_message_size(256 << 20),
            credentials,
            max_attempts: 1,
        })
    }

    /// Retries calls that fail transiently (`unavailable`, or cut by a lost connection) up to
    /// `attempts` times with backoff (workers ride out a scheduler restart this way; `psctl`
    /// does not wait).
    #[must_use]
    pub fn with_retries(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts.max(1);
        self
    }

    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    async fn call<T, F, Fut>(&self, f: F) -> Result<T, ClientError>
    where
        F: Fn(Raw<SchedChannel>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let mut backoff = Duration::from_millis(50);
        let mut attempt = 1;
        loop {
            match f(self.raw.clone()).await {
                Ok(r) => return Ok(r.into_inner()),
                // A scheduler restarting: refused connections, and calls cut mid-way (a long
                // poll cut by a crash comes back `unknown` or `cancelled`). Retrying is safe:
                // a repeated clock report is recognised as one.
                Err(s) if crate::error::is_transient(&s) && attempt < self.max_attempts => {
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                    attempt += 1;
                }
                Err(s) => return Err(ClientError::from_scheduler(&self.endpoint, s)),
            }
        }
    }

    pub async fn submit(&self, spec: &JobSpec) -> Result<JobStatus, ClientError> {
        let req = pb::SubmitJobRequest {
            spec: Some(spec.into()),
        };
        let st = self
            .call(|mut c| {
                let req = req.clone();
                async move { c.submit_job(req).await }
            })
            .await?;
        job_status(st)
    }

    pub async fn job(&self, job: &str) -> Result<JobStatus, ClientError> {
        let job = job.to_owned();
        let st = self
            .call(|mut c| {
                let job = job.clone();
                async move { c.get_job(pb::GetJobRequest { job }).await }
            })
            .await?;
        job_status(st)
    }

    pub async fn jobs(&self) -> Result<Vec<JobStatus>, ClientError> {
        self.call(|mut c| async move { c.list_jobs(pb::ListJobsRequest {}).await })
            .await?
            .jobs
            .into_iter()
            .map(job_status)
            .collect()
    }

    pub async fn cancel(&self, job: &str) -> Result<JobStatus, ClientError> {
        let job = job.to_owned();
        let st = self
            .call(|mut c| {
                let job = job.clone();
                async move { c.cancel_job(pb::CancelJobRequest { job }).await }
            })
            .await?;
        job_status(st)
    }

    pub async fn shard_map(&self) -> Result<ShardMap, ClientError> {
        let map = self
            .call(|mut c| async move { c.get_shard_map(pb::GetShardMapRequest {}).await })
            .await?;
        ShardMap::try_from(map).map_err(|e| ClientError::Protocol(format!("shard map: {e}")))
    }

    /// A client of the shards this scheduler maps (every shard must be registered), which
    /// follows the map when a shard moves. `cfg`'s endpoints and map are replaced; its TLS and
    /// token, where unset, are this client's.
    pub async fn ps_client(&self, mut cfg: ClientConfig) -> Result<PsClient, ClientError> {
        if cfg.credentials.tls.is_none() {
            cfg.credentials.tls = self.credentials.tls.clone();
        }
        if cfg.credentials.token.is_none() {
            cfg.credentials.token = self.credentials.token.clone();
        }
        let map = self.shard_map().await?;
        if !map.complete {
            return Err(ClientError::ShardsMissing {
                epoch: map.epoch,
                registered: map.endpoints.iter().filter(|e| !e.is_empty()).count(),
                num_shards: map.num_shards,
            });
        }
        cfg.endpoints = map.endpoints;
        cfg.map_epoch = map.epoch;
        cfg.map_source = Some(Arc::new(self.clone()));
        PsClient::connect(cfg).await
    }

    /// Takes a coordinated checkpoint now and returns its manifest.
    pub async fn checkpoint(&self, job: &str) -> Result<JobCheckpoint, ClientError> {
        let job = job.to_owned();
        let c = self
            .call(|mut c| {
                let job = job.clone();
                async move { c.checkpoint_job(pb::CheckpointJobRequest { job }).await }
            })
            .await?;
        Ok(c.into())
    }

    pub async fn checkpoints(&self, job: &str) -> Result<Vec<JobCheckpoint>, ClientError> {
        let job = job.to_owned();
        Ok(self
            .call(|mut c| {
                let job = job.clone();
                async move { c.list_checkpoints(pb::ListCheckpointsRequest { job }).await }
            })
            .await?
            .checkpoints
            .into_iter()
            .map(Into::into)
            .collect())
    }

    /// Deletes the job's checkpoint `name` from every shard and from the job's list; the
    /// bytes freed on the shards' disks.
    pub async fn delete_checkpoint(&self, job: &str, name: &str) -> Result<u64, ClientError> {
        let req = pb::DeleteJobCheckpointRequest {
            job: job.to_owned(),
            name: name.to_owned(),
        };
        Ok(self
            .call(|mut c| {
                let req = req.clone();
                async move { c.delete_checkpoint(req).await }
            })
            .await?
            .freed_bytes)
    }

    /// Restores the job to checkpoint `name` (the latest when `None`).
    pub async fn resume(&self, job: &str, name: Option<&str>) -> Result<JobStatus, ClientError> {
        let req = pb::ResumeJobRequest {
            job: job.to_owned(),
            checkpoint: name.unwrap_or_default().to_owned(),
        };
        let st = self
            .call(|mut c| {
                let req = req.clone();
                async move { c.resume_job(req).await }
            })
            .await?;
        job_status(st)
    }
}

/// A shard's membership in the cluster: what it registers as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardRegistration {
    pub shard_index: u32,
    pub num_shards: u32,
    pub virtual_nodes: u32,
    /// The URL workers reach the shard at.
    pub endpoint: String,
}

impl SchedulerClient {
    /// Registers a shard; returns the map epoch and the lease to renew within.
    pub async fn register_shard(
        &self,
        shard: &ShardRegistration,
    ) -> Result<(u64, Duration), ClientError> {
        let req = pb::RegisterShardRequest {
            shard_index: shard.shard_index,
            num_shards: shard.num_shards,
            virtual_nodes: shard.virtual_nodes,
            endpoint: shard.endpoint.clone(),
        };
        let r = self
            .call(|mut c| {
                let req = req.clone();
                async move { c.register_shard(req).await }
            })
            .await?;
        Ok((r.map_epoch, Duration::from_millis(r.lease_ms)))
    }

    /// Renews a shard's lease; returns the map epoch. A shard the scheduler does not know is
    /// refused with reason `SHARD_NOT_REGISTERED`: register again.
    pub async fn shard_heartbeat(&self, shard: &ShardRegistration) -> Result<u64, ClientError> {
        let req = pb::ShardHeartbeatRequest {
            shard_index: shard.shard_index,
            endpoint: shard.endpoint.clone(),
        };
        let r = self
            .call(|mut c| {
                let req = req.clone();
                async move { c.shard_heartbeat(req).await }
            })
            .await?;
        Ok(r.map_epoch)
    }
}

/// A job status from the wire, checked.
fn job_status(st: pb::JobStatus) -> Result<JobStatus, ClientError> {
    JobStatus::try_from(st).map_err(|e| ClientError::Protocol(format!("job status: {e}")))
}

/// What a finished clock did, for the scheduler's throughput and staleness figures.
#[derive(Debug, Clone, Copy, Default)]
pub struct ClockDone {
    pub examples: u64,
    /// Compute time of the clock; measured by the session when `None`.
    pub compute: Option<Duration>,
    /// Time from the pull the clock trained on to its push being acknowledged.
    pub param_age: Duration,
    /// CPU time the worker's process has used so far, for the job's cost.
    pub cpu: Option<Duration>,
}

/// Permission to compute one clock.
#[derive(Debug, Clone)]
pub struct Grant {
    pub clock: u64,
    pub min_clock: u64,
    /// The data shards to read this clock, of `num_data_shards`.
    pub data_shards: Vec<u32>,
    pub num_data_shards: u32,
    /// Examples to compute this clock (0: the job sets no global batch).
    pub batch_size: u64,
    /// The job has ended (every worker has finished `max_clocks`, or it was stopped): stop
    /// training. A worker that has finished `max_clocks` waits here for the others, so what it
    /// reads after this holds every worker's pushes.
    pub stop: bool,
    /// Set when a resume moved this worker back to an earlier clock.
    pub restarted: bool,
}

/// A worker's membership in a job: a lease kept alive by a background task, and clock reports
/// that wait as the job's consistency model says.
#[derive(Debug)]
pub struct WorkerSession {
    sched: SchedulerClient,
    job: String,
    name: String,
    worker_id: u64,
    spec: JobSpec,
    map: ShardMap,
    epoch: Arc<AtomicU64>,
    clock: u64,
    started: Instant,
    heartbeat: JoinHandle<()>,
}

impl Drop for WorkerSession {
    fn drop(&mut self) {
        self.heartbeat.abort();
    }
}

fn grant_of(r: &pb::AdvanceClockResponse, expected: u64) -> Grant {
    let a = r.assignment.clone().unwrap_or_default();
    Grant {
        clock: r.clock,
        min_clock: r.min_clock,
        data_shards: a.data_shards,
        num_data_shards: a.num_data_shards,
        batch_size: a.batch_size,
        stop: r.stop,
        restarted: r.clock != expected,
    }
}

impl WorkerSession {
    /// Joins job `job` as a new member named `name`.
    pub async fn join(sched: SchedulerClient, job: &str, name: &str) -> Result<Self, ClientError> {
        Self::rejoin(sched, job, name, 0).await
    }

    /// Joins job `job` again under `worker_id` (0 = a new member).
    pub async fn rejoin(
        sched: SchedulerClient,
        job: &str,
        name: &str,
        worker_id: u64,
    ) -> Result<Self, ClientError> {
        let sched = if sched.max_attempts == 1 {
            sched.with_retries(40)
        } else {
            sched
        };
        let r = Self::join_call(&sched, job, name, worker_id).await?;
        let spec = r
            .spec
            .clone()
            .ok_or_else(|| ClientError::Protocol("JoinJob answered without a spec".into()))
            .and_then(|s| JobSpec::try_from(s).map_err(|e| ClientError::Protocol(e.to_string())))?;
        let map = r
            .shard_map
            .clone()
            .map(ShardMap::try_from)
            .transpose()
            .map_err(|e| ClientError::Protocol(format!("shard map: {e}")))?
            .unwrap_or_default();
        let epoch = Arc::new(AtomicU64::new(map.epoch));
        let lease = Duration::from_millis(r.lease_ms.max(100));
        let heartbeat = tokio::spawn(heartbeat(
            sched.clone(),
            job.to_owned(),
            r.worker_id,
            lease,
            epoch.clone(),
        ));
        Ok(Self {
            sched,
            job: job.to_owned(),
            name: name.to_owned(),
            worker_id: r.worker_id,
            spec,
            map,
            epoch,
            clock: r.clock,
            started: Instant::now(),
            heartbeat,
        })
    }

    async fn join_call(
        sched: &SchedulerClient,
        job: &str,
        name: &str,
        worker_id: u64,
    ) -> Result<pb::JoinJobResponse, ClientError> {
        let req = pb::JoinJobRequest {
            job: job.to_owned(),
            worker_name: name.to_owned(),
            worker_id,
        };
        sched
            .call(|mut c| {
                let req = req.clone();
                async move { c.join_job(req).await }
            })
            .await
    }

    pub fn worker_id(&self) -> u64 {
        self.worker_id
    }

    pub fn spec(&self) -> &JobSpec {
        &self.spec
    }

    /// The shard map as of the join.
    pub fn shard_map(&self) -> &ShardMap {
        &self.map
    }

    /// The newest shard-map epoch this session has heard of.
    pub fn map_epoch(&self) -> u64 {
        self.epoch.load(Ordering::Relaxed)
    }

    /// The clock this worker computes next.
    pub fn clock(&self) -> u64 {
        self.clock
    }

    /// A client for the job's shards, routed with the current shard map and carrying the job's
    /// table codecs. `cfg`'s endpoints, epoch and map source are replaced: the client follows
    /// the scheduler's map when a shard moves (see [`ClientConfig::map_source`]).
    pub async fn ps_client(&self, cfg: ClientConfig) -> Result<PsClient, ClientError> {
        let ps = self.sched.ps_client(cfg).await?;
        self.epoch.fetch_max(ps.map_epoch(), Ordering::Relaxed);
        for t in &self.spec.tables {
            let codec = crate::TableCodec {
                push: ps_codec::CompressOptions::new(t.codec),
                pull: t.pull,
            };
            ps.set_table_codec(t.spec.name.as_str(), codec)?;
        }
        Ok(ps)
    }

    /// Waits for permission to compute the first clock after joining.
    pub async fn start(&mut self) -> Result<Grant, ClientError> {
        self.report(None, ClockDone::default()).await
    }

    /// Reports the current clock done (every push of it acknowledged) and waits for the next.
    pub async fn advance(&mut self, done: ClockDone) -> Result<Grant, ClientError> {
        self.report(Some(self.clock), done).await
    }

    async fn report(
        &mut self,
        finished: Option<u64>,
        done: ClockDone,
    ) -> Result<Grant, ClientError> {
        let compute = done.compute.unwrap_or_else(|| self.started.elapsed());
        let expected = finished.map_or(self.clock, |c| c + 1);
        let mut req = pb::AdvanceClockRequest {
            job: self.job.clone(),
            worker_id: self.worker_id,
            finished,
            examples: done.examples,
            compute_us: compute.as_micros() as u64,
            param_age_us: done.param_age.as_micros() as u64,
            wait_ms: 0,
            cpu_us: done.cpu.map_or(0, |c| c.as_micros() as u64),
        };
        loop {
            let r = self
                .sched
                .call(|mut c| {
                    let req = req.clone();
                    async move { c.advance_clock(req).await }
                })
                .await;
            let r = match r {
                Ok(r) => r,
                Err(e) if e.code() == Some(tonic::Code::NotFound) => {
                    // The lease expired (or the scheduler lost it): take our place again.
                    tracing::warn!(worker = self.worker_id, "membership lost; joining again");
                    let j =
                        Self::join_call(&self.sched, &self.job, &self.name, self.worker_id).await?;
                    self.clock = j.clock;
                    req.finished = None;
                    continue;
                }
                Err(e) => return Err(e),
            };
            self.epoch.fetch_max(r.map_epoch, Ordering::Relaxed);
            if r.ready || r.stop {
                let g = grant_of(&r, expected);
                self.clock = g.clock;
                self.started = Instant::now();
                return Ok(g);
            }
            // Still held: ask again without repeating the report's figures.
            req.examples = 0;
            req.compute_us = 0;
            req.param_age_us = 0;
        }
    }

    /// Leaves the job for good; its data shards go to the others at once.
    pub async fn leave(self) -> Result<(), ClientError> {
        self.heartbeat.abort();
        let req = pb::LeaveJobRequest {
            job: self.job.clone(),
            worker_id: self.worker_id,
        };
        self.sched
            .call(|mut c| {
                let req = req.clone();
                async move { c.leave_job(req).await }
            })
            .await?;
        Ok(())
    }
}

async fn heartbeat(
    sched: SchedulerClient,
    job: String,
    worker_id: u64,
    lease: Duration,
    epoch: Arc<AtomicU64>,
) {
    loop {
        tokio::time::sleep(lease / 3).await;
        let req = pb::WorkerHeartbeatRequest {
            job: job.clone(),
            worker_id,
        };
        match sched.raw.clone().worker_heartbeat(req).await {
            Ok(r) => {
                epoch.fetch_max(r.into_inner().map_epoch, Ordering::Relaxed);
            }
            // The next clock report joins again (and learns the clock it restarts at).
            Err(s) if s.code() == tonic::Code::NotFound => {}
            Err(s) => tracing::debug!(worker_id, error = s.message(), "heartbeat failed"),
        }
    }
}
