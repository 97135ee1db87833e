//! Shards: registration (a new address is a new map epoch), heartbeats that keep a shard's
//! lease, the published map, and a client for the shards of the current map.

use ps_client::{ClientConfig, PsClient};
use ps_core::ValidationError;
use tokio::time::{Duration, Instant};

use super::{Scheduler, ShardMap};
use crate::error::{Result, SchedError};
use crate::metrics as m;
use crate::state::ShardMember;

impl Scheduler {
    pub async fn register_shard(
        &self,
        index: u32,
        num_shards: u32,
        virtual_nodes: u32,
        endpoint: String,
    ) -> Result<(u64, Duration)> {
        let lease = self.inner.cfg.lease;
        let epoch = {
            let mut st = self.inner.state.lock();
            let c = &mut st.cluster;
            if num_shards == 0 || index >= num_shards {
                return Err(ValidationError::new(
                    "shard_index",
                    format!("shard index {index} is not below the shard count {num_shards}"),
                )
                .into());
            }
            if c.num_shards != 0 && (c.num_shards != num_shards || c.virtual_nodes != virtual_nodes)
            {
                return Err(SchedError::ShardConflict {
                    index,
                    shards: c.num_shards,
                    vnodes: c.virtual_nodes,
                    its_shards: num_shards,
                    its_vnodes: virtual_nodes,
                });
            }
            c.num_shards = num_shards;
            c.virtual_nodes = virtual_nodes;
            c.shards.resize(num_shards as usize, None);
            c.shards[index as usize] = Some(ShardMember {
                endpoint: endpoint.clone(),
                lease_until: Instant::now() + lease,
            });
            c.known.resize(num_shards as usize, String::new());
            // A shard coming back at the same address changes no route: same epoch. A new
            // address is a new map, and clients routed with the old one are refused.
            if c.known[index as usize] != endpoint || c.epoch == 0 {
                c.known[index as usize] = endpoint.clone();
                c.epoch += 1;
            }
            let epoch = c.epoch;
            m::map_epoch(epoch);
            let cluster = st.cluster.clone();
            for job in st.jobs.values_mut() {
                job.refresh(&cluster);
                job.wake();
            }
            epoch
        };
        tracing::info!(shard = index, %endpoint, epoch, "shard registered");
        self.save().await?;
        self.kick();
        Ok((epoch, lease))
    }

    pub fn shard_heartbeat(&self, index: u32, endpoint: &str) -> Result<u64> {
        let lease = self.inner.cfg.lease;
        let mut st = self.inner.state.lock();
        let c = &mut st.cluster;
        match c.shards.get_mut(index as usize) {
            Some(Some(m)) if m.endpoint == endpoint => {
                m.lease_until = Instant::now() + lease;
                Ok(c.epoch)
            }
            _ => Err(SchedError::ShardNotRegistered {
                index,
                endpoint: endpoint.to_owned(),
            }),
        }
    }

    pub fn shard_map(&self) -> ShardMap {
        let st = self.inner.state.lock();
        let c = &st.cluster;
        ShardMap {
            epoch: c.epoch,
            num_shards: c.num_shards,
            virtual_nodes: c.virtual_nodes,
            endpoints: c.endpoints(),
            complete: c.complete(),
        }
    }

    /// A client for the shards of the current map, or `unavailable` when one is missing.
    pub(super) async fn shards_client(&self) -> Result<PsClient> {
        let map = self.shard_map();
        if !map.complete {
            return Err(SchedError::ShardsIncomplete);
        }
        let mut cfg = ClientConfig::new(map.endpoints);
        cfg.map_epoch = map.epoch;
        cfg.max_attempts = 5;
        PsClient::connect(cfg)
            .await
            .map_err(|e| SchedError::Shards {
                action: "reaching the shards",
                cause: e.to_string(),
            })
    }
}
