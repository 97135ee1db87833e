//! A training worker for the parameter server: data loaders and generators ([`data`]), models
//! written once against a compute backend ([`backend`], [`model`]), the training loop that
//! pulls, computes, pushes and reports clocks to the scheduler ([`train`]), the run directory
//! it leaves ([`run`]), and the model tables a job file's model needs ([`job`]).
//! The bandwidth emulator (`--link-mbps`) is the client transport's: [`ps_client::Link`].
//! The local cluster and the experiments runner that start workers are tools: `ps-cli`.

pub mod backend;
pub mod data;
pub mod job;
pub mod model;
pub mod run;
pub mod train;

pub use train::{LrSchedule, SspRefresh, WorkerConfig, run as run_worker};
