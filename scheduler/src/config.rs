//! `scheduler` configuration: flags with `PS_*` environment fallbacks and an optional TOML file.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use serde::Deserialize;

use crate::core::SchedulerConfig;

/// The scheduler of a parameter-server cluster.
#[derive(Debug, Clone, Parser)]
#[command(name = "scheduler", version, about)]
pub struct Args {
    /// TOML file with any of the settings below.
    #[arg(long, env = "PS_CONFIG")]
    pub config: Option<PathBuf>,
    /// gRPC address to listen on [default: 127.0.0.1:7000].
    #[arg(long, env = "PS_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// Prometheus `/metrics` address; no endpoint when unset.
    #[arg(long, env = "PS_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
    /// Directory of the durable job state and job checkpoint manifests (required unless
    /// --in-memory).
    #[arg(long, env = "PS_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Keep the job state in memory only: a restart forgets every job.
    #[arg(long, env = "PS_IN_MEMORY")]
    pub in_memory: bool,
    /// Lease of shards and workers, in milliseconds [default: 5000].
    #[arg(long, env = "PS_LEASE_MS")]
    pub lease_ms: Option<u64>,
    /// Milliseconds between turning NOT_SERVING and closing the listener on shutdown [default: 0].
    #[arg(long, env = "PS_DRAIN_MS")]
    pub drain_ms: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FileConfig {
    pub listen: Option<SocketAddr>,
    pub metrics_listen: Option<SocketAddr>,
    pub data_dir: Option<PathBuf>,
    pub in_memory: Option<bool>,
    pub lease_ms: Option<u64>,
    pub drain_ms: Option<u64>,
    /// Longest single AdvanceClock wait before it answers `ready = false`.
    pub max_wait_ms: Option<u64>,
    pub checkpoint_timeout_ms: Option<u64>,
}

/// The resolved configuration `run` takes.
#[derive(Debug, Clone)]
pub struct Config {
    pub listen: SocketAddr,
    pub metrics_listen: Option<SocketAddr>,
    pub drain: Duration,
    pub scheduler: SchedulerConfig,
}

impl Config {
    /// A scheduler on an ephemeral loopback port keeping its state in `data_dir`: what tests
    /// and the bench start.
    pub fn local(data_dir: Option<PathBuf>) -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            metrics_listen: None,
            drain: Duration::ZERO,
            scheduler: SchedulerConfig {
                data_dir,
                ..SchedulerConfig::default()
            },
        }
    }

    pub fn resolve(args: Args) -> anyhow::Result<Self> {
        let file: FileConfig = match &args.config {
            Some(p) => ps_runtime::config::load_toml(p)?,
            None => FileConfig::default(),
        };
        let in_memory = args.in_memory || file.in_memory.unwrap_or(false);
        let data_dir = args.data_dir.or(file.data_dir);
        if !in_memory && data_dir.is_none() {
            anyhow::bail!(
                "--data-dir (PS_DATA_DIR) is required; pass --in-memory to run without durable job state"
            );
        }
        let d = SchedulerConfig::default();
        let lease = args
            .lease_ms
            .or(file.lease_ms)
            .map_or(d.lease, Duration::from_millis);
        if lease < Duration::from_millis(100) {
            anyhow::bail!("--lease-ms must be at least 100");
        }
        Ok(Self {
            listen: args
                .listen
                .or(file.listen)
                .unwrap_or(SocketAddr::from(([127, 0, 0, 1], 7000))),
            metrics_listen: args.metrics_listen.or(file.metrics_listen),
            drain: Duration::from_millis(args.drain_ms.or(file.drain_ms).unwrap_or(0)),
            scheduler: SchedulerConfig {
                data_dir: if in_memory { None } else { data_dir },
                lease,
                max_wait: file.max_wait_ms.map_or(d.max_wait, Duration::from_millis),
                tick: d.tick.min(lease / 4),
                checkpoint_timeout: file
                    .checkpoint_timeout_ms
                    .map_or(d.checkpoint_timeout, Duration::from_millis),
            },
        })
    }
}
