//! Membership of a shard in a scheduler-managed cluster, through the SDK's scheduler client:
//! register, then renew the lease with heartbeats, learning the shard-map epoch from each
//! answer. A heartbeat refused with `SHARD_NOT_REGISTERED` (the lease expired, or the scheduler
//! restarted) registers again; an unreachable scheduler is retried with backoff while the
//! shard keeps serving on the epoch it knows. A request routed with a newer epoch than the
//! shard knows asks for a heartbeat at once (`MapEpoch::behind`), so a shard learns of a map
//! change in one round trip, not at its next heartbeat.

use std::sync::Arc;
use std::time::Duration;

use ps_client::ClientError;
use ps_client::scheduler::{SchedulerClient, ShardRegistration};
use ps_core::wire::reason;
use tokio_util::sync::CancellationToken;

use crate::engine::MapEpoch;

/// What a shard tells the scheduler, and where it keeps the epoch it learns.
#[derive(Debug, Clone)]
pub struct Registration {
    pub scheduler: String,
    pub shard: ShardRegistration,
    pub map_epoch: Arc<MapEpoch>,
    /// The shard's TLS and token for its calls to the scheduler.
    pub credentials: ps_client::Credentials,
}

const MIN_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// Longest wait for one registration or heartbeat.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

impl Registration {
    /// Runs until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) {
        let client = match SchedulerClient::connect_with(
            &self.scheduler,
            Some(CALL_TIMEOUT),
            self.credentials.clone(),
        )
        .await
        {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(scheduler = %self.scheduler, error = %e, "bad scheduler URL; not registering");
                return;
            }
        };
        let mut backoff = MIN_BACKOFF;
        loop {
            let pause = match self.register(&client).await {
                Ok(lease) => {
                    backoff = MIN_BACKOFF;
                    self.heartbeat_until_lost(&client, lease, &shutdown).await;
                    MIN_BACKOFF
                }
                Err(e) => {
                    tracing::warn!(scheduler = %self.scheduler, error = %e, "registering with the scheduler failed; retrying");
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

    async fn register(&self, client: &SchedulerClient) -> Result<Duration, ClientError> {
        let (epoch, lease) = client.register_shard(&self.shard).await?;
        self.map_epoch.set(epoch);
        tracing::info!(epoch, lease_ms = lease.as_millis() as u64, endpoint = %self.shard.endpoint, "registered with the scheduler");
        Ok(lease.max(Duration::from_millis(300)))
    }

    /// Heartbeats every third of the lease, or at once when a request shows this shard is
    /// behind, until the scheduler forgets this shard or shutdown.
    async fn heartbeat_until_lost(
        &self,
        client: &SchedulerClient,
        lease: Duration,
        shutdown: &CancellationToken,
    ) {
        loop {
            tokio::select! {
                () = tokio::time::sleep(lease / 3) => {}
                () = self.map_epoch.fell_behind() => {}
                () = shutdown.cancelled() => return,
            }
            match client.shard_heartbeat(&self.shard).await {
                Ok(epoch) => self.map_epoch.set(epoch),
                Err(e) if e.reason() == Some(reason::SHARD_NOT_REGISTERED) => {
                    tracing::warn!("the scheduler no longer knows this shard; registering again");
                    return;
                }
                Err(e) => tracing::warn!(error = %e, "heartbeat failed; retrying"),
            }
        }
    }
}
