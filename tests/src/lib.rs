//! Helpers for cross-service tests: real shards on 127.0.0.1 with real RocksDB directories,
//! in-process ([`TestCluster`]) or as child processes ([`shard_process`],
//! [`scheduler_process`], through the one launcher `ps_launch`).

pub mod raw;

use std::path::{Path, PathBuf};
use std::time::Duration;

use ps_launch::{Service, binary};

use ps_client::{ClientConfig, PsClient};
use ps_server::ServerConfig;
use tempfile::TempDir;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// A cluster of in-process shards, each serving gRPC on its own loopback port.
#[derive(Debug)]
pub struct TestCluster {
    pub endpoints: Vec<String>,
    pub data_dirs: Vec<PathBuf>,
    shutdown: CancellationToken,
    servers: Vec<JoinHandle<anyhow::Result<()>>>,
    _dir: TempDir,
}

impl TestCluster {
    /// `n` durable shards with default settings.
    pub async fn start(n: u32) -> Self {
        Self::start_with(n, |_| {}).await
    }

    /// `n` durable shards; `tweak` adjusts each shard's config.
    pub async fn start_with(n: u32, tweak: impl Fn(&mut ServerConfig)) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let shutdown = CancellationToken::new();
        let mut endpoints = Vec::new();
        let mut data_dirs = Vec::new();
        let mut servers = Vec::new();
        for i in 0..n {
            let data = dir.path().join(format!("shard-{i}"));
            let mut cfg = ServerConfig::local(Some(data.clone()));
            cfg.shard_index = i;
            cfg.num_shards = n;
            tweak(&mut cfg);
            let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
            endpoints.push(format!("http://{}", listener.local_addr().expect("addr")));
            data_dirs.push(data);
            servers.push(tokio::spawn(ps_server::run(
                cfg,
                listener,
                None,
                shutdown.clone(),
            )));
        }
        Self {
            endpoints,
            data_dirs,
            shutdown,
            servers,
            _dir: dir,
        }
    }

    /// A client connected to every shard.
    pub async fn client(&self) -> PsClient {
        PsClient::connect(ClientConfig::new(self.endpoints.clone()))
            .await
            .expect("client connects")
    }

    /// Stops every shard and checks that each stopped cleanly.
    pub async fn stop(self) {
        self.shutdown.cancel();
        for s in self.servers {
            s.await
                .expect("server task")
                .expect("server stopped cleanly");
        }
    }
}

/// Starts the workspace binary `bin` as a child named `name` with `args`, its log in `logs`;
/// `ready`: it writes a ready file (passed as `--ready-file`) to wait on with
/// [`Service::ready`].
pub fn spawn(bin: &str, name: &str, args: &[&str], logs: &Path, ready: bool) -> Service {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    Service::spawn(&binary(bin).expect("the binary"), name, &args, logs, ready)
        .expect("the service starts")
}

/// How long a child service may take to become ready.
const READY: Duration = Duration::from_secs(60);

/// Starts a `ps-server` child (its data in `data`, its log in `logs/` beside it) registered
/// with `scheduler`, and waits until it serves.
pub async fn shard_process(data: &Path, index: u32, n: u32, scheduler: &str) -> Service {
    let args: Vec<String> = [
        "--data-dir",
        &data.display().to_string(),
        "--listen",
        "127.0.0.1:0",
        "--shard-index",
        &index.to_string(),
        "--num-shards",
        &n.to_string(),
        "--scheduler",
        scheduler,
    ]
    .map(str::to_owned)
    .into();
    let logs = data.parent().expect("a data dir in a folder").join("logs");
    let bin = binary("ps-server").expect("the ps-server binary");
    let mut s = Service::spawn(&bin, &format!("shard-{index}"), &args, &logs, true)
        .expect("ps-server starts");
    s.ready(READY).await.expect("ps-server ready");
    s
}

/// Starts a `scheduler` child on `listen` (its state in `data`, its log in `logs/` beside it)
/// with `extra` flags; returns it and its URL once it serves.
pub async fn scheduler_process(data: &Path, listen: &str, extra: &[&str]) -> (Service, String) {
    let mut args: Vec<String> = [
        "--data-dir",
        &data.display().to_string(),
        "--listen",
        listen,
    ]
    .map(str::to_owned)
    .into();
    args.extend(extra.iter().map(|a| a.to_string()));
    let logs = data.parent().expect("a data dir in a folder").join("logs");
    let bin = binary("scheduler").expect("the scheduler binary");
    let mut s = Service::spawn(&bin, "scheduler", &args, &logs, true).expect("scheduler starts");
    let url = s.ready(READY).await.expect("scheduler ready").url();
    (s, url)
}

/// What test workers saw: per clock they started, (worker index, clock, the parameters pulled).
pub type Seen = std::sync::Arc<parking_lot::Mutex<Vec<(usize, u64, Vec<f32>)>>>;

/// The highest clock worker `w` has started, as recorded in `seen`.
pub fn max_clock(seen: &Seen, w: usize) -> u64 {
    seen.lock()
        .iter()
        .filter(|(i, _, _)| *i == w)
        .map(|(_, c, _)| *c)
        .max()
        .unwrap_or(0)
}

/// Waits until each of `workers` has started clock `clock` (failing after a minute).
pub async fn wait_for_clocks(seen: &Seen, workers: &[usize], clock: u64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !workers.iter().all(|&w| max_clock(seen, w) >= clock) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "workers {workers:?} never reached clock {clock}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Runs `psctl --scheduler URL ARGS...`; returns its exit code and what it printed (stdout,
/// then stderr).
pub fn psctl(scheduler: &str, args: &[&str]) -> (Option<i32>, String) {
    let out = std::process::Command::new(ps_launch::binary("psctl").unwrap())
        .args(["--scheduler", scheduler])
        .args(args)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}
