//! Domain types shared by every service and client of the parameter-server cluster.
//!
//! Wire messages (`ps_proto::v1`) are converted into these types once, at the service edge, with
//! `TryFrom` conversions that validate everything a peer could get wrong. Past that edge no field
//! is optional and no value is unchecked.
//!
//! - [`table`]: table specs, optimizers, initializers.
//! - [`payload`]: encoded value vectors, checked against their headers (the encodings are
//!   `ps-codec`'s).
//! - [`partition`]: the partitioner that clients and shards use identically.
//! - [`request`]: validated push and pull requests.
//! - [`job`]: job specs (tables, consistency model, workers, checkpoints), from the wire or TOML.
//! - [`export`]: the parts of a checkpoint's export for serving.
//! - [`hash`]: the stable hash functions the partitioner and initializers are built on.

#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used))]

#[cfg(target_endian = "big")]
compile_error!(
    "payloads and stored values are little-endian f32; big-endian targets are not supported"
);

pub mod error;
pub mod export;
pub mod hash;
pub mod init;
pub mod job;
pub mod optim;
pub mod partition;
pub mod payload;
pub mod request;
pub mod status;
pub mod table;

pub use error::ValidationError;
pub use export::ExportPart;
pub use job::{Consistency, JobSpec, JobTable};
pub use partition::Partitioner;
pub use payload::{Encoding, Payload};
pub use request::{
    Held, MAX_PULL_ALSO, PullDense, PullSparse, PullSparseAlso, PushDense, PushId, PushSparse,
};
pub use table::{
    DenseShape, Initializer, InitializerKind, NonFinitePolicy, Optimizer, TableKind, TableName,
    TableSpec,
};

/// What servers and clients of the wire protocol agree on beyond the messages.
pub mod wire {
    /// HTTP/2 flow-control windows that servers and clients both set: a 64 MiB tensor must not
    /// trickle through the default 64 KiB windows.
    pub const STREAM_WINDOW: u32 = 16 << 20;
    pub const CONNECTION_WINDOW: u32 = 64 << 20;

