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

mod bulk;
mod compress;
mod error;
mod link;
pub mod scheduler;
mod seq;

use std::collections::HashMap;
use std::future::Future;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::stream::{self, StreamExt, TryStreamExt};
use parking_lot::RwLock;
use ps_codec::{Encoded, RowErrorFeedback};
use ps_core::request::DenseSlice;
use ps_core::wire::{CONNECTION_WINDOW, STREAM_WINDOW};
use ps_core::{Partitioner, Payload, TableKind, TableName, TableSpec};
use ps_proto::v1 as pb;
use ps_proto::v1::parameter_server_client::ParameterServerClient;
use tonic::transport::Endpoint;

use bulk::BulkPool;
pub use compress::TableCodec;
use compress::{Codecs, Sender};
pub use error::ClientError;
pub use link::{Link, LinkChannel};
pub use ps_codec::{Codec, CompressOptions, Lz4Policy, SparseValues};
use seq::SeqTracker;

/// How to reach the cluster and how to behave when it misbehaves.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Shard endpoints in shard-index order (`http://host:port`).
    pub endpoints: Vec<String>,
    /// This client's id for exactly-once pushes; random when `None`.
    pub client_id: Option<u64>,
    /// Largest request (or answer) the client builds, in bytes of values.
    pub max_request_bytes: usize,
    /// Requests in flight at once across all shards.
    pub max_in_flight: usize,
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
    /// Send plain-f32 dense pushes and pulls over the shards' bulk streams (raw TCP, no HTTP/2
    /// framing) where a shard offers one; everything else goes through gRPC either way. Off
    /// with an emulated link, whose emulation is on the gRPC channel.
    pub bulk: bool,
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
            max_request_bytes: 4 << 20,
            max_in_flight: 16,
            max_attempts: 10,
            initial_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(5),
            request_timeout: None,
            codec: TableCodec::default(),
            map_epoch: 0,
            map_source: None,
            link_mbps: None,
            bulk: true,
        }
    }
}

/// A shard's identity as it reported it.
#[derive(Debug, Clone)]
pub struct ShardInfo {
    pub endpoint: String,
    pub shard_index: u32,
    pub num_shards: u32,
    pub durable: bool,
    pub max_request_bytes: u64,
    pub server_version: String,
    /// The shard's bulk-stream port; 0 when it has none.
    pub bulk_port: u16,
}

/// What a push did, summed over the shards it touched.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PushSummary {
    pub requests: u64,
    /// Requests a shard had already applied (a retry whose first answer was lost).
    pub duplicates: u64,
    pub applied_values: u64,
    pub skipped_non_finite: u64,
    /// Payload bytes sent (after the codec and lz4).
    pub wire_bytes: u64,
    /// What the same values take as f32.
    pub raw_bytes: u64,
}

impl PushSummary {
    fn add_payload(&mut self, e: &Encoded) {
        self.wire_bytes += e.data.len() as u64;
        self.raw_bytes += e.header.num_values * 4;
    }

    fn add(&mut self, r: &pb::PushResponse) {
        self.requests += 1;
        self.duplicates += u64::from(r.duplicate);
        self.applied_values += r.applied_values;
        self.skipped_non_finite += r.skipped_non_finite;
    }
}

/// A checkpoint taken on one shard.
#[derive(Debug, Clone)]
pub struct ShardCheckpoint {
    pub shard: usize,
    pub name: String,
    pub path: String,
    pub files: u64,
    pub bytes: u64,
    pub sequence: u64,
}

/// A connection to every shard of a cluster. Cheap to clone; safe to share between tasks.
#[derive(Debug, Clone)]
pub struct PsClient {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    cfg: ClientConfig,
    /// Each shard's endpoint and connections; replaced when the shard map moves a shard.
    shards: RwLock<Vec<Shard>>,
    num_shards: usize,
    /// One map refresh at a time.
    refreshing: tokio::sync::Mutex<()>,
    infos: Vec<ShardInfo>,
    partitioner: Partitioner,
    client_id: u64,
    seqs: SeqTracker,
    specs: RwLock<HashMap<TableName, TableSpec>>,
    codecs: Codecs,
    map_epoch: AtomicU64,
    /// The emulated link every shard connection shares, when one is set.
    link: Option<Arc<Link>>,
}

/// One shard's connections: gRPC, and its bulk stream when it offers one.
#[derive(Debug, Clone)]
struct Shard {
    endpoint: String,
    grpc: ParameterServerClient<LinkChannel>,
    bulk: Option<Arc<BulkPool>>,
}

impl Shard {
    /// The bulk stream, when this call may use it.
    fn bulk(&self) -> Option<&BulkPool> {
        self.bulk.as_deref().filter(|b| b.usable())
    }

    /// After the bulk port could not be reached: asks the shard for it again (a shard that
    /// restarted on a system-picked port has a new one). One cheap call, made only then.
    async fn rediscover_bulk(&mut self) {
        if let Some(b) = &self.bulk
            && b.wants_port()
            && let Ok(info) = self.grpc.shard_info(pb::ShardInfoRequest {}).await
        {
            b.set_port(u16::try_from(info.into_inner().bulk_port).unwrap_or(0));
        }
    }
}

fn table_name(name: &str) -> Result<TableName, ClientError> {
    TableName::try_from(name).map_err(|e| ClientError::InvalidInput(e.to_string()))
}

