//! `scheduler` configuration: flags with `PS_*` environment fallbacks and an optional TOML file.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use ps_runtime::service::{ServiceArgs, ServiceConfig, ServiceDefaults, load_service_file};
use serde::Deserialize;

use crate::core::SchedulerConfig;

/// The scheduler of a parameter-server cluster.
#[derive(Debug, Clone, Parser)]
#[command(name = "scheduler", version, about)]
pub struct Args {
    #[command(flatten)]
    pub service: ServiceArgs,
    /// Lease of shards and workers, in milliseconds [default: 5000].
    #[arg(long, env = "PS_LEASE_MS")]
    pub lease_ms: Option<u64>,
}

/// The scheduler's own keys of its TOML file (the shared ones are [`ServiceFile`]'s).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FileConfig {
    pub lease_ms: Option<u64>,
    /// Longest single AdvanceClock wait before it answers `ready = false`.
    pub max_wait_ms: Option<u64>,
    pub checkpoint_timeout_ms: Option<u64>,
}

/// The resolved configuration `run` takes.
#[derive(Debug, Clone)]
pub struct Config {
    /// Addresses, data directory (`None`: job state in memory), shutdown timings.
    pub service: ServiceConfig,
    pub scheduler: SchedulerConfig,
}

const DEFAULTS: ServiceDefaults = ServiceDefaults {
    listen: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 7000),
    grace: Duration::from_secs(5),
    state: "durable job state and job checkpoint manifests",
};

impl Config {
    /// A scheduler on an ephemeral loopback port keeping its state in `data_dir`: what tests
    /// and the bench start.
    pub fn local(data_dir: Option<PathBuf>) -> Self {
        Self {
            service: ServiceConfig::local(data_dir.clone(), DEFAULTS.grace),
            scheduler: SchedulerConfig {
                data_dir,
                ..SchedulerConfig::default()
            },
        }
    }

    pub fn resolve(args: Args) -> anyhow::Result<Self> {
        let (shared, file): (_, FileConfig) = load_service_file(args.service.config.as_deref())?;
        let service = args.service.resolve(shared, DEFAULTS)?;
        let d = SchedulerConfig::default();
        let lease = args
            .lease_ms
            .or(file.lease_ms)
            .map_or(d.lease, Duration::from_millis);
        if lease < Duration::from_millis(100) {
            anyhow::bail!("--lease-ms must be at least 100");
        }
        Ok(Self {
            scheduler: SchedulerConfig {
                data_dir: service.data_dir.clone(),
                lease,
                max_wait: file.max_wait_ms.map_or(d.max_wait, Duration::from_millis),
                tick: d.tick.min(lease / 4),
                checkpoint_timeout: file
                    .checkpoint_timeout_ms
                    .map_or(d.checkpoint_timeout, Duration::from_millis),
                credentials: service.security.credentials.clone(),
            },
            service,
        })
    }
}
