//! The partitioner: which shard owns a sparse id or a dense chunk.
//!
//! Clients route with it and shards enforce it, so both sides always agree. Sparse ids are placed
//! on a consistent-hash ring with `virtual_nodes` points per shard (adding a shard moves about
//! 1/n of the ids); dense chunks go round-robin from a per-table offset, so a tensor's chunks
//! spread evenly whatever its size.

use crate::hash::{combine, mix64};

/// Virtual nodes per shard on the ring unless configured otherwise.
pub const DEFAULT_VIRTUAL_NODES: u32 = 128;
/// Most virtual nodes per shard a cluster may use (the ring holds shards × virtual nodes).
pub const MAX_VIRTUAL_NODES: u32 = 4096;

/// Routes keys to shards. Cheap to clone; immutable once built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partitioner {
    num_shards: u32,
    virtual_nodes: u32,
    /// Ring points, sorted: (point, shard).
    ring: Vec<(u64, u32)>,
}

impl Partitioner {
    /// A partitioner over `num_shards` shards (at least 1) with `virtual_nodes` points each.
    pub fn new(num_shards: u32, virtual_nodes: u32) -> Self {
        let num_shards = num_shards.max(1);
        let virtual_nodes = virtual_nodes.max(1);
        let mut ring: Vec<(u64, u32)> = (0..num_shards)
            .flat_map(|s| (0..virtual_nodes).map(move |v| (combine(u64::from(s), u64::from(v)), s)))
            .collect();
        ring.sort_unstable();
        Self {
            num_shards,
            virtual_nodes,
            ring,
        }
    }

    pub fn num_shards(&self) -> u32 {
        self.num_shards
    }

    pub fn virtual_nodes(&self) -> u32 {
        self.virtual_nodes
    }

    /// The shard owning sparse id `id` of the table whose name hashes to `table_hash`.
    pub fn shard_for_id(&self, table_hash: u64, id: u64) -> u32 {
        if self.num_shards == 1 {
            return 0;
        }
        let point = mix64(id ^ table_hash);
        let i = self.ring.partition_point(|(p, _)| *p < point);
        // Past the last point the ring wraps to the first.
        self.ring.get(i).unwrap_or(&self.ring[0]).1
    }

    /// The shard owning chunk `chunk` of the dense table whose name hashes to `table_hash`.
    pub fn shard_for_chunk(&self, table_hash: u64, chunk: u64) -> u32 {
        let n = u64::from(self.num_shards);
        ((table_hash % n + chunk % n) % n) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn ids_spread_evenly() {
        let p = Partitioner::new(4, DEFAULT_VIRTUAL_NODES);
        let mut counts = [0u32; 4];
        for id in 0..100_000u64 {
            counts[p.shard_for_id(99, id) as usize] += 1;
        }
        for c in counts {
            // Within 20% of the even share with 128 virtual nodes.
            assert!((20_000..30_000).contains(&c), "{counts:?}");
        }
    }

    #[test]
    fn adding_a_shard_moves_about_one_nth() {
        let (a, b) = (Partitioner::new(4, 128), Partitioner::new(5, 128));
        let moved = (0..50_000u64)
            .filter(|&id| a.shard_for_id(1, id) != b.shard_for_id(1, id))
            .count();
        // Ideal: 1/5 of the ids move, all of them to the new shard.
        assert!((7_000..13_000).contains(&moved), "{moved}");
        assert!(
            (0..50_000u64)
                .all(|id| a.shard_for_id(1, id) == b.shard_for_id(1, id)
                    || b.shard_for_id(1, id) == 4)
        );
    }

    #[test]
    fn chunks_go_round_robin() {
        let p = Partitioner::new(3, 8);
        let owners: Vec<u32> = (0..6).map(|c| p.shard_for_chunk(10, c)).collect();
        assert_eq!(owners, [1, 2, 0, 1, 2, 0]);
    }

    proptest! {
        #[test]
        fn every_key_has_a_valid_owner(n in 1u32..16, h: u64, id: u64) {
            let p = Partitioner::new(n, 16);
            prop_assert!(p.shard_for_id(h, id) < n);
            prop_assert!(p.shard_for_chunk(h, id) < n);
            // The same inputs always give the same answer, on a freshly built ring too.
            prop_assert_eq!(p.shard_for_id(h, id), Partitioner::new(n, 16).shard_for_id(h, id));
        }
    }
}
