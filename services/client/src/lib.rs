//! The Rust client SDK of the parameter-server cluster.
//!
//! [`PsClient`] connects to every shard, checks that the list matches the cluster, and then
//! routes each push and pull with the same partitioner the shards enforce: dense tensors are cut
//! into their table's chunks and sent to the owning shards in requests of bounded size, sparse
//! ids are grouped by owner; requests fan out concurrently and answers are reassembled in order.
//!
//! Every push carries this client's id and a fresh sequence number. A push that fails with
//! `unavailable` or a transport error (a shard restarting, a dropped connection) is retried with
//! backoff under the *same* sequence number, so the shard applies it exactly once.
//!
//! ```no_run
//! # async fn demo() -> Result<(), ps_client::ClientError> {
//! use ps_client::{ClientConfig, PsClient};
//! use ps_core::{Optimizer, TableSpec};
//!
//! let ps = PsClient::connect(ClientConfig::new(["http://127.0.0.1:7070"])).await?;
//! let spec = TableSpec::dense("w", &[784, 10]).unwrap().with_optimizer(Optimizer::sgd(0.1)).unwrap();
//! ps.create_table(spec).await?;
//! ps.push_dense("w", &vec![0.01; 7840]).await?;
//! let w = ps.pull_dense("w").await?;
//! assert_eq!(w.len(), 7840);
//! # Ok(()) }
//! ```

#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used))]

mod admin;
pub mod auth;
mod bulk;
mod compress;
mod config;
mod delta;
mod dense;
mod error;
mod held;
mod link;
mod model;
mod push;
pub mod scheduler;
mod seq;
mod sparse;
pub mod tls;
pub mod trace;
mod transport;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::RwLock;
use ps_core::Partitioner;
use ps_proto::v1 as pb;

pub use admin::ExportStream;
pub use auth::{Credentials, Token};
use compress::Codecs;
pub use compress::{TableCodec, WORTH_COMPRESSING, push_floor};
pub use config::{ClientConfig, MapSource};
pub use error::ClientError;
pub use link::{Link, LinkChannel};
pub use model::{Deleted, PushSummary, ShardCheckpoint, ShardInfo};
pub use ps_codec::{Codec, CompressOptions, Lz4Policy, PullCodec, SparseValues};
pub use ps_core::status::{ShardStats, TableStats};
use seq::SeqTracker;
use transport::{Inner, Shard, bulk_pool, shard_client};

/// A connection to every shard of a cluster. Cheap to clone; safe to share between tasks.
#[derive(Debug, Clone)]
pub struct PsClient {
    inner: Arc<Inner>,
}

