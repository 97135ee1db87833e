//! `ps-server` configuration: flags with `PS_*` environment fallbacks, and an optional TOML
//! file (`--config`) that may set the same knobs plus the tunables. Flag or variable beats file
//! beats default.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use ps_core::partition::DEFAULT_VIRTUAL_NODES;
use ps_runtime::service::{ServiceArgs, ServiceConfig, ServiceDefaults, load_service_file};
use serde::Deserialize;

use crate::store::RocksOptions;

/// A parameter-server shard.
#[derive(Debug, Clone, Parser)]
#[command(name = "ps-server", version, about)]
pub struct Args {
    #[command(flatten)]
    pub service: ServiceArgs,
    /// This shard's index, 0-based [default: 0].
    #[arg(long, env = "PS_SHARD_INDEX")]
    pub shard_index: Option<u32>,
    /// Number of shards in the cluster [default: 1].
    #[arg(long, env = "PS_NUM_SHARDS")]
    pub num_shards: Option<u32>,
    /// fsync the WAL on every group commit, to survive machine crashes as well.
    #[arg(long, env = "PS_SYNC")]
    pub sync: bool,
    /// Largest request accepted, in bytes [default: 67108864].
    #[arg(long, env = "PS_MAX_REQUEST_BYTES")]
    pub max_request_bytes: Option<usize>,
    /// Most bytes the tables' parameters and optimizer state may take on this shard: a table
    /// or a push that would pass it is refused (`resource_exhausted`), and a stored table that
    /// would is left unloaded at start-up [default: 3/4 of the memory this process may use:
    /// the smaller of the machine's, the cgroup's limit and half the address-space limit].
    #[arg(long, env = "PS_MEMORY_BUDGET_BYTES")]
    pub memory_budget_bytes: Option<u64>,
    /// Most MiB of sparse rows a durable shard keeps in memory: the store holds every row, this
    /// cache the hot ones (CLOCK eviction). Part of the memory budget [default: a quarter of
    /// the memory budget].
    #[arg(long, env = "PS_CACHE_MIB")]
    pub cache_mib: Option<u64>,
    /// Most tables one job (the tables named `<job>/...`) may have on this shard [default: no
    /// limit].
    #[arg(long, env = "PS_JOB_MAX_TABLES")]
    pub job_max_tables: Option<u32>,
    /// Most bytes of parameters and optimizer state one job's tables may take on this shard:
    /// a table or a push of new sparse rows past it is refused [default: no limit].
    #[arg(long, env = "PS_JOB_MAX_BYTES")]
    pub job_max_bytes: Option<u64>,
    /// Before starting, verify this checkpoint directory and copy it into the (empty) data dir.
    #[arg(long, env = "PS_RESTORE_FROM")]
    pub restore_from: Option<PathBuf>,
    /// The scheduler to register with (http://host:port); without it the shard map is static.
    #[arg(long, env = "PS_SCHEDULER")]
    pub scheduler: Option<String>,
    /// The URL workers reach this shard at [default: http://<listen address>].
    #[arg(long, env = "PS_ADVERTISE")]
    pub advertise: Option<String>,
    /// Address of the bulk stream (plain-f32 dense pushes and pulls without HTTP/2), or `off`
    /// [default: the --listen address's IP, a port the system picks]. Clients reach it on the
    /// host of the shard's gRPC endpoint and fall back to gRPC when they cannot.
    #[arg(long, env = "PS_BULK_LISTEN")]
    pub bulk_listen: Option<BulkListen>,
}

/// Where the bulk stream listens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BulkListen {
    Off,
    At(SocketAddr),
}

impl std::str::FromStr for BulkListen {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.eq_ignore_ascii_case("off") {
            return Ok(Self::Off);
        }
        s.parse()
            .map(Self::At)
            .map_err(|e| format!("`{s}` is neither an address (ip:port) nor `off`: {e}"))
    }
}

impl<'de> Deserialize<'de> for BulkListen {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// The shard's own keys of its TOML file (the shared ones are [`ServiceFile`]'s). Every field
/// is optional; unknown keys are errors.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FileConfig {
    pub shard_index: Option<u32>,
    pub num_shards: Option<u32>,
    pub max_request_bytes: Option<usize>,
    pub memory_budget_bytes: Option<u64>,
    pub cache_mib: Option<u64>,
    pub job_max_tables: Option<u32>,
    pub job_max_bytes: Option<u64>,
    pub max_answer_bytes: Option<u64>,
    pub scheduler: Option<String>,
    pub advertise: Option<String>,
    pub bulk_listen: Option<BulkListen>,
    pub bulk_budget_bytes: Option<usize>,
    pub bulk_frame_timeout_ms: Option<u64>,
    pub bulk_idle_timeout_s: Option<u64>,
    pub virtual_nodes: Option<u32>,
    pub group_commit_bytes: Option<usize>,
    pub writer_spin_us: Option<u64>,
    pub inline_push_bytes: Option<usize>,
    pub max_queued_bytes: Option<usize>,
    pub pull_replica_bytes: Option<usize>,
    pub rocksdb: Option<RocksOptions>,
}

