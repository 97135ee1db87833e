//! A training worker for the parameter server: data loaders and generators ([`data`]), models
//! written once against a compute backend ([`backend`], [`model`]), the training loop that
//! pulls, computes, pushes and reports clocks to the scheduler ([`train`]), the run directory
//! it leaves ([`run`]), the one-command local cluster ([`local`], behind `psctl local`) and the
//! experiments runner ([`experiments`], behind `psctl experiments`).
//! The bandwidth emulator (`--link-mbps`) is the client transport's: [`ps_client::Link`].

pub mod backend;
pub mod data;
pub mod experiments;
pub mod job;
pub mod local;
pub mod model;
pub mod run;
pub mod train;

pub use train::{LrSchedule, SspRefresh, WorkerConfig, run as run_worker};
