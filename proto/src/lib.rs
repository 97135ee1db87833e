//! The `ps.v1` wire protocol, generated once from `proto/ps/v1/ps.proto` (shards) and
//! `proto/ps/v1/scheduler.proto` (the scheduler).
//!
//! Generated types stop at the service edge: handlers convert them into `ps_core` domain types
//! (with validation) and nothing past the handlers sees them.

pub mod bulk;
pub mod codec;

/// Messages and the `ParameterServer` and `Scheduler` clients and servers of package `ps.v1`.
pub mod v1 {
    #![allow(missing_docs, clippy::all, clippy::pedantic)]
    tonic::include_proto!("ps.v1");
}

/// The encoded `FileDescriptorSet` of every `ps.v1` file, for gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/ps_descriptor.bin"));