/// The resolved configuration `run` takes.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Addresses, data directory (`None` in the in-memory mode), shutdown timings.
    pub service: ServiceConfig,
    pub shard_index: u32,
    pub num_shards: u32,
    pub virtual_nodes: u32,
    pub max_request_bytes: usize,
    /// Most bytes the tables' cells may take.
    pub memory_budget_bytes: u64,
    /// Most bytes of sparse rows a durable shard keeps in memory, out of the memory budget.
    pub cache_bytes: u64,
    /// What one job's tables may take on this shard.
    pub job_quota: crate::engine::JobQuota,
    /// Most bytes of values one pull answers.
    pub max_answer_bytes: u64,
    pub group_commit_bytes: usize,
    /// How long the writer stays awake for the next push after a small group.
    pub writer_spin: std::time::Duration,
    /// Dense pushes of more than 64 KiB and at most this many bytes are committed by the
    /// connection that received them when the writer is idle, instead of being handed to the
    /// writer thread; 0: never.
    pub inline_push_bytes: usize,
    pub max_queued_bytes: usize,
    /// Memory for the per-client replicas that delta pulls diff against.
    pub pull_replica_bytes: usize,
    pub rocksdb: RocksOptions,
    pub restore_from: Option<PathBuf>,
    /// The scheduler this shard registers with; `None`: a static map (epoch 0).
    pub scheduler: Option<String>,
    /// The URL the scheduler publishes for this shard.
    pub advertise: Option<String>,
    /// The bulk stream's address; `None`: no bulk stream (clients use gRPC for everything).
    pub bulk_listen: Option<SocketAddr>,
    /// Most bytes of bodies the bulk stream holds at once across its connections.
    pub bulk_budget_bytes: usize,
    /// Longest a bulk call may go without a byte once begun; the connection is then closed.
    pub bulk_frame_timeout: Duration,
    /// Longest a bulk connection may stay open between calls.
    pub bulk_idle_timeout: Duration,
    /// The time sparse rows are aged by: the system's, or a manual one in tests.
    pub clock: crate::engine::Clock,
}

const DEFAULTS: ServiceDefaults = ServiceDefaults {
    listen: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 7070),
    grace: Duration::from_secs(30),
    state: "shard's RocksDB state and checkpoints",
};

impl ServerConfig {
    /// Defaults for a single durable shard at `data_dir` (or in memory when `None`), listening
    /// on an ephemeral loopback port: what tests and the bench start.
    pub fn local(data_dir: Option<PathBuf>) -> Self {
        Self {
            service: ServiceConfig::local(data_dir, DEFAULTS.grace),
            shard_index: 0,
            num_shards: 1,
            virtual_nodes: DEFAULT_VIRTUAL_NODES,
            max_request_bytes: 64 << 20,
            memory_budget_bytes: default_memory_budget(),
            cache_bytes: default_memory_budget() / 4,
            job_quota: crate::engine::JobQuota::default(),
            max_answer_bytes: 256 << 20,
            group_commit_bytes: 64 << 20,
            writer_spin: std::time::Duration::from_micros(250),
            inline_push_bytes: 1 << 20,
            max_queued_bytes: 1 << 30,
            pull_replica_bytes: 512 << 20,
            rocksdb: RocksOptions::default(),
            restore_from: None,
            scheduler: None,
            advertise: None,
            bulk_listen: Some(SocketAddr::from(([127, 0, 0, 1], 0))),
            bulk_budget_bytes: 256 << 20,
            bulk_frame_timeout: Duration::from_secs(10),
            bulk_idle_timeout: Duration::from_secs(600),
            clock: crate::engine::Clock::system(),
        }
    }

