//! The command-line tools of the cluster, behind the `psctl` binary: job control against a
//! running scheduler (`src/main.rs`), a job's checkpoint exported for serving ([`export`],
//! `psctl export`), the one-command local cluster ([`local`], `psctl local`) and the experiments
//! runner ([`experiments`], `psctl experiments`). Tools sit on top of the
//! services: this crate may depend on any of them, none of them on it.

pub mod experiments;
pub mod export;
pub mod local;
pub mod print;
