//! How a client reaches the cluster and behaves when it misbehaves.

use std::sync::Arc;
use std::time::Duration;

use crate::{ClientError, TableCodec};

/// How to reach the cluster and how to behave when it misbehaves.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Shard endpoints in shard-index order (`http://host:port`).
    pub endpoints: Vec<String>,
    /// This client's id for exactly-once pushes; random when `None`.
    pub client_id: Option<u64>,
    /// Largest request (or answer) the client builds, in bytes of values. The default, 1 MiB,
    /// is one chunk of a dense table at the default chunk size: a tensor of several chunks
    /// goes as that many requests in flight at once, over as many connections, so a shard
    /// reads one while it logs and applies another. Against 4 MiB (`ps-bench --request-kib`,
    /// durable, 3 interleaved pairs): 1.29x at 1 M floats on one shard and one client, 1.20x at
    /// 16 M, 1.05-1.07x on 2 shards and 2 clients.
    pub max_request_bytes: usize,
    /// Requests in flight at once across all shards.
    pub max_in_flight: usize,
    /// Threads that drive one dense push (or push and pull) of several requests, when it
    /// is called from a task of a multi-thread tokio runtime: the calling thread, which then
    /// blocks its task until the call is done (`tokio::task::block_in_place`: the worker's
    /// other tasks move to another thread, and a timeout or `select!` around the call takes
    /// effect only once it returns), and `call_threads - 1` scoped threads beside it, the
    /// requests shared out among them. A single task copies every request's bytes to and
    /// from its sockets on one core at a time, which leaves a core idle while a shard on
    /// the same host waits for them. The default, 2; 1 keeps every call on its task.
    /// `ps-bench`, 1 M floats, one shard and one client on 2 cores, 5 interleaved rounds:
    /// durable fused steps 1.07x; see README's *What changed the figures*.
    pub call_threads: usize,
    /// Attempts for a call that fails with `unavailable` (1 = no retry).
    pub max_attempts: u32,
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
    pub connect_timeout: Duration,
    /// Deadline of each call; none when `None`.
    pub request_timeout: Option<Duration>,
    /// How tables travel unless [`PsClient::set_table_codec`] says otherwise: the job's default.
    pub codec: TableCodec,
    /// The shard-map epoch requests carry (from the scheduler; 0 = no scheduler). A shard on a
    /// newer map refuses them with `failed_precondition`: fetch the map and call
    /// [`PsClient::set_map_epoch`], or give a `map_source` and the client does it.
    pub map_epoch: u64,
    /// Where to learn the shard map again when a shard cannot be reached or refuses a request's
    /// epoch as stale: the client then reconnects to the shards that moved and retries (a push
    /// keeps its sequence number, so it is still applied once). Workers get the scheduler here.
    pub map_source: Option<Arc<dyn MapSource>>,
    /// Emulate a network link of this many megabits per second (each direction) for every
    /// request to and answer from the shards; see [`Link`]. `None`: the real network only.
    pub link_mbps: Option<f64>,
    /// The speed of the link to the shards in megabits per second, where it is known, for
    /// choosing what is worth compressing: a dense push whose plain f32 values would cross it
    /// in under [`crate::WORTH_COMPRESSING`] goes as f32 whatever its table's codec. `None`: the
    /// emulated link's speed (`link_mbps`), else only the codecs' own `min_values`.
    pub link_speed_mbps: Option<f64>,
    /// Send dense and sparse pushes (plain f32 as raw bytes; compressed ones of up to 1 MiB with
    /// their values in the call's header) and plain-f32 dense pulls over the shards' bulk
    /// streams (raw TCP, no HTTP/2 framing) where a shard offers one; everything else goes
    /// through gRPC either way. An emulated link paces both alike.
    pub bulk: bool,
    /// TLS and the bearer token for every connection to the shards (plaintext, none: default).
    pub credentials: crate::Credentials,
    /// Memory for the residuals of one sparse table's rows under a lossy codec, in MiB: past
    /// it, a row not pushed again for a while gives its residual up for a new row's
    /// ([`ps_codec::RowErrorFeedback`]; [`crate::PsClient::row_residuals`] counts them).
    pub row_residual_mib: usize,
    /// Memory for the rows of one sparse table this client keeps from its pulls, in MiB
    /// (0: none kept). A pull then tells the shards which rows it holds, by a digest of their
    /// values, and gets only the rows that changed; the rest come from here. Exact under any
    /// consistency model (rows are compared by value), for pulls whose codec rounds each row
    /// on its own (not int8 rows shorter than its block of 32 values). Past the limit, rows
    /// not asked for lately give their room up.
    pub held_rows_mib: usize,
}

/// A source of the current shard map (the scheduler, for workers).
pub trait MapSource: Send + Sync + std::fmt::Debug {
    /// The map's epoch and every shard's endpoint in index order (an empty string for a shard
    /// that is not registered now).
    fn current(&self) -> futures::future::BoxFuture<'_, Result<(u64, Vec<String>), ClientError>>;
}

impl ClientConfig {
    pub fn new<I, S>(endpoints: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            client_id: None,
            max_request_bytes: 1 << 20,
            max_in_flight: 16,
            call_threads: 2,
            max_attempts: 10,
            initial_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(5),
            request_timeout: None,
            codec: TableCodec::default(),
            map_epoch: 0,
            map_source: None,
            link_mbps: None,
            link_speed_mbps: None,
            bulk: true,
            credentials: crate::Credentials::default(),
            row_residual_mib: 256,
            held_rows_mib: 0,
        }
    }
}