    /// Merges flags over the file over the defaults, and checks the result.
    pub fn resolve(args: Args) -> anyhow::Result<Self> {
        let (shared, file): (_, FileConfig) = load_service_file(args.service.config.as_deref())?;
        let service = args.service.resolve(shared, DEFAULTS)?;
        let d = Self::local(None);
        let mut rocksdb = file.rocksdb.unwrap_or_default();
        rocksdb.sync |= args.sync;
        let bulk_listen = match args.bulk_listen.or(file.bulk_listen) {
            Some(BulkListen::Off) => None,
            Some(BulkListen::At(a)) => Some(a),
            None => Some(SocketAddr::new(service.listen.ip(), 0)),
        };
        let mut cfg = Self {
            service,
            shard_index: args.shard_index.or(file.shard_index).unwrap_or(0),
            num_shards: args.num_shards.or(file.num_shards).unwrap_or(1),
            virtual_nodes: file.virtual_nodes.unwrap_or(d.virtual_nodes),
            max_request_bytes: args
                .max_request_bytes
                .or(file.max_request_bytes)
                .unwrap_or(d.max_request_bytes),
            memory_budget_bytes: args
                .memory_budget_bytes
                .or(file.memory_budget_bytes)
                .unwrap_or(d.memory_budget_bytes),
            cache_bytes: 0,
            job_quota: crate::engine::JobQuota {
                max_tables: args.job_max_tables.or(file.job_max_tables),
                max_bytes: args.job_max_bytes.or(file.job_max_bytes),
            },
            max_answer_bytes: file.max_answer_bytes.unwrap_or(d.max_answer_bytes),
            group_commit_bytes: file.group_commit_bytes.unwrap_or(d.group_commit_bytes),
            writer_spin: file
                .writer_spin_us
                .map_or(d.writer_spin, std::time::Duration::from_micros),
            inline_push_bytes: file.inline_push_bytes.unwrap_or(d.inline_push_bytes),
            max_queued_bytes: file.max_queued_bytes.unwrap_or(d.max_queued_bytes),
            pull_replica_bytes: file.pull_replica_bytes.unwrap_or(d.pull_replica_bytes),
            rocksdb,
            restore_from: args.restore_from,
            scheduler: args.scheduler.or(file.scheduler),
            advertise: args.advertise.or(file.advertise),
            bulk_listen,
            bulk_budget_bytes: file.bulk_budget_bytes.unwrap_or(d.bulk_budget_bytes),
            bulk_frame_timeout: file
                .bulk_frame_timeout_ms
                .map_or(d.bulk_frame_timeout, Duration::from_millis),
            bulk_idle_timeout: file
                .bulk_idle_timeout_s
                .map_or(d.bulk_idle_timeout, Duration::from_secs),
            clock: d.clock,
        };
        cfg.cache_bytes = match args.cache_mib.or(file.cache_mib) {
            Some(0) => anyhow::bail!("--cache-mib must be at least 1"),
            Some(mib) => mib.saturating_mul(1 << 20),
            None => cfg.memory_budget_bytes / 4,
        };
        if file.bulk_budget_bytes.is_none() {
            // Room for a few calls of the largest size.
            cfg.bulk_budget_bytes = cfg.bulk_budget_bytes.max(cfg.max_request_bytes * 4);
        }
        cfg.check()?;
        Ok(cfg)
    }

    pub fn check(&self) -> anyhow::Result<()> {
        if self.num_shards == 0 {
            anyhow::bail!("--num-shards must be at least 1");
        }
        if self.shard_index >= self.num_shards {
            anyhow::bail!(
                "--shard-index {} is out of range for --num-shards {} (indexes start at 0)",
                self.shard_index,
                self.num_shards
            );
        }
        if self.cache_bytes > self.memory_budget_bytes / 4 * 3 {
            anyhow::bail!(
                "--cache-mib {} is more than 3/4 of the memory budget ({} MiB)",
                self.cache_bytes >> 20,
                (self.memory_budget_bytes / 4 * 3) >> 20
            );
        }
        if self.max_request_bytes < 1024 {
            anyhow::bail!("--max-request-bytes must be at least 1024");
        }
        // A pull of one whole chunk of the largest allowed size must fit one answer.
        let chunk_bytes = ps_core::table::MAX_CHUNK_ELEMS * 4;
        if self.max_answer_bytes < chunk_bytes {
            anyhow::bail!(
                "max_answer_bytes must be at least {chunk_bytes} (one chunk of the largest size)"
            );
        }
        if self.bulk_budget_bytes < self.max_request_bytes {
            anyhow::bail!(
                "bulk_budget_bytes ({}) must be at least max_request_bytes ({})",
                self.bulk_budget_bytes,
                self.max_request_bytes
            );
        }
        if self.restore_from.is_some() && self.service.data_dir.is_none() {
            anyhow::bail!("--restore-from needs a --data-dir to restore into");
        }
        Ok(())
    }
}

