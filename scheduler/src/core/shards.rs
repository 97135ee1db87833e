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
        owner: &str,
    ) -> Result<(u64, Duration)> {
        let lease = self.inner.cfg.lease;
        check_registration(index, num_shards, virtual_nodes, &endpoint)?;
        // A shape that contradicts the live cluster is refused first; a new address must
        // answer before it is published to every worker.
        let known = {
            let st = self.inner.state.lock();
            let c = &st.cluster;
            if let Some(e) = shape_conflict(c, index, num_shards, virtual_nodes, Instant::now()) {
                return Err(e);
            }
            check_slot(c, index, owner, Instant::now())?;
            c.known.get(index as usize) == Some(&endpoint)
        };
        if !known {
            probe(&endpoint).await?;
        }
        let epoch = {
            let mut st = self.inner.state.lock();
            let now = Instant::now();
            let c = &mut st.cluster;
            // Checked again: the lock was let go for the probe.
            if let Some(e) = shape_conflict(c, index, num_shards, virtual_nodes, now) {
                return Err(e);
            }
            check_slot(c, index, owner, now)?;
            if c.num_shards != 0 && (c.num_shards != num_shards || c.virtual_nodes != virtual_nodes)
            {
                tracing::warn!(
                    was = c.num_shards,
                    now = num_shards,
                    "no shard of the cluster's shape is alive; the cluster takes the new one"
                );
                c.shards.clear();
                c.known.clear();
                c.epoch += 1;
            }
            c.num_shards = num_shards;
            c.virtual_nodes = virtual_nodes;
            c.shards.resize(num_shards as usize, None);
            c.shards[index as usize] = Some(ShardMember {
                endpoint: endpoint.clone(),
                lease_until: now + lease,
                owner: owner.to_owned(),
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

    pub fn shard_heartbeat(&self, index: u32, endpoint: &str, owner: &str) -> Result<u64> {
        let lease = self.inner.cfg.lease;
        let mut st = self.inner.state.lock();
        let c = &mut st.cluster;
        match c.shards.get_mut(index as usize) {
            Some(Some(m)) if m.owner != owner => Err(SchedError::NotYours {
                what: format!("shard slot {index}"),
                holder: m.owner.clone(),
                caller: owner.to_owned(),
            }),
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
        cfg.credentials = self.inner.cfg.credentials.clone();
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

/// The refusal of a registration whose shape contradicts the cluster's while a shard
/// registered under that shape is alive. Once none is (a shard that registered by mistake and
/// went away), the first live registration decides the shape again.
fn shape_conflict(
    c: &crate::state::Cluster,
    index: u32,
    num_shards: u32,
    vnodes: u32,
    now: Instant,
) -> Option<SchedError> {
    let differs = c.num_shards != 0 && (c.num_shards != num_shards || c.virtual_nodes != vnodes);
    let held = c.shards.iter().flatten().any(|m| m.lease_until > now);
    (differs && held).then_some(SchedError::ShardConflict {
        index,
        shards: c.num_shards,
        vnodes: c.virtual_nodes,
        its_shards: num_shards,
        its_vnodes: vnodes,
    })
}

/// Refuses a registration for a slot whose live lease another caller holds: a slot belongs to
/// the shard identity that registered it until its lease runs out.
fn check_slot(c: &crate::state::Cluster, index: u32, owner: &str, now: Instant) -> Result<()> {
    match c.shards.get(index as usize) {
        Some(Some(m)) if m.lease_until > now && m.owner != owner => Err(SchedError::NotYours {
            what: format!("shard slot {index}"),
            holder: m.owner.clone(),
            caller: owner.to_owned(),
        }),
        _ => Ok(()),
    }
}

/// Bounds and form of a shard's registration, checked before anything is allocated for it.
fn check_registration(index: u32, num_shards: u32, vnodes: u32, endpoint: &str) -> Result<()> {
    use ps_core::job::MAX_SHARDS;
    use ps_core::partition::MAX_VIRTUAL_NODES;
    let bad = |field: &str, why: String| Err(ValidationError::new(field, why).into());
    if num_shards == 0 || num_shards > MAX_SHARDS {
        return bad(
            "num_shards",
            format!("must be in 1..={MAX_SHARDS}, got {num_shards}"),
        );
    }
    if index >= num_shards {
        return bad(
            "shard_index",
            format!("shard index {index} is not below the shard count {num_shards}"),
        );
    }
    if vnodes == 0 || vnodes > MAX_VIRTUAL_NODES {
        return bad(
            "virtual_nodes",
            format!("must be in 1..={MAX_VIRTUAL_NODES}, got {vnodes}"),
        );
    }
    if endpoint.len() > 512 {
        return bad(
            "endpoint",
            format!("{} bytes; the limit is 512", endpoint.len()),
        );
    }
    match endpoint.parse::<tonic::transport::Uri>() {
        Ok(u) if matches!(u.scheme_str(), Some("http" | "https")) && u.port_u16().is_some() => {
            Ok(())
        }
        _ => bad(
            "endpoint",
            format!("`{endpoint}` is not an http(s)://host:port URL"),
        ),
    }
}

/// Whether a shard's advertised endpoint accepts connections (within two seconds).
async fn probe(endpoint: &str) -> Result<()> {
    let unreachable = |cause: String| SchedError::Unreachable {
        endpoint: endpoint.to_owned(),
        cause,
    };
    let uri: tonic::transport::Uri = endpoint.parse().map_err(|e| unreachable(format!("{e}")))?;
    let host = uri.host().unwrap_or_default().trim_matches(['[', ']']);
    let port = uri.port_u16().unwrap_or(80);
    match tokio::time::timeout(
        Duration::from_secs(2),
        tokio::net::TcpStream::connect((host, port)),
    )
    .await
    {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(unreachable(e.to_string())),
        Err(_) => Err(unreachable("no answer within 2 s".into())),
    }
}
