//! What the services report about themselves, as domain types: a job's status with its
//! members and staleness figures, a coordinated checkpoint's manifest, the shard map, a shard's
//! statistics. The scheduler and the shards build these and convert them to the wire once; the
//! SDK converts the wire back once, checked, and hands these to its users (`psctl`, tests, a
//! user's own tools), so nothing past the SDK sees prost types.

use serde::{Deserialize, Serialize};

use ps_proto::v1 as pb;

use crate::{JobSpec, ValidationError};

/// Where a job is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum JobState {
    /// Submitted; waiting for its shards and workers.
    Waiting,
    Running,
    /// A shard is missing, or a resume is restoring the shards: no clock is granted.
    Paused,
    Succeeded,
    Canceled,
    Failed,
}

impl JobState {
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Succeeded | Self::Canceled | Self::Failed)
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Waiting => "waiting",
            Self::Running => "running",
            Self::Paused => "paused",
            Self::Succeeded => "succeeded",
            Self::Canceled => "canceled",
            Self::Failed => "failed",
        }
    }
}

impl std::fmt::Display for JobState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl From<JobState> for pb::JobState {
    fn from(s: JobState) -> Self {
        match s {
            JobState::Waiting => Self::Waiting,
            JobState::Running => Self::Running,
            JobState::Paused => Self::Paused,
            JobState::Succeeded => Self::Succeeded,
            JobState::Canceled => Self::Canceled,
            JobState::Failed => Self::Failed,
        }
    }
}

impl TryFrom<i32> for JobState {
    type Error = ValidationError;

    fn try_from(v: i32) -> Result<Self, Self::Error> {
        match pb::JobState::try_from(v) {
            Ok(pb::JobState::Waiting) => Ok(Self::Waiting),
            Ok(pb::JobState::Running) => Ok(Self::Running),
            Ok(pb::JobState::Paused) => Ok(Self::Paused),
            Ok(pb::JobState::Succeeded) => Ok(Self::Succeeded),
            Ok(pb::JobState::Canceled) => Ok(Self::Canceled),
            Ok(pb::JobState::Failed) => Ok(Self::Failed),
            _ => Err(ValidationError::new(
                "state",
                format!("unknown job state {v}"),
            )),
        }
    }
}

/// How far apart the workers ran and how long they waited, over a job or one worker.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct StalenessStats {
    /// Largest clock gap to the slowest worker at a grant.
    pub max_gap: u64,
    pub mean_gap: f64,
    pub wait_ms_total: f64,
    pub wait_ms_p99: f64,
    /// Mean age of the parameters a clock trained on, as workers report it.
    pub param_age_ms_mean: f64,
    pub advances: u64,
}

/// A member of a job.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorkerStatus {
    pub worker_id: u64,
    pub name: String,
    pub live: bool,
    /// The clock it computes next.
    pub clock: u64,
    pub data_shards: Vec<u32>,
    pub batch_size: u64,
    pub examples_per_sec: f64,
    pub staleness: StalenessStats,
}

/// A job as the scheduler sees it now.
#[derive(Debug, Clone, PartialEq)]
pub struct JobStatus {
    pub spec: JobSpec,
    pub state: JobState,
    /// Why the job is in its state, when that needs saying (a failure, a missing shard).
    pub message: String,
    pub min_clock: u64,
    pub max_clock: u64,
    pub map_epoch: u64,
    pub workers: Vec<WorkerStatus>,
    pub staleness: StalenessStats,
    /// The newest complete checkpoint's name.
    pub latest_checkpoint: Option<String>,
    pub advances_per_sec: f64,
    pub cost: JobCost,
}

/// What a job has cost so far (wire form `JobCost`, which says what each figure counts).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct JobCost {
    pub wall_seconds: f64,
    pub worker_cpu_seconds: f64,
    pub shard_cpu_seconds: f64,
    pub bytes_moved: u64,
    pub bytes_stored: u64,
}

impl From<JobCost> for pb::JobCost {
    fn from(c: JobCost) -> Self {
        Self {
            wall_seconds: c.wall_seconds,
            worker_cpu_seconds: c.worker_cpu_seconds,
            shard_cpu_seconds: c.shard_cpu_seconds,
            bytes_moved: c.bytes_moved,
            bytes_stored: c.bytes_stored,
        }
    }
}

impl From<pb::JobCost> for JobCost {
    fn from(c: pb::JobCost) -> Self {
        Self {
            wall_seconds: c.wall_seconds,
            worker_cpu_seconds: c.worker_cpu_seconds,
            shard_cpu_seconds: c.shard_cpu_seconds,
            bytes_moved: c.bytes_moved,
            bytes_stored: c.bytes_stored,
        }
    }
}