/// 3/4 of the memory this process may use: the smaller of the machine's (`MemTotal`), its
/// cgroup's limit (`memory.max`, v2) and half its address-space limit (`RLIMIT_AS`, which also
/// counts mappings that are not memory). 8 GiB when none can be read.
pub fn default_memory_budget() -> u64 {
    let read = |path: &str| std::fs::read_to_string(path).ok();
    let total = read("/proc/meminfo").and_then(|m| {
        m.lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map(|kib| kib * 1024)
    });
    let cgroup = read("/sys/fs/cgroup/memory.max").and_then(|v| v.trim().parse::<u64>().ok());
    let address_space = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_AS)
        .ok()
        .map(|(soft, _)| soft)
        .filter(|&l| l != nix::sys::resource::RLIM_INFINITY)
        .map(|l| l / 2);
    [total, cgroup, address_space]
        .into_iter()
        .flatten()
        .min()
        .map_or(8 << 30, |m| m / 4 * 3)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(extra: &[&str]) -> Args {
        Args::parse_from(std::iter::once("ps-server").chain(extra.iter().copied()))
    }

    fn file(text: &str) -> (tempfile::TempDir, String) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ps.toml");
        std::fs::write(&path, text).unwrap();
        let p = path.to_str().unwrap().to_owned();
        (dir, p)
    }

    #[test]
    fn flags_beat_the_file_which_beats_defaults() {
        let (_d, path) = file(
            "listen = \"127.0.0.1:9000\"\ndata_dir = \"/tmp/x\"\nnum_shards = 4\nshard_index = 3\n\
             group_commit_bytes = 1024\nwriter_spin_us = 0\ninline_push_bytes = 0\n[rocksdb]\nwrite_buffer_mib = 32\n",
        );
        let cfg = ServerConfig::resolve(args(&[
            "--config",
            &path,
            "--listen",
            "127.0.0.1:9001",
            "--sync",
        ]))
        .unwrap();
        assert_eq!(cfg.service.listen.port(), 9001);
        assert_eq!((cfg.shard_index, cfg.num_shards), (3, 4));
        assert_eq!(cfg.group_commit_bytes, 1024);
        assert!(cfg.writer_spin.is_zero());
        assert_eq!(cfg.inline_push_bytes, 0);
        assert_eq!(cfg.rocksdb.write_buffer_mib, 32);
        assert!(cfg.rocksdb.sync);
        assert_eq!(
            cfg.service.data_dir.as_deref(),
            Some(std::path::Path::new("/tmp/x"))
        );
        assert_eq!(cfg.max_request_bytes, 64 << 20);
        // The bulk stream follows --listen's IP unless told otherwise.
        assert_eq!(cfg.bulk_listen, Some("127.0.0.1:0".parse().unwrap()));
        let (_d, path) = file("in_memory = true\nbulk_listen = \"off\"\n");
        let cfg = ServerConfig::resolve(args(&["--config", &path])).unwrap();
        assert_eq!(cfg.bulk_listen, None);
        let cfg =
            ServerConfig::resolve(args(&["--config", &path, "--bulk-listen", "0.0.0.0:7071"]))
                .unwrap();
        assert_eq!(cfg.bulk_listen, Some("0.0.0.0:7071".parse().unwrap()));
    }

    #[test]
    fn mistakes_are_explained() {
        let (_d, path) = file("lisen = \"127.0.0.1:9000\"\n");
        let e = ServerConfig::resolve(args(&["--config", &path])).unwrap_err();
        assert!(format!("{e:#}").contains("unknown field `lisen`"), "{e:#}");
        let e = ServerConfig::resolve(args(&[])).unwrap_err();
        assert!(e.to_string().contains("--data-dir"), "{e}");
        let e = ServerConfig::resolve(args(&[
            "--data-dir",
            "/tmp/x",
            "--shard-index",
            "2",
            "--num-shards",
            "2",
        ]))
        .unwrap_err();
        assert!(e.to_string().contains("out of range"), "{e}");
        let cfg = ServerConfig::resolve(args(&["--in-memory"])).unwrap();
        assert!(cfg.service.data_dir.is_none());
        let e = Args::try_parse_from(["ps-server", "--bulk-listen", "7071"]).unwrap_err();
        assert!(e.to_string().contains("neither an address"), "{e}");
    }
}
