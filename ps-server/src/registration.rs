//! Membership of a shard in a scheduler-managed cluster: register, then renew the lease with
//! heartbeats, learning the shard-map epoch from each answer. A heartbeat answered NOT_FOUND
//! (the lease expired, or the scheduler restarted) registers again; an unreachable scheduler is
//! retried with backoff while the shard keeps serving on the epoch it knows. A request routed
//! with a newer epoch than the shard knows asks for a heartbeat at once (`MapEpoch::behind`), so
//! a shard learns of a map change in one round trip, not at its next heartbeat.

use std::sync::Arc;
use std::time::Duration;

use ps_proto::v1 as pb;

use crate::engine::MapEpoch;
use ps_proto::v1::scheduler_client::SchedulerClient;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Channel, Endpoint};

/// What a shard tells the scheduler, and where it keeps the epoch it learns.
#[derive(Debug, Clone)]
pub struct Registration {
    pub scheduler: String,
    pub advertise: String,
    pub shard_index: u32,
    pub num_shards: u32,
    pub virtual_nodes: u32,
    pub map_epoch: Arc<MapEpoch>,
}

const MIN_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(2);

impl Registration {
    /// Runs until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) {
        let channel = match Endpoint::from_shared(self.scheduler.clone()) {
            Ok(e) => e
                .connect_timeout(Duration::from_secs(2))
                .timeout(Duration::from_secs(5))
                .connect_lazy(),
            Err(e) => {
                tracing::error!(scheduler = %self.scheduler, error = %e, "bad scheduler URL; not registering");
                return;
            }
        };
        let mut client = SchedulerClient::new(channel);
        let mut backoff = MIN_BACKOFF;
        loop {
            let pause = match self.register(&mut client).await {
                Ok(lease) => {
                    backoff = MIN_BACKOFF;
                    self.heartbeat_until_lost(&mut client, lease, &shutdown)
                        .await;
                    MIN_BACKOFF
                }
                Err(s) => {
                    tracing::warn!(scheduler = %self.scheduler, code = ?s.code(), error = s.message(), "registering with the scheduler failed; retrying");
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                    backoff
                }
            };
            tokio::select! {
                () = tokio::time::sleep(pause) => {}
                () = shutdown.cancelled() => return,
            }
        }
    }

    async fn register(
        &self,
        client: &mut SchedulerClient<Channel>,
    ) -> Result<Duration, tonic::Status> {
        let r = client
            .register_shard(pb::RegisterShardRequest {
                shard_index: self.shard_index,
                num_shards: self.num_shards,
                virtual_nodes: self.virtual_nodes,
                endpoint: self.advertise.clone(),
            })
            .await?
            .into_inner();
        self.map_epoch.set(r.map_epoch);
        tracing::info!(epoch = r.map_epoch, lease_ms = r.lease_ms, endpoint = %self.advertise, "registered with the scheduler");
        Ok(Duration::from_millis(r.lease_ms.max(300)))
    }

    /// Heartbeats every third of the lease, or at once when a request shows this shard is
    /// behind, until the scheduler forgets this shard or shutdown.
    async fn heartbeat_until_lost(
        &self,
        client: &mut SchedulerClient<Channel>,
        lease: Duration,
        shutdown: &CancellationToken,
    ) {
        loop {
            tokio::select! {
                () = tokio::time::sleep(lease / 3) => {}
                () = self.map_epoch.fell_behind() => {}
                () = shutdown.cancelled() => return,
            }
            let hb = client
                .shard_heartbeat(pb::ShardHeartbeatRequest {
                    shard_index: self.shard_index,
                    endpoint: self.advertise.clone(),
                })
                .await;
            match hb {
                Ok(r) => {
                    self.map_epoch.set(r.into_inner().map_epoch);
                }
                Err(s) if s.code() == tonic::Code::NotFound => {
                    tracing::warn!("the scheduler no longer knows this shard; registering again");
                    return;
                }
                Err(s) => {
                    tracing::warn!(code = ?s.code(), error = s.message(), "heartbeat failed; retrying");
                }
            }
        }
    }
}
