//! What the SDK hands back: a shard's identity, what a push did, a shard's checkpoint. Status
//! and statistics types are `ps_core::status`'s, shared with the services.

use ps_codec::Encoded;
use ps_proto::v1 as pb;

/// A shard's identity as it reported it.
#[derive(Debug, Clone)]
pub struct ShardInfo {
    pub endpoint: String,
    pub shard_index: u32,
    pub num_shards: u32,
    pub durable: bool,
    pub max_request_bytes: u64,
    pub server_version: String,
    /// The shard's bulk-stream port; 0 when it has none.
    pub bulk_port: u16,
    /// Most bytes of sparse rows the shard keeps in memory; 0 without a store.
    pub cache_budget_bytes: u64,
}

/// What a push did, summed over the shards it touched.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PushSummary {
    pub requests: u64,
    /// Requests a shard had already applied (a retry whose first answer was lost).
    pub duplicates: u64,
    pub applied_values: u64,
    pub skipped_non_finite: u64,
    /// Payload bytes sent (after the codec and lz4).
    pub wire_bytes: u64,
    /// Rows (ids) a sparse push sent: a sparse codec's push leaves out the rows it has no
    /// entry for. 0 for dense pushes.
    pub rows: u64,
    /// What the same values take as f32.
    pub raw_bytes: u64,
    /// The tensor positions a dense push carried when its codec sends only some of them
    /// (top-k, random-k), ascending; `None` when it carried every position, and for sparse
    /// pushes. Momentum correction clears the momentum where a position was sent.
    pub sent: Option<Vec<usize>>,
}

impl PushSummary {
    /// Counts a payload sent, standing for `values` values.
    pub(crate) fn add_payload(&mut self, e: &Encoded, values: u64) {
        self.wire_bytes += crate::push::wire_len(e);
        self.raw_bytes += values * 4;
    }

    pub(crate) fn add(&mut self, r: &pb::PushResponse) {
        self.requests += 1;
        self.duplicates += u64::from(r.duplicate);
        self.applied_values += r.applied_values;
        self.skipped_non_finite += r.skipped_non_finite;
    }
}

/// What deleting a checkpoint did on one shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deleted {
    /// False when the shard had no checkpoint of that name.
    pub deleted: bool,
    /// Bytes of files no longer linked anywhere on the shard's disk.
    pub freed_bytes: u64,
}

/// A checkpoint taken on one shard.
#[derive(Debug, Clone)]
pub struct ShardCheckpoint {
    pub shard: usize,
    pub name: String,
    pub path: String,
    pub files: u64,
    pub bytes: u64,
    pub sequence: u64,
}
