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
//! - [`hash`]: the stable hash functions the partitioner and initializers are built on.

#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used))]

#[cfg(target_endian = "big")]
compile_error!(
    "payloads and stored values are little-endian f32; big-endian targets are not supported"
);

pub mod error;
pub mod hash;
pub mod init;
pub mod job;
pub mod optim;
pub mod partition;
pub mod payload;
pub mod request;
pub mod table;

pub use error::ValidationError;
pub use job::{Consistency, JobSpec, JobTable};
pub use partition::Partitioner;
pub use payload::{Encoding, Payload};
pub use request::{PullDense, PullSparse, PushDense, PushId, PushSparse};
pub use table::{
    DenseShape, Initializer, InitializerKind, NonFinitePolicy, Optimizer, TableKind, TableName,
    TableSpec,
};

/// HTTP/2 flow-control windows that servers and clients both set: a 64 MiB tensor must not
/// trickle through the default 64 KiB windows.
pub mod wire {
    pub const STREAM_WINDOW: u32 = 16 << 20;
    pub const CONNECTION_WINDOW: u32 = 64 << 20;
    /// How a shard's `failed_precondition` answer to a request routed with an old shard-map
    /// epoch begins; clients that can fetch the map recognize it and retry on the new one.
    pub const STALE_MAP: &str = "stale shard map";
}
