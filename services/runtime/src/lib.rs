//! What every service of the cluster shares, set up the same way everywhere:
//!
//! - [`telemetry`]: logs (env filter, formatted) and OpenTelemetry traces when
//!   `OTEL_EXPORTER_OTLP_ENDPOINT` is set;
//! - [`metrics`]: the Prometheus recorder with a build-info metric, and the `/metrics` endpoint;
//! - [`shutdown`]: SIGINT/SIGTERM cancel one token;
//! - [`grpc`]: the gRPC server scaffold: health, reflection (v1 and v1alpha), window sizes, and
//!   the drain-then-stop shutdown sequence;
//! - [`config`]: loading an optional TOML file of tunables;
//! - [`service`]: the flags every service has (addresses, data dir, drain, ready file), once;
//! - [`ready`]: the ready file a service writes with the addresses it got;
//! - [`trace`]: each call answered in a server span joined to the caller's trace context;
//! - [`status`]: refusals with a `google.rpc.ErrorInfo` reason, for any client to act on;
//! - [`tls`]: TLS (mutual when asked) on every port, certificates reloaded when they change;
//! - [`auth`]: bearer tokens and certificate names with roles and jobs, checked on every call;
//! - [`heap`]: the allocator's thresholds for processes that move megabyte buffers.

#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used))]

pub mod auth;
pub mod config;
pub mod grpc;
pub mod heap;
pub mod metrics;
pub mod readiness;
pub mod ready;
pub mod service;
pub mod shutdown;
pub mod status;
pub mod telemetry;
pub mod tls;
pub mod trace;

pub use tokio_util::sync::CancellationToken;
