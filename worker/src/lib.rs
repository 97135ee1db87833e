//! A training worker for the parameter server: data loaders and generators ([`data`]), models
//! written once against a compute backend ([`backend`], [`model`]), the training loop that
//! pulls, computes, pushes and reports clocks to the scheduler ([`train`]), the run directory
//! it leaves ([`run`]), a bandwidth emulator ([`link`]) and the one-command local cluster
//! ([`local`], behind `psctl local`).

pub mod backend;
pub mod data;
pub mod job;
pub mod link;
pub mod local;
pub mod model;
pub mod run;
pub mod train;

pub use train::{WorkerConfig, run as run_worker};