impl JobStatus {
    /// The live members.
    pub fn live(&self) -> impl Iterator<Item = &WorkerStatus> {
        self.workers.iter().filter(|w| w.live)
    }
}

/// One shard's part of a coordinated checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShardCheckpointRef {
    pub shard_index: u32,
    pub endpoint: String,
    /// The shard's checkpoint name (for `RestoreCheckpoint`).
    pub name: String,
    pub path: String,
    pub files: u64,
    pub bytes: u64,
    pub sequence: u64,
}

/// The manifest of a coordinated checkpoint: every shard's checkpoint at one clock boundary.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobCheckpoint {
    pub job: String,
    pub name: String,
    /// Every update of clocks below it is in, none at or above.
    pub clock: u64,
    pub created_unix_ms: u64,
    pub map_epoch: u64,
    pub shards: Vec<ShardCheckpointRef>,
}

/// Where each shard serves, as the scheduler publishes it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ShardMap {
    pub epoch: u64,
    pub num_shards: u32,
    pub virtual_nodes: u32,
    /// Every shard's endpoint in index order; empty for a shard not registered now.
    pub endpoints: Vec<String>,
    /// Every shard is registered.
    pub complete: bool,
}

/// One table's counters on one shard.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct TableStats {
    pub name: String,
    /// Rows (sparse) or chunks (dense) stored on the shard.
    pub rows: u64,
    pub pushes: u64,
    pub pulls: u64,
    pub values_pushed: u64,
    pub values_pulled: u64,
    /// Why the shard could not load this table at start-up (empty: loaded).
    pub load_error: String,
    /// Bytes the table's cells take on this shard.
    pub memory_bytes: u64,
    /// CPU time the shard spent on the table since it started: decoding pushes, applying
    /// them, answering pulls.
    pub cpu_seconds: f64,
    /// Payload bytes of pushes received and of pulls sent since the shard started.
    pub bytes_received: u64,
    pub bytes_sent: u64,
    /// Sparse: rows held in memory (the shard's cache) out of `rows`.
    pub cached_rows: u64,
    /// Sparse: rows stored since the shard started, and pushes of an id held back by
    /// admission (`TableSpec::admit_after`) since it started.
    pub rows_admitted: u64,
    pub rows_held_back: u64,
    /// Sparse: rows evicted since the shard started, by age (`TableSpec::ttl_seconds`) and by
    /// the row cap (`TableSpec::max_rows`).
    pub rows_expired: u64,
    pub rows_capped: u64,
}

/// A shard's counters.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ShardStats {
    pub shard_index: u32,
    pub num_shards: u32,
    pub uptime_ms: u64,
    pub pushes_applied: u64,
    pub pushes_duplicate: u64,
    pub write_batches: u64,
    /// Bytes of durable writes: store batches, push-log records and images of the dense cells.
    pub bytes_written: u64,
    pub live_data_bytes: u64,
    pub tables: Vec<TableStats>,
    /// Calls answered on the bulk stream.
    pub bulk_calls: u64,
    /// Memory the tables' cells take, and the budget they are held within.
    pub memory_bytes: u64,
    pub memory_budget_bytes: u64,
    /// The sparse-row cache: bytes of rows in memory (part of `memory_bytes`), its budget
    /// (part of `memory_budget_bytes`), rows found in it, rows read past it, rows evicted.
    pub cache_bytes: u64,
    pub cache_budget_bytes: u64,
    pub cache_hits: u64,
    pub cache_misses: u64,
    pub cache_evictions: u64,
}

// Wire conversions: to the wire for the services, from it (checked) for the SDK.

impl From<StalenessStats> for pb::StalenessStats {
    fn from(s: StalenessStats) -> Self {
        Self {
            max_gap: s.max_gap,
            mean_gap: s.mean_gap,
            wait_ms_total: s.wait_ms_total,
            wait_ms_p99: s.wait_ms_p99,
            param_age_ms_mean: s.param_age_ms_mean,
            advances: s.advances,
        }
    }
}

impl From<pb::StalenessStats> for StalenessStats {
    fn from(s: pb::StalenessStats) -> Self {
        Self {
            max_gap: s.max_gap,
            mean_gap: s.mean_gap,
            wait_ms_total: s.wait_ms_total,
            wait_ms_p99: s.wait_ms_p99,
            param_age_ms_mean: s.param_age_ms_mean,
            advances: s.advances,
        }
    }
}