impl PsClient {
    /// Connects to every shard and checks that shard `i` of the list says it is shard `i` of
    /// `endpoints.len()`.
    pub async fn connect(cfg: ClientConfig) -> Result<Self, ClientError> {
        if cfg.endpoints.is_empty() {
            return Err(ClientError::InvalidInput("no shard endpoints given".into()));
        }
        cfg.codec.check()?;
        for mbps in [cfg.link_mbps, cfg.link_speed_mbps].into_iter().flatten() {
            if !(mbps > 0.0 && mbps.is_finite()) {
                return Err(ClientError::InvalidInput(format!(
                    "link speed {mbps} Mbit/s is not a positive number"
                )));
            }
        }
        let link = cfg.link_mbps.map(|m| Arc::new(Link::mbps(m)));
        let shards = cfg
            .endpoints
            .iter()
            .map(|ep| {
                Ok(Shard {
                    endpoint: ep.clone(),
                    grpc: shard_client(&cfg, link.clone(), ep)?,
                    bulk: None,
                })
            })
            .collect::<Result<Vec<_>, ClientError>>()?;
        let client_id = cfg
            .client_id
            .unwrap_or_else(|| rand::random::<u64>().max(1));
        let mut this = Inner {
            partitioner: Partitioner::new(shards.len() as u32, 1),
            infos: Vec::new(),
            num_shards: shards.len(),
            shards: RwLock::new(shards),
            refreshing: tokio::sync::Mutex::new(()),
            client_id,
            seqs: SeqTracker::default(),
            specs: RwLock::new(HashMap::new()),
            codecs: Codecs::new(
                cfg.codec,
                client_id,
                compress::push_floor(cfg.link_speed_mbps.or(cfg.link_mbps)),
            ),
            map_epoch: AtomicU64::new(cfg.map_epoch),
            link,
            cfg,
            encode_nanos: AtomicU64::new(0),
            pulled_wire: AtomicU64::new(0),
            pulled_raw: AtomicU64::new(0),
            pull_asked: AtomicU64::new(0),
            rows_unchanged: AtomicU64::new(0),
            clock: AtomicU64::new(u64::MAX),
        };
        let n = this.num_shards;
        let infos = this
            .all(|mut c, _| async move { c.shard_info(pb::ShardInfoRequest {}).await })
            .await?;
        let mut vnodes = None;
        for (i, (ep, info)) in this.cfg.endpoints.iter().zip(&infos).enumerate() {
            if info.shard_index as usize != i || info.num_shards as usize != n {
                return Err(ClientError::Topology(format!(
                    "{ep} is shard {} of {}, but it is listed as shard {i} of {n}; list the shards in \
                     index order, all of them",
                    info.shard_index, info.num_shards
                )));
            }
            if *vnodes.get_or_insert(info.virtual_nodes) != info.virtual_nodes {
                return Err(ClientError::Topology(format!(
                    "{ep} uses {} virtual nodes but shard 0 uses {vnodes:?}; the shards disagree on routing",
                    info.virtual_nodes
                )));
            }
        }
        this.partitioner = Partitioner::new(n as u32, vnodes.unwrap_or(1));
        this.infos = infos
            .into_iter()
            .zip(&this.cfg.endpoints)
            .map(|(i, ep)| ShardInfo {
                endpoint: ep.clone(),
                shard_index: i.shard_index,
                num_shards: i.num_shards,
                durable: i.durable,
                max_request_bytes: i.max_request_bytes,
                server_version: i.server_version,
                bulk_port: u16::try_from(i.bulk_port).unwrap_or(0),
                cache_budget_bytes: i.cache_budget_bytes,
            })
            .collect();
        for (shard, info) in this.shards.get_mut().iter_mut().zip(&this.infos) {
            if info.bulk_port != 0 {
                shard.bulk = bulk_pool(
                    &this.cfg,
                    this.link.as_ref(),
                    &info.endpoint,
                    Some(info.bulk_port),
                );
            }
        }
        // Never build a request the smallest server limit would refuse (leave room for framing).
        let server_limit = this
            .infos
            .iter()
            .map(|i| i.max_request_bytes)
            .min()
            .unwrap_or(u64::MAX);
        let server_limit =
            usize::try_from(server_limit.saturating_sub(64 << 10)).unwrap_or(usize::MAX);
        this.cfg.max_request_bytes = this.cfg.max_request_bytes.min(server_limit).max(4096);
        Ok(Self {
            inner: Arc::new(this),
        })
    }

    /// This client's id, as carried by its pushes.
    pub fn client_id(&self) -> u64 {
        self.inner.client_id
    }

    pub fn shards(&self) -> &[ShardInfo] {
        &self.inner.infos
    }

    pub fn partitioner(&self) -> &Partitioner {
        &self.inner.partitioner
    }

    /// Time this client has spent encoding pushes, dense and sparse (grouping rows by shard,
    /// the codec and its error feedback), over its life: what a training step spends on
    /// compression.
    pub fn encode_time(&self) -> std::time::Duration {
        std::time::Duration::from_nanos(self.inner.encode_nanos.load(Ordering::Relaxed))
    }

    /// Bytes of values this client has pulled, dense and sparse, over its life: on the wire
    /// (after the table's pull codec) and as f32.
    pub fn pulled_bytes(&self) -> (u64, u64) {
        (
            self.inner.pulled_wire.load(Ordering::Relaxed),
            self.inner.pulled_raw.load(Ordering::Relaxed),
        )
    }

    /// Bytes of the pull requests this client has sent, over its life: what asking costs the
    /// uplink (a sparse pull's ids and held rows' digests above all). Each request is counted
    /// once, as encoded, however many times it was sent.
    pub fn pull_request_bytes(&self) -> u64 {
        self.inner.pull_asked.load(Ordering::Relaxed)
    }

    /// Rows this client's sparse pulls found unchanged since it last pulled them, over its
    /// life: rows it held ([`ClientConfig::held_rows_mib`]) and did not get again.
    pub fn rows_unchanged(&self) -> u64 {
        self.inner.rows_unchanged.load(Ordering::Relaxed)
    }

    /// Sets the job clock this client's sparse pushes carry from now on (tables with
    /// `ttl_clocks` age their rows by it).
    pub fn set_clock(&self, clock: u64) {
        self.inner.clock.store(clock, Ordering::Relaxed);
    }

    /// The shard-map epoch this client routes with (0 when no scheduler manages the map).
    pub fn map_epoch(&self) -> u64 {
        self.inner.map_epoch.load(Ordering::Relaxed)
    }

    /// Routes with map `epoch` from now on (after the scheduler published a new map with the
    /// same endpoints; a map with other endpoints needs a new client).
    pub fn set_map_epoch(&self, epoch: u64) {
        self.inner.map_epoch.store(epoch, Ordering::Relaxed);
    }
}
