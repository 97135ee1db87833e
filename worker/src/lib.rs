//! A training worker for the parameter server: data loaders and generators ([`data`]), models
//! written once against a compute backend ([`backend`], [`model`]), the training loop that
//! pulls, computes, pushes and reports clocks to the scheduler ([`train`]) with what moves over
//! the job ([`schedule`]), slow-machine emulation ([`emulate`]), momentum correction
//! ([`momentum`]) and the model cache under SSP ([`cache`]), evaluation ([`eval`]), its metrics ([`metrics`]), the run
//! directory it leaves ([`run`]), its flags ([`config`]), and the model tables a job file's
//! model needs ([`job`]).
//! The bandwidth emulator (`--link-mbps`) is the client transport's: [`ps_client::Link`].
//! The local cluster and the experiments runner that start workers are tools: `ps-cli`.

pub mod backend;
pub mod cache;
pub mod config;
pub mod data;
pub mod emulate;
pub mod eval;
pub mod job;
pub mod metrics;
pub mod model;
pub mod momentum;
pub mod run;
pub mod schedule;
pub mod train;

pub use config::WorkerConfig;
pub use schedule::{LrSchedule, SspRefresh};
pub use train::run as run_worker;