    /// How clients find a connection whose peer went silent (a network partition, a host that
    /// vanished, a container disconnected from its network) rather than waiting on it for the
    /// kernel's retransmission timeout, many minutes: an HTTP/2 PING (gRPC) or a TCP keepalive
    /// probe (the bulk stream) after this much silence...
    pub const KEEPALIVE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);
    /// ...and the connection is given up when the answer has not come within this. Calls on it
    /// fail as `unavailable`, and the clients retry on a new connection.
    pub const KEEPALIVE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

    /// The `domain` of the `google.rpc.ErrorInfo` every refusal of the services carries.
    pub const ERROR_DOMAIN: &str = "ps.v1";

    /// `google.rpc.ErrorInfo.reason` of each refusal: what went wrong, for any client to act
    /// on without reading the message. The metadata keys each one carries are listed with it.
    /// These strings are part of the API (`ps.proto` lists them too).
    pub mod reason {
        /// A request field is malformed or out of its range (`field`; a `google.rpc.BadRequest`
        /// names it too).
        pub const INVALID_FIELD: &str = "INVALID_FIELD";
        /// A payload does not decode as its header says (`field`, `encoding`).
        pub const UNDECODABLE_PAYLOAD: &str = "UNDECODABLE_PAYLOAD";
        /// A gradient holds NaN or infinity and its table rejects them (`table`).
        pub const NON_FINITE: &str = "NON_FINITE";
        /// No such table on this shard (`table`).
        pub const TABLE_NOT_FOUND: &str = "TABLE_NOT_FOUND";
        /// The table exists with another spec (`table`).
        pub const TABLE_SPEC_CONFLICT: &str = "TABLE_SPEC_CONFLICT";
        /// A dense call on a sparse table or the reverse (`table`, `kind`).
        pub const WRONG_TABLE_KIND: &str = "WRONG_TABLE_KIND";
        /// A dense chunk past the end of its table (`table`, `chunk`, `chunks`).
        pub const CHUNK_OUT_OF_RANGE: &str = "CHUNK_OUT_OF_RANGE";
        /// A key this shard does not own (`owner`, `shard`, `shards`): the client's shard
        /// list does not match the cluster.
        pub const NOT_OWNER: &str = "NOT_OWNER";
        /// Routed with an older shard map than the shard's (`request_epoch`,
        /// `current_epoch`): fetch the map and retry.
        pub const STALE_MAP: &str = "STALE_MAP";
        /// Routed with a newer shard map than the shard has heard of (`request_epoch`,
        /// `current_epoch`): retry.
        pub const MAP_AHEAD: &str = "MAP_AHEAD";
        /// A shard that has not registered with its scheduler yet (`request_epoch`): retry.
        pub const NOT_REGISTERED: &str = "NOT_REGISTERED";
        /// The service is shutting down: retry elsewhere or later.
        pub const SHUTTING_DOWN: &str = "SHUTTING_DOWN";
        /// A write to the shard's store failed; it refuses writes until restarted.
        pub const READ_ONLY: &str = "READ_ONLY";
        /// The call needs durable state and the shard keeps none (in-memory).
        pub const NOT_DURABLE: &str = "NOT_DURABLE";
        /// No such checkpoint (`checkpoint`).
        pub const CHECKPOINT_NOT_FOUND: &str = "CHECKPOINT_NOT_FOUND";
        /// A checkpoint of that name exists (`checkpoint`).
        pub const CHECKPOINT_EXISTS: &str = "CHECKPOINT_EXISTS";
        /// A request over the server's size limit (`limit_bytes`).
        pub const REQUEST_TOO_LARGE: &str = "REQUEST_TOO_LARGE";
        /// The call would take more memory than the service holds for it (`resource`,
        /// `needed_bytes`, `limit_bytes`): a table over the shard's memory budget, a pull
        /// whose answer is over the answer limit, a push that decodes to more than the queue
        /// holds. Ask for less per call, or raise the limit.
        pub const RESOURCE_LIMIT: &str = "RESOURCE_LIMIT";
        /// The shard found the table in its store but could not load it at start-up
        /// (`table`): drop it, or restart the shard with more memory.
        pub const TABLE_NOT_LOADED: &str = "TABLE_NOT_LOADED";
        /// A request routed with a shard-map epoch to a shard that no scheduler manages
        /// (`request_epoch`): route with epoch 0, or start the shard with --scheduler.
        pub const NO_SCHEDULER: &str = "NO_SCHEDULER";
        /// A checkpoint whose files do not match its manifest (`checkpoint`).
        pub const CHECKPOINT_DAMAGED: &str = "CHECKPOINT_DAMAGED";
        /// A checkpoint an export or a restore reads, or one being written (`checkpoint`):
        /// retry once it is done.
        pub const CHECKPOINT_IN_USE: &str = "CHECKPOINT_IN_USE";
        /// A bulk-stream call the stream does not carry (encoded payloads, delta pulls,
        /// unknown methods): use gRPC.
        pub const NOT_ON_BULK_STREAM: &str = "NOT_ON_BULK_STREAM";
        /// The service failed inside (storage, a checkpoint's files): not the caller's fault.
        pub const INTERNAL: &str = "INTERNAL";
        /// No such job (`job`).
        pub const JOB_NOT_FOUND: &str = "JOB_NOT_FOUND";
        /// A job of that name exists with another spec (`job`).
        pub const JOB_EXISTS: &str = "JOB_EXISTS";
        /// The worker is not a live member of the job (`job`, `worker_id`): join again.
        pub const NOT_A_MEMBER: &str = "NOT_A_MEMBER";
        /// The job's state does not allow the call (`job`, `state`).
        pub const JOB_STATE: &str = "JOB_STATE";
        /// A clock report for another clock than the worker's next (`job`, `worker_id`,
        /// `clock`, `reported`).
        pub const CLOCK_OUT_OF_ORDER: &str = "CLOCK_OUT_OF_ORDER";
        /// A shard registration (or a checkpoint) that contradicts the cluster (`shard`).
        pub const SHARD_CONFLICT: &str = "SHARD_CONFLICT";
        /// A shard registered an address the scheduler cannot connect to (`endpoint`).
        pub const SHARD_UNREACHABLE: &str = "SHARD_UNREACHABLE";
        /// A heartbeat of a shard the scheduler does not know (`shard`): register again.
        pub const SHARD_NOT_REGISTERED: &str = "SHARD_NOT_REGISTERED";
        /// The scheduler cannot reach every shard (`action`): retry.
        pub const SHARDS_UNAVAILABLE: &str = "SHARDS_UNAVAILABLE";
        /// A wait for the workers (a checkpoint's boundary) ran out of time (`job`).
        pub const TIMED_OUT: &str = "TIMED_OUT";
        /// A worker id or a shard slot held by another caller (`holder`): take your own.
        pub const NOT_YOURS: &str = "NOT_YOURS";
        /// A caller over its own limit of calls in flight or per second (`caller`, `limit`):
        /// retry after a pause; the limits of the other callers are theirs.
        pub const CALLER_LIMIT: &str = "CALLER_LIMIT";
    }
}
