//! The connections to the shards and the one way every call goes: with the current map epoch,
//! retried with jittered backoff while the failure is transient, after fetching the shard map
//! again (when there is a map source) so a call follows a shard that moved. A push keeps one
//! sequence number for every attempt, so the shard applies it once.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::RwLock;
use ps_core::wire::{CONNECTION_WINDOW, KEEPALIVE_INTERVAL, KEEPALIVE_TIMEOUT, STREAM_WINDOW};
use ps_core::{Partitioner, TableName, TableSpec};
use ps_proto::v1 as pb;
use ps_proto::v1::parameter_server_client::ParameterServerClient;
use tonic::transport::Endpoint;

use crate::auth::Bearer;
use crate::bulk::BulkPool;
use crate::compress::Codecs;
use crate::error::{self, ClientError, is_transient};
use crate::link::{Link, LinkChannel};
use crate::trace::Traced;

/// A shard's gRPC channel: traced, with the client's token, through the link emulator.
pub(crate) type ShardChannel = Traced<Bearer<LinkChannel>>;
use crate::seq::SeqTracker;
use crate::{ClientConfig, ShardInfo};

#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) cfg: ClientConfig,
    /// Each shard's endpoint and connections; replaced when the shard map moves a shard.
    pub(crate) shards: RwLock<Vec<Shard>>,
    pub(crate) num_shards: usize,
    /// One map refresh at a time.
    pub(crate) refreshing: tokio::sync::Mutex<()>,
    pub(crate) infos: Vec<ShardInfo>,
    pub(crate) partitioner: Partitioner,
    pub(crate) client_id: u64,
    pub(crate) seqs: SeqTracker,
    pub(crate) specs: RwLock<HashMap<TableName, TableSpec>>,
    pub(crate) codecs: Codecs,
    pub(crate) map_epoch: AtomicU64,
    /// The emulated link every shard connection shares, when one is set.
    pub(crate) link: Option<Arc<Link>>,
    /// Nanoseconds spent encoding dense pushes (codec and error feedback), over the client's
    /// life.
    pub(crate) encode_nanos: AtomicU64,
    /// Bytes of pulled values over the client's life: on the wire, and as f32.
    pub(crate) pulled_wire: AtomicU64,
    pub(crate) pulled_raw: AtomicU64,
    /// Bytes of the pull requests this client sent (ids, held rows' digests, chunk lists,
    /// versions), over its life.
    pub(crate) pull_asked: AtomicU64,
    /// Sparse rows answered as unchanged, over the client's life.
    pub(crate) rows_unchanged: AtomicU64,
    /// The job clock sparse pushes carry ([`crate::PsClient::set_clock`]); `u64::MAX`: none.
    pub(crate) clock: AtomicU64,
}

/// One shard's connections: gRPC, and its bulk stream when it offers one.
#[derive(Debug, Clone)]
pub(crate) struct Shard {
    pub(crate) endpoint: String,
    pub(crate) grpc: ParameterServerClient<ShardChannel>,
    pub(crate) bulk: Option<Arc<BulkPool>>,
}

impl Shard {
    /// The bulk stream, when this call may use it.
    pub(crate) fn bulk(&self) -> Option<&BulkPool> {
        self.bulk.as_deref().filter(|b| b.usable())
    }

    /// A dense pull answered whole in a message (`req` asks another encoding than plain f32,
    /// or is a delta pull): by the bulk stream where the shard takes such pulls there, else
    /// through gRPC.
    pub(crate) async fn pull_dense_answered(
        &mut self,
        req: pb::PullDenseRequest,
    ) -> Result<pb::PullDenseResponse, tonic::Status> {
        let by_bulk = match self.bulk() {
            Some(bulk) => bulk.pull_dense_encoded(&req).await?,
            None => None,
        };
        match by_bulk {
            Some(resp) => Ok(resp),
            None => {
                self.rediscover_bulk().await;
                Ok(self.grpc.pull_dense(req).await?.into_inner())
            }
        }
    }

