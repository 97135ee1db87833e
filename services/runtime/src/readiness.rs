//! Whether a service is ready for traffic, for probes that cannot speak gRPC: `GET /healthz`
//! (the process answers: alive) and `GET /readyz` (200 while the gRPC server serves, 503 before
//! it does and from the moment shutdown begins) on the metrics port. The gRPC server sets it
//! together with `grpc.health.v1` (`crate::grpc::serve`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// One service's readiness, shared by its gRPC server (which sets it) and its metrics
/// endpoint (which answers `/readyz` from it). Starts not ready.
#[derive(Debug, Clone, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    pub fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::Release);
    }

    pub fn is_ready(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}