impl From<WorkerStatus> for pb::WorkerStatus {
    fn from(w: WorkerStatus) -> Self {
        Self {
            worker_id: w.worker_id,
            name: w.name,
            live: w.live,
            clock: w.clock,
            data_shards: w.data_shards,
            batch_size: w.batch_size,
            examples_per_sec: w.examples_per_sec,
            staleness: Some(w.staleness.into()),
        }
    }
}

impl From<pb::WorkerStatus> for WorkerStatus {
    fn from(w: pb::WorkerStatus) -> Self {
        Self {
            worker_id: w.worker_id,
            name: w.name,
            live: w.live,
            clock: w.clock,
            data_shards: w.data_shards,
            batch_size: w.batch_size,
            examples_per_sec: w.examples_per_sec,
            staleness: w.staleness.unwrap_or_default().into(),
        }
    }
}

impl From<JobStatus> for pb::JobStatus {
    fn from(j: JobStatus) -> Self {
        Self {
            spec: Some((&j.spec).into()),
            state: pb::JobState::from(j.state) as i32,
            message: j.message,
            min_clock: j.min_clock,
            max_clock: j.max_clock,
            map_epoch: j.map_epoch,
            workers: j.workers.into_iter().map(Into::into).collect(),
            staleness: Some(j.staleness.into()),
            latest_checkpoint: j.latest_checkpoint.unwrap_or_default(),
            advances_per_sec: j.advances_per_sec,
            cost: Some(j.cost.into()),
        }
    }
}

impl TryFrom<pb::JobStatus> for JobStatus {
    type Error = ValidationError;

    fn try_from(j: pb::JobStatus) -> Result<Self, Self::Error> {
        let spec = j
            .spec
            .ok_or_else(|| ValidationError::new("spec", "is missing"))
            .and_then(|s| JobSpec::try_from(s).map_err(|e| e.within("spec")))?;
        Ok(Self {
            spec,
            state: JobState::try_from(j.state)?,
            message: j.message,
            min_clock: j.min_clock,
            max_clock: j.max_clock,
            map_epoch: j.map_epoch,
            workers: j.workers.into_iter().map(Into::into).collect(),
            staleness: j.staleness.unwrap_or_default().into(),
            latest_checkpoint: (!j.latest_checkpoint.is_empty()).then_some(j.latest_checkpoint),
            advances_per_sec: j.advances_per_sec,
            cost: j.cost.unwrap_or_default().into(),
        })
    }
}

impl From<ShardCheckpointRef> for pb::ShardCheckpointRef {
    fn from(s: ShardCheckpointRef) -> Self {
        Self {
            shard_index: s.shard_index,
            endpoint: s.endpoint,
            name: s.name,
            path: s.path,
            files: s.files,
            bytes: s.bytes,
            sequence: s.sequence,
        }
    }
}

impl From<pb::ShardCheckpointRef> for ShardCheckpointRef {
    fn from(s: pb::ShardCheckpointRef) -> Self {
        Self {
            shard_index: s.shard_index,
            endpoint: s.endpoint,
            name: s.name,
            path: s.path,
            files: s.files,
            bytes: s.bytes,
            sequence: s.sequence,
        }
    }
}

impl From<JobCheckpoint> for pb::JobCheckpoint {
    fn from(c: JobCheckpoint) -> Self {
        Self {
            job: c.job,
            name: c.name,
            clock: c.clock,
            created_unix_ms: c.created_unix_ms,
            map_epoch: c.map_epoch,
            shards: c.shards.into_iter().map(Into::into).collect(),
        }
    }
}

impl From<pb::JobCheckpoint> for JobCheckpoint {
    fn from(c: pb::JobCheckpoint) -> Self {
        Self {
            job: c.job,
            name: c.name,
            clock: c.clock,
            created_unix_ms: c.created_unix_ms,
            map_epoch: c.map_epoch,
            shards: c.shards.into_iter().map(Into::into).collect(),
        }
    }
}

impl From<ShardMap> for pb::ShardMap {
    fn from(m: ShardMap) -> Self {
        Self {
            epoch: m.epoch,
            num_shards: m.num_shards,
            virtual_nodes: m.virtual_nodes,
            endpoints: m.endpoints,
            complete: m.complete,
        }
    }
}

impl TryFrom<pb::ShardMap> for ShardMap {
    type Error = ValidationError;

