//! The ready file: a service that is given `--ready-file PATH` writes there, atomically, the
//! addresses it serves on once it is ready for requests. A launcher (the test kit, `psctl
//! local`, a script) waits for the file instead of parsing logs or guessing free ports: every
//! service binds port 0 itself and says which port it got, so no port is handed from one
//! process to another and no two starts can race for one.

use std::net::SocketAddr;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// What a ready service announces.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ready {
    /// The process that wrote the file (a launcher tells a stale file from a fresh one).
    pub pid: u32,
    /// The gRPC address.
    pub grpc: SocketAddr,
    /// The Prometheus `/metrics` address, when the service serves one.
    pub metrics: Option<SocketAddr>,
    /// The bulk stream's address (shards), when there is one.
    pub bulk: Option<SocketAddr>,
}

impl Ready {
    /// The service's gRPC address as this process: `grpc`, and `metrics` when given.
    pub fn new(grpc: SocketAddr, metrics: Option<SocketAddr>) -> Self {
        Self {
            pid: std::process::id(),
            grpc,
            metrics,
            bulk: None,
        }
    }

    /// What a service serving on `grpc` (and `/metrics` on `metrics`) announces.
    pub fn of(
        grpc: &tokio::net::TcpListener,
        metrics: Option<&tokio::net::TcpListener>,
    ) -> std::io::Result<Self> {
        Ok(Self::new(
            grpc.local_addr()?,
            metrics
                .map(tokio::net::TcpListener::local_addr)
                .transpose()?,
        ))
    }

    /// The URL clients reach the gRPC address at.
    pub fn url(&self) -> String {
        format!("http://{}", self.grpc)
    }

    /// Writes the file (atomically: a reader sees the whole file or none). Nothing when `path`
    /// is `None`.
    pub fn announce(&self, path: Option<&Path>) -> std::io::Result<()> {
        let Some(path) = path else {
            return Ok(());
        };
        let bytes = serde_json::to_vec(self).map_err(std::io::Error::other)?;
        crate::config::write_atomic(path, &bytes)
    }

    /// The file at `path`, when it holds a complete announcement.
    pub fn read(path: &Path) -> Option<Self> {
        let bytes = std::fs::read(path).ok()?;
        serde_json::from_slice(&bytes).ok()
    }
}
