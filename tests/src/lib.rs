//! Helpers for cross-service tests: real shards on 127.0.0.1 with real RocksDB directories.

use std::path::PathBuf;

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