    fn try_from(m: pb::ShardMap) -> Result<Self, Self::Error> {
        if m.endpoints.len() != m.num_shards as usize {
            return Err(ValidationError::new(
                "endpoints",
                format!(
                    "{} endpoints for {} shards",
                    m.endpoints.len(),
                    m.num_shards
                ),
            ));
        }
        Ok(Self {
            epoch: m.epoch,
            num_shards: m.num_shards,
            virtual_nodes: m.virtual_nodes,
            complete: m.complete && m.endpoints.iter().all(|e| !e.is_empty()),
            endpoints: m.endpoints,
        })
    }
}

impl From<TableStats> for pb::TableStats {
    fn from(t: TableStats) -> Self {
        Self {
            name: t.name,
            rows: t.rows,
            pushes: t.pushes,
            pulls: t.pulls,
            values_pushed: t.values_pushed,
            values_pulled: t.values_pulled,
            load_error: t.load_error,
            memory_bytes: t.memory_bytes,
            cpu_seconds: t.cpu_seconds,
            bytes_received: t.bytes_received,
            bytes_sent: t.bytes_sent,
            cached_rows: t.cached_rows,
            rows_admitted: t.rows_admitted,
            rows_held_back: t.rows_held_back,
            rows_expired: t.rows_expired,
            rows_capped: t.rows_capped,
        }
    }
}

impl From<pb::TableStats> for TableStats {
    fn from(t: pb::TableStats) -> Self {
        Self {
            name: t.name,
            rows: t.rows,
            pushes: t.pushes,
            pulls: t.pulls,
            values_pushed: t.values_pushed,
            values_pulled: t.values_pulled,
            load_error: t.load_error,
            memory_bytes: t.memory_bytes,
            cpu_seconds: t.cpu_seconds,
            bytes_received: t.bytes_received,
            bytes_sent: t.bytes_sent,
            cached_rows: t.cached_rows,
            rows_admitted: t.rows_admitted,
            rows_held_back: t.rows_held_back,
            rows_expired: t.rows_expired,
            rows_capped: t.rows_capped,
        }
    }
}

impl From<ShardStats> for pb::GetStatsResponse {
    fn from(s: ShardStats) -> Self {
        Self {
            shard_index: s.shard_index,
            num_shards: s.num_shards,
            uptime_ms: s.uptime_ms,
            pushes_applied: s.pushes_applied,
            pushes_duplicate: s.pushes_duplicate,
            write_batches: s.write_batches,
            bytes_written: s.bytes_written,
            live_data_bytes: s.live_data_bytes,
            tables: s.tables.into_iter().map(Into::into).collect(),
            bulk_calls: s.bulk_calls,
            memory_bytes: s.memory_bytes,
            memory_budget_bytes: s.memory_budget_bytes,
            cache_bytes: s.cache_bytes,
            cache_budget_bytes: s.cache_budget_bytes,
            cache_hits: s.cache_hits,
            cache_misses: s.cache_misses,
            cache_evictions: s.cache_evictions,
        }
    }
}

impl From<pb::GetStatsResponse> for ShardStats {
    fn from(s: pb::GetStatsResponse) -> Self {
        Self {
            shard_index: s.shard_index,
            num_shards: s.num_shards,
            uptime_ms: s.uptime_ms,
            pushes_applied: s.pushes_applied,
            pushes_duplicate: s.pushes_duplicate,
            write_batches: s.write_batches,
            bytes_written: s.bytes_written,
            live_data_bytes: s.live_data_bytes,
            tables: s.tables.into_iter().map(Into::into).collect(),
            bulk_calls: s.bulk_calls,
            memory_bytes: s.memory_bytes,
            memory_budget_bytes: s.memory_budget_bytes,
            cache_bytes: s.cache_bytes,
            cache_budget_bytes: s.cache_budget_bytes,
            cache_hits: s.cache_hits,
            cache_misses: s.cache_misses,
            cache_evictions: s.cache_evictions,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shard_map_with_a_missing_endpoint_is_not_complete_and_a_short_one_is_refused() {
        let m = ShardMap::try_from(pb::ShardMap {
            epoch: 3,
            num_shards: 2,
            virtual_nodes: 128,
            endpoints: vec!["http://a:1".into(), String::new()],
            complete: true,
        })
        .unwrap();
        assert!(!m.complete);
        let e = ShardMap::try_from(pb::ShardMap {
            num_shards: 3,
            endpoints: vec!["http://a:1".into()],
            ..Default::default()
        })
        .unwrap_err();
        assert_eq!(e.field, "endpoints");
        assert!(JobState::try_from(99).is_err());
        for s in [JobState::Waiting, JobState::Failed] {
            assert_eq!(JobState::try_from(pb::JobState::from(s) as i32), Ok(s));
        }
    }
}
