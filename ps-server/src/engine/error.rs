//! What the engine refuses or fails at, by meaning. The gRPC edge maps every variant to one
//! status code and a `google.rpc.ErrorInfo` reason (`crate::status`), so a client tells a
//! stale map from a bad payload without reading the message.

use ps_core::{Encoding, TableName, ValidationError};

use crate::push_log::PushLogError;
use crate::store::StoreError;

/// The engine's errors.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// A field of the request is malformed, out of its range or inconsistent with another.
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    /// A payload does not decode exactly as its header says.
    #[error("`{field}`: the {encoding} payload does not decode: {reason}")]
    Decode {
        field: String,
        encoding: Encoding,
        reason: String,
    },
    /// A gradient holds a NaN or infinity and its table rejects them.
    #[error(
        "{at} holds a NaN or infinity; table `{table}` rejects non-finite gradients (create it \
         with non_finite = SKIP to drop such {unit} instead)"
    )]
    NonFinite {
        table: TableName,
        /// Where, in words: `row 3 (id 17) at value 2`, `slices[0] at element 9 of the tensor`.
        at: String,
        /// What SKIP would drop: rows or chunks.
        unit: &'static str,
    },
    #[error("table `{table}` does not exist on this shard; create it first")]
    NoSuchTable { table: TableName },
    #[error("table `{table}` was dropped while the push was queued")]
    TableDropped { table: TableName },
    #[error(
        "table `{table}` already exists with a different spec ({difference}); drop it first or \
         use another name"
    )]
    TableExists {
        table: TableName,
        difference: String,
    },
    /// A dense call on a sparse table, or the reverse.
    #[error("table `{table}` is {kind}; use {use_instead}")]
    WrongKind {
        table: TableName,
        kind: &'static str,
        use_instead: &'static str,
    },
    #[error("chunk {chunk} is out of range: table `{table}` has {chunks} chunks (0..{chunks})")]
    ChunkOutOfRange {
        table: TableName,
        chunk: u64,
        chunks: u64,
    },
    /// A key routed to this shard that another shard owns.
    #[error(
        "{key} belongs to shard {owner}, but this is shard {shard} of {shards}: the client's \
         shard list does not match the cluster"
    )]
    NotOwner {
        key: String,
        owner: u32,
        shard: u32,
        shards: u32,
    },
    /// The request was routed with an older shard map than this shard's.
    #[error(
        "stale shard map: the request was routed with epoch {request}, this shard is at epoch \
         {current}; fetch the shard map from the scheduler and retry"
    )]
    StaleMap { request: u64, current: u64 },
    /// The request was routed with a newer shard map than this shard has heard of (yet).
    #[error("this shard is at map epoch {current} and has not seen epoch {request} yet; retry")]
    MapAhead { request: u64, current: u64 },
    #[error(
        "this shard has not registered with a scheduler yet (request map epoch {request}); retry"
    )]
    NotRegistered { request: u64 },
    /// A request routed with a map epoch to a shard that no scheduler manages.
    #[error(
        "this shard has no scheduler (its shard map is static, epoch 0) but the request was \
         routed with map epoch {request}; route with epoch 0 or start the shard with --scheduler"
    )]
    NoScheduler { request: u64 },
    /// The call would take more memory than the shard holds for it; nothing was allocated.
    #[error("{what} needs {needed} bytes, over the {limit_name} of {limit} bytes; {hint}")]
    OverLimit {
        what: String,
        /// What the limit is called (`memory budget left`, `answer limit`, ...).
        limit_name: &'static str,
        needed: u64,
        limit: u64,
        hint: &'static str,
    },
    /// The table is in the store but was not loaded at start-up.
    #[error(
        "table `{table}` is stored on this shard but was not loaded at start-up ({cause}); drop \
         it, or restart the shard with a larger --memory-budget-bytes"
    )]
    TableNotLoaded { table: TableName, cause: String },
    /// A checkpoint's files do not match its manifest.
    #[error("checkpoint `{name}` is damaged: {cause}")]
    CheckpointDamaged { name: String, cause: String },
    #[error("the shard is shutting down")]
    ShuttingDown,
    /// A write failed: memory may be ahead of disk, so nothing more is written until a restart.
    #[error(
        "a write to the shard's store failed ({cause}); the shard is read-only until restarted"
    )]
    ReadOnly { cause: String },
    #[error("an in-memory shard has no durable state to checkpoint or restore")]
    NotDurable,
    #[error("this shard has no checkpoint named `{name}`")]
    NoSuchCheckpoint { name: String },
    #[error("checkpoint `{name}` is in use ({what}); retry once that is done")]
    CheckpointInUse { name: String, what: &'static str },
    #[error("checkpoint `{name}` already exists at {path}")]
    CheckpointExists { name: String, path: String },
    /// Writing or installing a checkpoint failed (the shard's state is unchanged).
    #[error("checkpoint `{name}`: {cause}")]
    Checkpoint { name: String, cause: String },
    /// This data directory was written by another shard of the cluster.
    #[error(
        "this data directory belongs to shard {stored}, not shard {me}; start with the matching \
         flags or another --data-dir"
    )]
    WrongIdentity { stored: String, me: String },
    /// An owned chunk missing from the hot layer: a bug, never the caller's fault.
    #[error("chunk {chunk} of `{table}` is this shard's but is not loaded")]
    ChunkNotLoaded { table: TableName, chunk: u64 },
    #[error("storage: {0}")]
    Store(#[from] StoreError),
    #[error("push log: {0}")]
    PushLog(#[from] PushLogError),
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;