    /// After the bulk port could not be reached: asks the shard for it again (a shard that
    /// restarted on a system-picked port has a new one). One cheap call, made only then.
    pub(crate) async fn rediscover_bulk(&mut self) {
        if let Some(b) = &self.bulk
            && b.wants_port()
            && let Ok(info) = self.grpc.shard_info(pb::ShardInfoRequest {}).await
        {
            b.set_port(u16::try_from(info.into_inner().bulk_port).unwrap_or(0));
        }
    }
}

impl Inner {
    /// Calls shard `shard` with the current map epoch, retrying transient failures with
    /// exponential backoff. With a map source, a transient failure or a stale-epoch refusal
    /// first fetches the map again, so a call follows a shard that moved.
    pub(crate) async fn call<T, F, Fut>(&self, shard: usize, mut f: F) -> Result<T, ClientError>
    where
        F: FnMut(ParameterServerClient<ShardChannel>, u64) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        self.call_shard(shard, |s, epoch| {
            let call = f(s.grpc, epoch);
            async move { call.await.map(tonic::Response::into_inner) }
        })
        .await
    }

    /// [`Inner::call`] for a call that picks its transport: `f` gets the shard's connections.
    pub(crate) async fn call_shard<T, F, Fut>(
        &self,
        shard: usize,
        mut f: F,
    ) -> Result<T, ClientError>
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
    pub(crate) async fn push<F, Fut>(
        &self,
        shard: usize,
        mut f: F,
    ) -> Result<pb::PushResponse, ClientError>
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

    /// The same call on every shard, concurrently; answers in shard order. Every shard's call
    /// runs to its end even where another shard refused: cancelling the rest at the first
    /// refusal would leave it unknown which shards applied the call. The error returned is the
    /// lowest shard's.
    pub(crate) async fn all<T, F, Fut>(&self, f: F) -> Result<Vec<T>, ClientError>
    where
        F: Fn(ParameterServerClient<ShardChannel>, u64) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        futures::future::join_all((0..self.num_shards).map(|s| self.call(s, &f)))
            .await
            .into_iter()
            .collect()
    }
}

/// The bulk-stream pool for the shard at `ep` (its port, or `None` to ask for it), unless the
/// client keeps to gRPC.
pub(crate) fn bulk_pool(
    cfg: &ClientConfig,
    link: Option<&Arc<Link>>,
    ep: &str,
    port: Option<u16>,
) -> Option<Arc<BulkPool>> {
    if !cfg.bulk {
        return None;
    }
    BulkPool::new(ep, port, cfg, link.cloned()).map(Arc::new)
}

/// A lazily connected client for the shard at `ep`, with the windows and limits every shard
/// connection uses.
pub(crate) fn shard_client(
    cfg: &ClientConfig,
    link: Option<Arc<Link>>,
    ep: &str,
) -> Result<ParameterServerClient<ShardChannel>, ClientError> {
    let endpoint = Endpoint::from_shared(ep.to_owned())
        .map_err(|e| ClientError::InvalidInput(format!("bad endpoint `{ep}`: {e}")))?
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_frame_size(Some(1 << 20))
        .tcp_nodelay(true)
        .connect_timeout(cfg.connect_timeout)
        .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT)
        .keep_alive_while_idle(true);
    let endpoint = match cfg.request_timeout {
        Some(t) => endpoint.timeout(t),
        None => endpoint,
    };
    let channel = crate::tls::channel(&endpoint, cfg.credentials.tls.as_ref());
    Ok(ParameterServerClient::new(Traced::new(
        Bearer::new(
            LinkChannel::new(channel, link),
            cfg.credentials.token.as_ref(),
        ),
        ep,
    ))
    .max_decoding_message_size(usize::MAX)
    .max_encoding_message_size(usize::MAX))
}
