//! What the scheduler refuses or fails at, by meaning. The gRPC edge (`service.rs`) maps every
//! variant to one status code and a `google.rpc.ErrorInfo` reason.

use std::time::Duration;

use ps_core::ValidationError;
use ps_core::status::JobState;

use crate::policy::{ClockError, WorkerId};

/// The scheduler's errors.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SchedError {
    /// A field of the request is malformed or out of its range.
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    #[error("no job named `{job}`")]
    NoSuchJob { job: String },
    #[error("job `{job}` exists with another spec; cancel it and submit under a new name")]
    JobExists { job: String },
    #[error(
        "worker {worker} is not a live member of job `{job}` (its lease expired, or it left); \
         join again"
    )]
    NotMember { job: String, worker: WorkerId },
    #[error(
        "job `{job}`: worker {worker} has finished {clock} clocks, so its next report is for \
         clock {clock}, not {reported}"
    )]
    ClockOutOfOrder {
        job: String,
        worker: WorkerId,
        clock: u64,
        reported: u64,
    },
    #[error("job `{job}` has ended ({state}){}", colon(message))]
    JobEnded {
        job: String,
        state: JobState,
        message: String,
    },
    #[error(
        "job `{job}` is not running ({state}{}); a checkpoint needs live shards and tables",
        colon(message)
    )]
    NotRunning {
        job: String,
        state: JobState,
        message: String,
    },
    #[error(
        "job `{job}` is already taking, restoring or deleting a checkpoint; try again when it is \
         done"
    )]
    Busy { job: String },
    #[error("job `{job}` has no checkpoint named `{name}`")]
    NoSuchCheckpoint { job: String, name: String },
    #[error("job `{job}` has no complete checkpoint yet")]
    NoCheckpointYet { job: String },
    #[error("checkpoint `{name}` has {has} shards; the cluster has {cluster}")]
    CheckpointShards {
        name: String,
        has: usize,
        cluster: usize,
    },
    #[error(
        "this cluster has {shards} shards with {vnodes} virtual nodes; shard {index} says \
         {its_shards} with {its_vnodes}"
    )]
    ShardConflict {
        index: u32,
        shards: u32,
        vnodes: u32,
        its_shards: u32,
        its_vnodes: u32,
    },
    #[error(
        "shard {index} at {endpoint} is not registered (its lease expired or the scheduler \
         restarted); register again"
    )]
    ShardNotRegistered { index: u32, endpoint: String },
    /// A worker id or a shard slot another authenticated caller holds.
    #[error("{what} belongs to `{holder}`, not to the caller `{caller}`")]
    NotYours {
        what: String,
        holder: String,
        caller: String,
    },
    /// A shard registered an address the scheduler cannot connect to.
    #[error(
        "the scheduler cannot connect to {endpoint} ({cause}); a shard must advertise an address \
         the scheduler and the workers reach (--advertise)"
    )]
    Unreachable { endpoint: String, cause: String },
    /// A join under a worker id this job never issued.
    #[error("job `{job}` has never had worker {worker}; join with worker id 0 to be given an id")]
    UnknownWorker { job: String, worker: u64 },
    #[error("not every shard is registered; try again when the job is running")]
    ShardsIncomplete,
    /// A call to the shards failed (after the SDK's retries).
    #[error("{action}: {cause}")]
    Shards { action: &'static str, cause: String },
    /// A job's table could not be created: the job fails.
    #[error("creating table `{table}`: {cause}")]
    TableCreation { table: String, cause: String },
    #[error("job `{job}`: gave up waiting for {what} after {after:?}")]
    TimedOut {
        job: String,
        what: &'static str,
        after: Duration,
    },
    /// Writing the state file or a job manifest failed.
    #[error("{what}: {cause}")]
    Storage { what: &'static str, cause: String },
}

fn colon(message: &str) -> String {
    if message.is_empty() {
        String::new()
    } else {
        format!(": {message}")
    }
}

impl SchedError {
    /// A refused clock report of worker `worker` of job `job`.
    pub fn clock(job: &str, e: ClockError) -> Self {
        match e {
            ClockError::NotMember(worker) => Self::NotMember {
                job: job.to_owned(),
                worker,
            },
            ClockError::OutOfOrder {
                worker,
                clock,
                reported,
            } => Self::ClockOutOfOrder {
                job: job.to_owned(),
                worker,
                clock,
                reported,
            },
        }
    }

    pub fn no_such_job(job: &str) -> Self {
        Self::NoSuchJob {
            job: job.to_owned(),
        }
    }
}

pub type Result<T, E = SchedError> = std::result::Result<T, E>;