impl PsClient {
    /// Connects to every shard and checks that shard `i` of the list says it is shard `i` of
    /// `endpoints.len()`.
    pub async fn connect(cfg: ClientConfig) -> Result<Self, ClientError> {
        if cfg.endpoints.is_empty() {
            return Err(ClientError::InvalidInput("no shard endpoints given".into()));
        }
        cfg.codec.check()?;
        if let Some(mbps) = cfg.link_mbps
            && !(mbps > 0.0 && mbps.is_finite())
        {
            return Err(ClientError::InvalidInput(format!(
                "link speed {mbps} Mbit/s is not a positive number"
            )));
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
            codecs: Codecs::new(cfg.codec, client_id),
            map_epoch: AtomicU64::new(cfg.map_epoch),
            link,
            cfg,
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

    /// Sets how table `name` travels from now on: the codec of its pushes (with error feedback
    /// kept by this client when the codec is lossy) and the encoding of its pulls. A residual
    /// kept under the previous codec is dropped.
    pub fn set_table_codec(&self, name: &str, codec: TableCodec) -> Result<(), ClientError> {
        codec.check()?;
        self.inner.codecs.set(table_name(name)?, codec);
        Ok(())
    }

    /// Sets the ratio of table `name`'s top-k or random-k pushes from the next push on,
    /// keeping what its residual owes: for a sparsity warm-up, which sends a larger share in
    /// the first epochs. Any other codec is an `InvalidInput` error, as is a ratio outside
    /// (0, 1].
    pub fn set_push_ratio(&self, name: &str, ratio: f64) -> Result<(), ClientError> {
        self.inner.codecs.set_ratio(&table_name(name)?, ratio)
    }

    /// How table `name` travels.
    pub fn table_codec(&self, name: &str) -> Result<TableCodec, ClientError> {
        Ok(self.inner.codecs.get(&table_name(name)?).0)
    }

    /// What this client still owes dense table `name`: the part of its gradients that a lossy
    /// codec has not sent yet (error feedback adds it to the next push). Empty before the first
    /// lossy push.
    pub fn dense_residual(&self, name: &str) -> Result<Vec<f32>, ClientError> {
        let (_, sender) = self.inner.codecs.get(&table_name(name)?);
        Ok(sender.lock().dense.residual().to_vec())
    }

    /// What this client still owes row `id` of sparse table `name`, if anything.
    pub fn row_residual(&self, name: &str, id: u64) -> Result<Option<Vec<f32>>, ClientError> {
        let (_, sender) = self.inner.codecs.get(&table_name(name)?);
        let guard = sender.lock();
        Ok(guard
            .rows
            .as_ref()
            .and_then(|r| r.residual(id))
            .map(<[f32]>::to_vec))
    }

    /// Creates a table on every shard (idempotent: the same spec again is fine) and returns the
    /// spec as stored, defaults filled in.
    pub async fn create_table(&self, spec: TableSpec) -> Result<TableSpec, ClientError> {
        let req = pb::CreateTableRequest {
            spec: Some((&spec).into()),
        };
        let answers = self
            .inner
            .all(|mut c, _| {
                let req = req.clone();
                async move { c.create_table(req).await }
            })
            .await?;
        let stored = answers
            .into_iter()
            .next()
            .and_then(|a| a.spec)
            .ok_or_else(|| ClientError::Protocol("CreateTable answered without a spec".into()))?;
        let stored =
            TableSpec::try_from(stored).map_err(|e| ClientError::Protocol(e.to_string()))?;
        self.inner
            .specs
            .write()
            .insert(stored.name.clone(), stored.clone());
        Ok(stored)
    }

    /// The spec of table `name` (cached after the first call).
    pub async fn describe_table(&self, name: &str) -> Result<TableSpec, ClientError> {
        let name = table_name(name)?;
        if let Some(s) = self.inner.specs.read().get(&name) {
            return Ok(s.clone());
        }
        let req = pb::DescribeTableRequest {
            name: name.to_string(),
        };
        let resp = self
            .inner
            .call(0, |mut c, _| {
                let req = req.clone();
                async move { c.describe_table(req).await }
            })
            .await?;
        let spec = resp
            .spec
            .ok_or_else(|| ClientError::Protocol("DescribeTable answered without a spec".into()))?;
        let spec = TableSpec::try_from(spec).map_err(|e| ClientError::Protocol(e.to_string()))?;
        self.inner.specs.write().insert(name, spec.clone());
        Ok(spec)
    }

    pub async fn list_tables(&self) -> Result<Vec<TableSpec>, ClientError> {
        let resp = self
            .inner
            .call(0, |mut c, _| async move {
                c.list_tables(pb::ListTablesRequest {}).await
            })
            .await?;
        resp.tables
            .into_iter()
            .map(|t| TableSpec::try_from(t).map_err(|e| ClientError::Protocol(e.to_string())))
            .collect()
    }

    /// Drops table `name` on every shard.
    pub async fn drop_table(&self, name: &str) -> Result<(), ClientError> {
        let name = table_name(name)?;
        self.inner.specs.write().remove(&name);
        self.inner.codecs.forget(&name);
        let req = pb::DropTableRequest {
            name: name.to_string(),
        };
        self.inner
            .all(|mut c, _| {
                let req = req.clone();
                async move { c.drop_table(req).await }
            })
            .await?;
        Ok(())
    }

    async fn dense_spec(
        &self,
        name: &str,
    ) -> Result<(TableSpec, ps_core::DenseShape), ClientError> {
        let spec = self.describe_table(name).await?;
        match &spec.kind {
            TableKind::Dense(shape) => {
                let shape = shape.clone();
                Ok((spec, shape))
            }
            TableKind::Sparse { .. } => Err(ClientError::InvalidInput(format!(
                "table `{name}` is sparse; use push_sparse / pull_sparse"
            ))),
        }
    }

    async fn sparse_dim(&self, name: &str) -> Result<(TableSpec, usize), ClientError> {
        let spec = self.describe_table(name).await?;
        match spec.kind {
            TableKind::Sparse { dim } => Ok((spec, dim as usize)),
            TableKind::Dense(_) => Err(ClientError::InvalidInput(format!(
                "table `{name}` is dense; use push_dense / pull_dense"
            ))),
        }
    }

    /// Pushes a gradient for the whole dense tensor `name`.
    pub async fn push_dense(&self, name: &str, grad: &[f32]) -> Result<PushSummary, ClientError> {
        let (_, shape) = self.dense_spec(name).await?;
        if grad.len() as u64 != shape.len() {
            return Err(ClientError::InvalidInput(format!(
                "table `{name}` holds {} values (shape {:?}); the gradient has {}",
                shape.len(),
                shape.shape,
                grad.len()
            )));
        }
        self.push_dense_chunks(name, 0, grad).await
    }

    /// Pushes a gradient for the chunks starting at `first_chunk`; `grad` must cover whole
    /// chunks (the last chunk of the tensor may be short).
    pub async fn push_dense_chunks(
        &self,
        name: &str,
        first_chunk: u64,
        grad: &[f32],
    ) -> Result<PushSummary, ClientError> {
        let (spec, shape) = self.dense_spec(name).await?;
        // The chunks the gradient covers; it must end on a chunk boundary.
        let mut last = first_chunk;
        let mut covered = 0usize;
        while covered < grad.len() {
            let len = shape.chunk_len(last).ok_or_else(|| {
                ClientError::InvalidInput(format!(
                    "chunk {last} is past the end of `{name}` ({} chunks)",
                    shape.num_chunks()
                ))
            })?;
            covered += len;
            last += 1;
        }
        if covered != grad.len() {
            return Err(ClientError::InvalidInput(format!(
                "the gradient ends inside chunk {}: push whole chunks of {} values",
                last - 1,
                shape.chunk_elems
            )));
        }
        let base = first_chunk * shape.chunk_elems;
        let (codec, sender) = self.inner.codecs.get(&spec.name);
        let plan = self.plan_chunks(
            &spec,
            &shape,
            first_chunk..last,
            codec.push.codec.max_bytes_per_value(),
        );
        // Encode every slice under the table's lock (the residual is shared by this client's
        // pushes to the table), then send without it.
        let requests: Vec<(usize, Vec<EncodedSlice>)> = {
            let mut guard = sender.lock();
            let Sender { enc, dense, .. } = &mut *guard;
            let lossy = enc.options().keeps_residual();
            if lossy {
                dense
                    .accumulate_at(shape.len() as usize, base as usize, grad)
                    .map_err(|e| ClientError::InvalidInput(e.to_string()))?;
            }
            let mut requests = Vec::with_capacity(plan.len());
            for (shard, chunks) in plan {
                let mut slices = Vec::with_capacity(chunks.len());
                for c in chunks {
                    let Some(r) = shape.chunk_range(c) else {
                        continue;
                    };
                    let abs = r.start as usize..r.end as usize;
                    let e = if lossy {
                        dense
                            .take(enc, abs.clone())
                            .map_err(|e| ClientError::InvalidInput(e.to_string()))?
                    } else {
                        let rel = abs.start - base as usize..abs.end - base as usize;
                        enc.encode(&grad[rel])
                    };
                    slices.push((c, abs, e));
                }
                requests.push((shard, slices));
            }
            requests
        };
        let table = spec.name.to_string();
        let codec_name = codec.push.codec.to_string();
        // Owned wire requests: (index into `requests`, shard, slices).
        let calls: Vec<(usize, usize, Vec<pb::DenseSlice>)> = requests
            .iter()
            .enumerate()
            .map(|(i, (shard, slices))| {
                let slices = slices
                    .iter()
                    .map(|(c, _, e)| {
                        wire_metric("push", &table, &codec_name, e);
                        pb::DenseSlice {
                            chunk: *c,
                            values: Some(Payload::from(e.clone()).into()),
                        }
                    })
                    .collect();
                (i, *shard, slices)
            })
            .collect();
        let results = stream::iter(calls)
            .map(|(i, shard, slices)| {
                let table = table.clone();
                // Plain f32 travels by the bulk stream where the shard has one.
                let plain = slices
                    .iter()
                    .all(|s| s.values.as_ref().is_some_and(ps_proto::bulk::is_plain_f32));
                let call = self.inner.push(shard, move |mut s, push_id, map_epoch| {
                    let req = pb::PushDenseRequest {
                        table: table.clone(),
                        push_id: Some(push_id),
                        map_epoch,
                        slices: slices.clone(),
                    };
                    async move {
                        if plain
                            && let Some(bulk) = s.bulk()
                            && let Some(answer) = bulk.push_dense(req.clone()).await?
                        {
                            return Ok(answer);
                        }
                        s.rediscover_bulk().await;
                        s.grpc
                            .push_dense(req)
                            .await
                            .map(tonic::Response::into_inner)
                    }
                });
                async move { (i, call.await) }
            })
            .buffer_unordered(self.inner.cfg.max_in_flight)
            .collect::<Vec<_>>()
            .await;
        settle(
            results,
            |i| requests[i].1.iter().map(|(_, _, e)| e),
            |i| {
                let mut guard = sender.lock();
                if guard.lossy() {
                    for (_, range, sent) in &requests[i].1 {
                        let _ = guard.dense.restore(range.clone(), sent);
                    }
                }
            },
        )
    }

    /// Groups `chunks` by owning shard into requests of at most `max_request_bytes` each, for
    /// values of at most `bytes_per_value` bytes: (shard, chunks of one request).
    fn plan_chunks(
        &self,
        spec: &TableSpec,
        shape: &ps_core::DenseShape,
        chunks: Range<u64>,
        bytes_per_value: f64,
    ) -> Vec<(usize, Vec<u64>)> {
        let hash = spec.name.hash64();
        let max_values =
            ((self.inner.cfg.max_request_bytes as f64 / bytes_per_value.max(0.01)) as usize).max(1);
        let n = self.inner.num_shards;
        // Per shard: requests under construction, and the values in the last one.
        let mut per_shard: Vec<Vec<Vec<u64>>> = vec![Vec::new(); n];
        let mut fill = vec![usize::MAX; n];
        for c in chunks {
            let len = shape.chunk_len(c).unwrap_or(0);
            let s = self.inner.partitioner.shard_for_chunk(hash, c) as usize;
            if fill[s].saturating_add(len) > max_values {
                per_shard[s].push(Vec::new());
                fill[s] = 0;
            }
            if let Some(r) = per_shard[s].last_mut() {
                r.push(c);
            }
            fill[s] += len;
        }
        per_shard
            .into_iter()
            .enumerate()
            .flat_map(|(s, reqs)| reqs.into_iter().map(move |r| (s, r)))
            .collect()
    }

    /// Pulls the whole dense tensor `name`.
    pub async fn pull_dense(&self, name: &str) -> Result<Vec<f32>, ClientError> {
        let (_, shape) = self.dense_spec(name).await?;
        self.pull_dense_chunks(name, 0..shape.num_chunks()).await
    }

    /// Pulls chunks `chunks` of dense tensor `name`, concatenated.
    pub async fn pull_dense_chunks(
        &self,
        name: &str,
        chunks: Range<u64>,
    ) -> Result<Vec<f32>, ClientError> {
        let (spec, shape) = self.dense_spec(name).await?;
        if chunks.end > shape.num_chunks() || chunks.start > chunks.end {
            return Err(ClientError::InvalidInput(format!(
                "chunks {chunks:?} are out of range: `{name}` has {} chunks",
                shape.num_chunks()
            )));
        }
        let total: usize = chunks.clone().filter_map(|c| shape.chunk_len(c)).sum();
        let state = self.inner.codecs.state_of(&spec.name);
        if let Some(ratio) = state.codec.pull_delta {
            return self
                .pull_dense_delta(&spec, &shape, chunks, ratio, &state.replica)
                .await;
        }
        let accept = state.codec.pull;
        let bytes_per_value = state.codec.pull_bytes_per_value();
        let requests = self.plan_chunks(&spec, &shape, chunks.clone(), bytes_per_value);
        let table = spec.name.to_string();
        let mut out = vec![0.0f32; total];
        // Each chunk's place in `out`, handed to the request that pulls it: answers are
        // decoded (or, by the bulk stream, read) straight into the tensor.
        let mut places: Vec<Option<&mut [f32]>> = out
            .chunks_mut(
                usize::try_from(shape.chunk_elems)
                    .unwrap_or(usize::MAX)
                    .max(1),
            )
            .map(Some)
            .collect();
        let plain = accept == ps_core::Encoding::F32;
        let pulls = requests.into_iter().map(|(shard, chunks_of)| {
            let dsts: Vec<bulk::Dst<'_>> = chunks_of
                .iter()
                .map(|&c| {
                    let place = places
                        .get_mut((c - chunks.start) as usize)
                        .and_then(Option::take)
                        .unwrap_or_default();
                    (c, place)
                })
                .collect();
            let req = pb::PullDenseRequest {
                table: table.clone(),
                chunks: chunks_of,
                accept: ps_core::payload::encoding_to_pb(accept) as i32,
                map_epoch: 0,
                delta: None,
            };
            let dsts = tokio::sync::Mutex::new(dsts);
            async move {
                self.inner
                    .call_shard(shard, |mut s, map_epoch| {
                        let req = pb::PullDenseRequest {
                            map_epoch,
                            ..req.clone()
                        };
                        let dsts = &dsts;
                        async move {
                            let mut dsts = dsts.lock().await;
                            if plain
                                && let Some(bulk) = s.bulk()
                                && bulk.pull_dense(&req, &mut dsts).await?.is_some()
                            {
                                return Ok(Ok(()));
                            }
                            s.rediscover_bulk().await;
                            let resp = s.grpc.pull_dense(req).await?.into_inner();
                            Ok(place_slices(resp.slices, &mut dsts))
                        }
                    })
                    .await?
                    .map_err(ClientError::Protocol)
            }
        });
        stream::iter(pulls)
            .buffer_unordered(self.inner.cfg.max_in_flight)
            .try_collect::<Vec<()>>()
            .await?;
        Ok(out)
    }

    /// A dense pull as the top `ratio` of each chunk's change since this client's last pull,
    /// applied to the client's replica of the table (one delta pull of a table at a time).
    async fn pull_dense_delta(
        &self,
        spec: &TableSpec,
        shape: &ps_core::DenseShape,
        chunks: Range<u64>,
        ratio: f64,
        replica: &tokio::sync::Mutex<compress::DeltaReplica>,
    ) -> Result<Vec<f32>, ClientError> {
        let mut rep = replica.lock().await;
        if rep.values.len() as u64 != shape.len() {
            rep.values = vec![0.0; shape.len() as usize];
            rep.versions.clear();
        }
        let range = (chunks.start * shape.chunk_elems) as usize
            ..(chunks.start * shape.chunk_elems) as usize
                + chunks
                    .clone()
                    .filter_map(|c| shape.chunk_len(c))
                    .sum::<usize>();
        // A chunk may come whole, in f32: plan for that.
        let requests = self.plan_chunks(spec, shape, chunks, 4.0);
        let table = spec.name.to_string();
        let client_id = self.inner.client_id;
        let answers = stream::iter(requests)
            .map(|(shard, chunks)| {
                let versions: Vec<u64> = chunks
                    .iter()
                    .map(|c| rep.versions.get(c).copied().unwrap_or(0))
                    .collect();
                let req = pb::PullDenseRequest {
                    table: table.clone(),
                    chunks,
                    accept: pb::Encoding::F32 as i32,
                    map_epoch: 0,
                    delta: Some(pb::DeltaPull {
                        client_id,
                        ratio,
                        versions,
                    }),
                };
                let call = self.inner.call(shard, move |mut c, map_epoch| {
                    let req = pb::PullDenseRequest {
                        map_epoch,
                        ..req.clone()
                    };
                    async move { c.pull_dense(req).await }
                });
                async move { call.await.map(|r| (r, shard)) }
            })
            .buffer_unordered(self.inner.cfg.max_in_flight)
            .collect::<Vec<_>>()
            .await;
        for answer in answers {
            let (resp, _) = answer?;
            if resp.is_delta.len() != resp.slices.len() || resp.versions.len() != resp.slices.len()
            {
                return Err(ClientError::Protocol(
                    "a delta pull answered without a version per slice".into(),
                ));
            }
            for ((slice, is_delta), version) in resp
                .slices
                .into_iter()
                .zip(resp.is_delta)
                .zip(resp.versions)
            {
                let slice = DenseSlice::try_from(slice)
                    .map_err(|e| ClientError::Protocol(e.to_string()))?;
                let start = (slice.chunk * shape.chunk_elems) as usize;
                let chunk = slice.chunk;
                let bad =
                    |e: ps_codec::CodecError| ClientError::Protocol(format!("chunk {chunk}: {e}"));
                let dst = rep
                    .values
                    .get_mut(start..start + slice.values.len())
                    .ok_or_else(|| {
                        ClientError::Protocol(format!("chunk {chunk} answered out of range"))
                    })?;
                if is_delta {
                    Encoded::from(slice.values)
                        .decode_add(dst, 1.0)
                        .map_err(bad)?;
                } else {
                    slice.values.decode_into(dst).map_err(bad)?;
                }
                if version == 0 {
                    rep.versions.remove(&chunk);
                } else {
                    rep.versions.insert(chunk, version);
                }
            }
        }
        Ok(rep.values[range].to_vec())
    }

    /// Pushes gradients for rows `ids` of sparse table `name`: `grads` holds `ids.len() * dim`
    /// values, row after row. Duplicate ids are summed by the shard.
    pub async fn push_sparse(
        &self,
        name: &str,
        ids: &[u64],
        grads: &[f32],
    ) -> Result<PushSummary, ClientError> {
        let (spec, dim) = self.sparse_dim(name).await?;
        if grads.len() != ids.len() * dim {
            return Err(ClientError::InvalidInput(format!(
                "{} ids of dim {dim} need {} gradient values; got {}",
                ids.len(),
                ids.len() * dim,
                grads.len()
            )));
        }
        let (codec, sender) = self.inner.codecs.get(&spec.name);
        let groups = self.group_ids(&spec, ids, dim, codec.push.codec.max_bytes_per_value());
        // Encode every request under the table's lock, with per-row error feedback.
        let requests: Vec<(usize, Vec<u64>, Encoded)> = {
            let mut guard = sender.lock();
            let Sender { enc, rows, .. } = &mut *guard;
            let lossy = enc.options().keeps_residual();
            let rows = rows.get_or_insert_with(|| RowErrorFeedback::new(dim));
            let mut out = Vec::with_capacity(groups.len());
            for (shard, positions) in groups {
                let ids: Vec<u64> = positions.iter().map(|&p| ids[p]).collect();
                let mut values = Vec::with_capacity(positions.len() * dim);
                for &p in &positions {
                    values.extend_from_slice(&grads[p * dim..(p + 1) * dim]);
                }
                let e = if lossy {
                    rows.compress(enc, &ids, &values)
                        .map_err(|e| ClientError::InvalidInput(e.to_string()))?
                } else {
                    enc.encode(&values)
                };
                out.push((shard, ids, e));
            }
            out
        };
        let table = spec.name.to_string();
        let codec_name = codec.push.codec.to_string();
        // Owned wire requests: (index into `requests`, shard, ids, values).
        let calls: Vec<(usize, usize, Vec<u64>, pb::Payload)> = requests
            .iter()
            .enumerate()
            .map(|(i, (shard, ids, e))| {
                wire_metric("push", &table, &codec_name, e);
                (i, *shard, ids.clone(), Payload::from(e.clone()).into())
            })
            .collect();
        let results = stream::iter(calls.into_iter().map(|(i, shard, ids, values)| {
            let table = table.clone();
            let call = self.inner.push(shard, move |mut s, push_id, map_epoch| {
                let req = pb::PushSparseRequest {
                    table: table.clone(),
                    push_id: Some(push_id),
                    map_epoch,
                    ids: ids.clone(),
                    values: Some(values.clone()),
                };
                async move {
                    s.grpc
                        .push_sparse(req)
                        .await
                        .map(tonic::Response::into_inner)
                }
            });
            async move { (i, call.await) }
        }))
        .buffer_unordered(self.inner.cfg.max_in_flight)
        .collect::<Vec<_>>()
        .await;
        settle(
            results,
            |i| std::iter::once(&requests[i].2),
            |i| {
                let mut guard = sender.lock();
                let lossy = guard.lossy();
                if lossy && let Some(rows) = guard.rows.as_mut() {
                    let (_, ids, sent) = &requests[i];
                    let _ = rows.restore(ids, sent);
                }
            },
        )
    }

    /// Pulls rows `ids` of sparse table `name`: `ids.len() * dim` values, row after row.
    pub async fn pull_sparse(&self, name: &str, ids: &[u64]) -> Result<Vec<f32>, ClientError> {
        let (spec, dim) = self.sparse_dim(name).await?;
        let codec = self.inner.codecs.get(&spec.name).0;
        let accept = codec.pull;
        let bytes_per_value = codec.pull_bytes_per_value();
        let groups = self.group_ids(&spec, ids, dim, bytes_per_value);
        let table = spec.name.to_string();
        let mut out = vec![0.0f32; ids.len() * dim];
        let mut answers = stream::iter(groups.into_iter().map(|(shard, positions)| {
            let req = pb::PullSparseRequest {
                table: table.clone(),
                ids: positions.iter().map(|&p| ids[p]).collect(),
                accept: ps_core::payload::encoding_to_pb(accept) as i32,
                map_epoch: 0,
            };
            let call = self.inner.call(shard, move |mut c, map_epoch| {
                let req = pb::PullSparseRequest {
                    map_epoch,
                    ..req.clone()
                };
                async move { c.pull_sparse(req).await }
            });
            async move { call.await.map(|r| (positions, r)) }
        }))
        .buffer_unordered(self.inner.cfg.max_in_flight);
        while let Some((positions, resp)) = answers.try_next().await? {
            let values = resp
                .values
                .ok_or_else(|| ClientError::Protocol("PullSparse answered without values".into()))
                .and_then(|v| {
                    Payload::try_from(v).map_err(|e| ClientError::Protocol(e.to_string()))
                })?;
            if values.len() != positions.len() * dim {
                return Err(ClientError::Protocol(format!(
                    "asked for {} rows of dim {dim}, got {} values",
                    positions.len(),
                    values.len()
                )));
            }
            let rows = values
                .to_vec()
                .map_err(|e| ClientError::Protocol(e.to_string()))?;
            for (&p, row) in positions.iter().zip(rows.chunks_exact(dim)) {
                out[p * dim..(p + 1) * dim].copy_from_slice(row);
            }
        }
        Ok(out)
    }

    /// Groups positions of `ids` by owning shard, in requests of bounded size.
    fn group_ids(
        &self,
        spec: &TableSpec,
        ids: &[u64],
        dim: usize,
        bytes_per_value: f64,
    ) -> Vec<(usize, Vec<usize>)> {
        let hash = spec.name.hash64();
        let n = self.inner.num_shards;
        let row_bytes = dim as f64 * bytes_per_value.max(0.01) + 8.0;
        let per_request = ((self.inner.cfg.max_request_bytes as f64 / row_bytes) as usize).max(1);
        let mut by_shard: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (p, &id) in ids.iter().enumerate() {
            by_shard[self.inner.partitioner.shard_for_id(hash, id) as usize].push(p);
        }
        by_shard
            .into_iter()
            .enumerate()
            .flat_map(|(s, pos)| {
                pos.chunks(per_request)
                    .map(|c| (s, c.to_vec()))
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// Checkpoints every shard under the same name (empty: a time-based name per shard).
    pub async fn checkpoint(&self, name: &str) -> Result<Vec<ShardCheckpoint>, ClientError> {
        let req = pb::CheckpointRequest {
            name: name.to_owned(),
        };
        let answers = self
            .inner
            .all(|mut c, _| {
                let req = req.clone();
                async move { c.checkpoint(req).await }
            })
            .await?;
        Ok(answers
            .into_iter()
            .enumerate()
            .map(|(shard, a)| ShardCheckpoint {
                shard,
                name: a.name,
                path: a.path,
                files: a.files,
                bytes: a.bytes,
                sequence: a.sequence,
            })
            .collect())
    }

    /// Restores checkpoint `name` on every shard, replacing each shard's whole state (pushes
    /// acknowledged after the checkpoint are discarded). The scheduler's resume calls this with
    /// the workers held; calling it under running training loses their recent updates.
    pub async fn restore_checkpoint(&self, names: &[String]) -> Result<(), ClientError> {
        if names.len() != self.inner.num_shards {
            return Err(ClientError::InvalidInput(format!(
                "{} checkpoint names for {} shards",
                names.len(),
                self.inner.num_shards
            )));
        }
        futures::future::try_join_all(names.iter().enumerate().map(|(s, name)| {
            let req = pb::RestoreCheckpointRequest { name: name.clone() };
            self.inner.call(s, move |mut c, _| {
                let req = req.clone();
                async move { c.restore_checkpoint(req).await }
            })
        }))
        .await?;
        Ok(())
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

    /// Every shard's statistics, in shard order.
    pub async fn stats(&self) -> Result<Vec<pb::GetStatsResponse>, ClientError> {
        self.inner
            .all(|mut c, _| async move { c.get_stats(pb::GetStatsRequest {}).await })
            .await
    }
}

/// Decodes a pull's answered slices into the places of the chunks asked for, in order.
fn place_slices(slices: Vec<pb::DenseSlice>, dsts: &mut [bulk::Dst<'_>]) -> Result<(), String> {
    if slices.len() != dsts.len() {
        return Err(format!(
            "{} slices answered for {} chunks",
            slices.len(),
            dsts.len()
        ));
    }
    for (slice, (chunk, dst)) in slices.into_iter().zip(dsts.iter_mut()) {
        let slice = DenseSlice::try_from(slice).map_err(|e| e.to_string())?;
        if slice.chunk != *chunk || slice.values.len() != dst.len() {
            return Err(format!(
                "chunk {} of {} values answered where chunk {chunk} of {} was asked",
                slice.chunk,
                slice.values.len(),
                dst.len()
            ));
        }
        slice
            .values
            .decode_into(dst)
            .map_err(|e| format!("chunk {}: {e}", slice.chunk))?;
    }
    Ok(())
}

/// Sums the answers of a push's requests (`(request index, answer)`), counting the payloads
/// of each applied one. A request the shard refused (certainly not applied) goes to `refused`,
/// which gives its part back to the residual. The first error, if any, is the push's.
fn settle<'a, P>(
    results: Vec<(usize, Result<pb::PushResponse, ClientError>)>,
    payloads: impl Fn(usize) -> P,
    mut refused: impl FnMut(usize),
) -> Result<PushSummary, ClientError>
where
    P: Iterator<Item = &'a Encoded>,
{
    let mut total = PushSummary::default();
    let mut first_err = None;
    for (i, r) in results {
        match r {
            Ok(a) => {
                total.add(&a);
                for e in payloads(i) {
                    total.add_payload(e);
                }
            }
            Err(e) => {
                if not_applied(&e) {
                    refused(i);
                }
                first_err.get_or_insert(e);
            }
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(total),
    }
}

/// Whether a failed push was certainly not applied: the shard refused it. (After a transport
/// failure or a deadline it may have been.)
fn not_applied(e: &ClientError) -> bool {
    use tonic::Code;
    match e {
        ClientError::Status { code, .. } => !matches!(
            code,
            Code::Unavailable | Code::Unknown | Code::DeadlineExceeded | Code::Cancelled
        ),
        _ => true,
    }
}

/// One encoded dense slice: its chunk, its range in the tensor, its payload.
type EncodedSlice = (u64, Range<usize>, Encoded);

/// Counts a payload this client sent, by table and codec.
fn wire_metric(direction: &'static str, table: &str, codec: &str, e: &Encoded) {
    let labels = [
        ("direction", direction.to_owned()),
        ("table", table.to_owned()),
        ("codec", codec.to_owned()),
    ];
    metrics::counter!("ps_client_wire_bytes_total", &labels).increment(e.data.len() as u64);
    metrics::counter!("ps_client_raw_bytes_total", &labels).increment(e.header.num_values * 4);
}

/// Whether a call may succeed if sent again: the shard said `unavailable`, or the connection
/// failed under the call (tonic reports that as `unknown` with a transport error as its source,
/// or as `cancelled` when the shard's process died while the request was in flight: this
/// client still awaits the call, so nobody on its side cancelled it). Retrying a push is safe
/// either way: it carries the same (client id, seq).
fn is_transient(s: &tonic::Status) -> bool {
    match s.code() {
        tonic::Code::Unavailable | tonic::Code::Cancelled => true,
        tonic::Code::Unknown => {
            let mut source = std::error::Error::source(s);
            while let Some(e) = source {
                if e.is::<tonic::transport::Error>() || e.to_string().contains("connection") {
                    return true;
                }
                source = e.source();
            }
            s.message() == "transport error"
        }
        _ => false,
    }
}

impl Inner {
    /// Calls shard `shard` with the current map epoch, retrying transient failures with
    /// exponential backoff. With a map source, a transient failure or a stale-epoch refusal
    /// first fetches the map again, so a call follows a shard that moved.
    async fn call<T, F, Fut>(&self, shard: usize, mut f: F) -> Result<T, ClientError>
    where
        F: FnMut(ParameterServerClient<LinkChannel>, u64) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        self.call_shard(shard, |s, epoch| {
            let call = f(s.grpc, epoch);
            async move { call.await.map(tonic::Response::into_inner) }
        })
        .await
    }

    /// [`Inner::call`] for a call that picks its transport: `f` gets the shard's connections.
    async fn call_shard<T, F, Fut>(&self, shard: usize, mut f: F) -> Result<T, ClientError>
    where
        F: FnMut(Shard, u64) -> Fut,
        Fut: Future<Output = Result<T, tonic::Status>>,
    {
        let mut backoff = self.cfg.initial_backoff;
        let mut attempt = 1;
        loop {
            let conn = self.shards.read()[shard].clone();
            let endpoint = conn.endpoint.clone();
            let epoch = self.map_epoch.load(Ordering::Relaxed);
            match f(conn, epoch).await {
                Ok(r) => return Ok(r),
                Err(s)
                    if attempt < self.cfg.max_attempts
                        && (is_transient(&s) || self.is_stale_map(&s)) =>
                {
                    tracing::debug!(shard, attempt, error = %s.message(), "shard unavailable; retrying");
                    self.refresh_map(epoch).await;
                    // Full jitter keeps many clients from retrying in lock-step.
                    let wait = backoff.mul_f64(0.5 + rand::random::<f64>() * 0.5);
                    tokio::time::sleep(wait).await;
                    backoff = (backoff * 2).min(self.cfg.max_backoff);
                    attempt += 1;
                }
                Err(s) => return Err(ClientError::from_status(shard, &endpoint, s)),
            }
        }
    }

    /// Whether the shard refused a request for its old map epoch, and the map can be fetched.
    fn is_stale_map(&self, s: &tonic::Status) -> bool {
        self.cfg.map_source.is_some()
            && error::reason_of(s).as_deref() == Some(ps_core::wire::reason::STALE_MAP)
    }

    /// Fetches the shard map when the client is still at epoch `seen`; adopts it when it is
    /// newer and complete (every shard registered), reconnecting to the shards that moved.
    async fn refresh_map(&self, seen: u64) {
        let Some(source) = &self.cfg.map_source else {
            return;
        };
        let _one = self.refreshing.lock().await;
        if self.map_epoch.load(Ordering::Relaxed) != seen {
            return; // another call refreshed it meanwhile
        }
        let (epoch, endpoints) = match source.current().await {
            Ok(map) => map,
            Err(e) => {
                tracing::debug!(error = %e, "shard map unavailable");
                return;
            }
        };
        if epoch <= seen
            || endpoints.len() != self.num_shards
            || endpoints.iter().any(String::is_empty)
        {
            return;
        }
        let mut shards = self.shards.read().clone();
        for (slot, ep) in shards.iter_mut().zip(endpoints) {
            if slot.endpoint != ep {
                // The moved shard's bulk port is asked for on its first call, which goes by gRPC.
                match shard_client(&self.cfg, self.link.clone(), &ep) {
                    Ok(grpc) => {
                        *slot = Shard {
                            bulk: bulk_pool(&self.cfg, self.link.as_ref(), &ep, None),
                            endpoint: ep,
                            grpc,
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "the shard map names an unusable endpoint");
                        return;
                    }
                }
            }
        }
        *self.shards.write() = shards;
        self.map_epoch.store(epoch, Ordering::Relaxed);
        tracing::info!(epoch, "shard map refreshed");
    }

    /// A push to `shard`: one sequence number for every attempt of it.
    async fn push<F, Fut>(&self, shard: usize, mut f: F) -> Result<pb::PushResponse, ClientError>
    where
        F: FnMut(Shard, pb::PushId, u64) -> Fut,
        Fut: Future<Output = Result<pb::PushResponse, tonic::Status>>,
    {
        let ticket = self.seqs.begin();
        let push_id = pb::PushId {
            client_id: self.client_id,
            seq: ticket.seq(),
            min_unacked_seq: ticket.min_unacked(),
        };
        self.call_shard(shard, |s, epoch| f(s, push_id, epoch))
            .await
    }

    /// The same call on every shard, concurrently; answers in shard order.
    async fn all<T, F, Fut>(&self, f: F) -> Result<Vec<T>, ClientError>
    where
        F: Fn(ParameterServerClient<LinkChannel>, u64) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        futures::future::try_join_all((0..self.num_shards).map(|s| self.call(s, &f))).await
    }
}

/// The bulk-stream pool for the shard at `ep` (its port, or `None` to ask for it), unless the
/// client keeps to gRPC.
fn bulk_pool(
    cfg: &ClientConfig,
    link: Option<&Arc<Link>>,
    ep: &str,
    port: Option<u16>,
) -> Option<Arc<BulkPool>> {
    if !cfg.bulk || link.is_some() {
        return None;
    }
    BulkPool::new(ep, port, cfg.connect_timeout, cfg.request_timeout).map(Arc::new)
}

/// A lazily connected client for the shard at `ep`, with the windows and limits every shard
/// connection uses.
fn shard_client(
    cfg: &ClientConfig,
    link: Option<Arc<Link>>,
    ep: &str,
) -> Result<ParameterServerClient<LinkChannel>, ClientError> {
    let endpoint = Endpoint::from_shared(ep.to_owned())
        .map_err(|e| ClientError::InvalidInput(format!("bad endpoint `{ep}`: {e}")))?
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_frame_size(Some(1 << 20))
        .tcp_nodelay(true)
        .connect_timeout(cfg.connect_timeout);
    let endpoint = match cfg.request_timeout {
        Some(t) => endpoint.timeout(t),
        None => endpoint,
    };
    Ok(
        ParameterServerClient::new(LinkChannel::new(endpoint.connect_lazy(), link))
            .max_decoding_message_size(usize::MAX)
            .max_encoding_message_size(usize::MAX),
    )
}
