//! Exactly-once: the push ids each client has had applied. A client promises never to retry
//! below its `min_unacked_seq` (its floor), so only the ids above the floor are remembered.

use std::collections::{BTreeSet, HashMap};

use ps_core::PushId;

use super::keys::{dedup_key, floor_key};
use crate::store::{Cf, StoreBatch};

/// Applied push ids of one client: everything below `floor`, plus the set above it.
#[derive(Debug, Default)]
pub(super) struct ClientWindow {
    pub(super) floor: u64,
    pub(super) applied: BTreeSet<u64>,
}

#[derive(Debug, Default)]
pub(super) struct Dedup {
    pub(super) clients: HashMap<u64, ClientWindow>,
}

impl Dedup {
    pub(super) fn seen(&self, id: &PushId) -> bool {
        self.clients
            .get(&id.client_id)
            .is_some_and(|w| id.seq < w.floor || w.applied.contains(&id.seq))
    }

    /// Records `id` as applied, in memory and in `batch`, and forgets what the client's floor
    /// says it will never retry.
    ///
    /// The records below a new floor are deleted one by one: they are exactly the ones
    /// `applied` drops, as every stored record is loaded into `applied` at start-up. A range
    /// deletion per raised floor (one per push of a request-answer client) would cost far
    /// more: RocksDB rebuilds its fragmented list of a memtable's range tombstones at each new
    /// one, so every push would pay for all the pushes before it since the last flush (at 1 K
    /// floats a push, the writer ended in that rebuild and the shard's memory grew by
    /// gigabytes).
    pub(super) fn record(&mut self, id: &PushId, batch: &mut impl StoreBatch) {
        let w = self.clients.entry(id.client_id).or_default();
        w.applied.insert(id.seq);
        batch.put(Cf::Meta, &dedup_key(id.client_id, id.seq), &[]);
        if id.min_unacked_seq > w.floor {
            w.floor = id.min_unacked_seq;
            let kept = w.applied.split_off(&w.floor);
            for seq in std::mem::replace(&mut w.applied, kept) {
                batch.delete(Cf::Meta, &dedup_key(id.client_id, seq));
            }
            batch.put(Cf::Meta, &floor_key(id.client_id), &w.floor.to_le_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::keys::META_DEDUP;
    use crate::store::{MemoryBatch, RocksOptions, RocksStore, Store};

    fn id(client: u64, seq: u64, floor: u64) -> PushId {
        PushId {
            client_id: client,
            seq,
            min_unacked_seq: floor,
        }
    }

    #[test]
    fn dedup_remembers_what_a_client_may_retry_and_forgets_below_its_floor() {
        let mut d = Dedup::default();
        let mut b = MemoryBatch::default();
        d.record(&id(1, 5, 3), &mut b);
        d.record(&id(1, 7, 3), &mut b);
        assert!(d.seen(&id(1, 5, 3)) && d.seen(&id(1, 7, 3)));
        assert!(!d.seen(&id(1, 6, 3)) && !d.seen(&id(2, 5, 3)));
        // Below the floor counts as seen: the client promised never to retry it.
        assert!(d.seen(&id(1, 2, 3)));
        // Raising the floor to 7 drops the record of 5 but keeps 7.
        d.record(&id(1, 8, 7), &mut b);
        let w = &d.clients[&1];
        assert_eq!(w.floor, 7);
        assert_eq!(w.applied.iter().copied().collect::<Vec<_>>(), [7, 8]);
        assert!(d.seen(&id(1, 5, 7)) && d.seen(&id(1, 7, 7)) && !d.seen(&id(1, 9, 7)));
        // A floor that goes backwards (a delayed request) does not lower it.
        d.record(&id(1, 9, 4), &mut b);
        assert_eq!(d.clients[&1].floor, 7);
    }

    /// The push ids stored in RocksDB, as (client, seq).
    fn stored(store: &RocksStore) -> Vec<(u64, u64)> {
        let mut ids = Vec::new();
        store
            .scan(Cf::Meta, &[META_DEDUP], &mut |k, _| {
                let word = |r: std::ops::Range<usize>| u64::from_be_bytes(k[r].try_into().unwrap());
                ids.push((word(1..9), word(9..17)));
                Ok(())
            })
            .unwrap();
        ids
    }

    #[test]
    fn a_raised_floor_deletes_exactly_the_records_below_it_from_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let store = RocksStore::open(dir.path(), &RocksOptions::default()).unwrap();
        let mut d = Dedup::default();
        let write = |d: &mut Dedup, ids: &[PushId]| {
            let mut b = store.batch();
            for i in ids {
                d.record(i, &mut b);
            }
            store.write(b).unwrap();
        };
        // Two clients; out-of-order seqs above the floor are kept.
        write(
            &mut d,
            &[id(1, 1, 1), id(1, 3, 1), id(2, 1, 1), id(1, 2, 1)],
        );
        assert_eq!(stored(&store), [(1, 1), (1, 2), (1, 3), (2, 1)]);
        // Client 1's floor rises to 3: its records 1 and 2 go, 3 and 4 stay, client 2's too.
        write(&mut d, &[id(1, 4, 3)]);
        assert_eq!(stored(&store), [(1, 3), (1, 4), (2, 1)]);
        // Many request-answer pushes, each raising the floor: one record stays per client.
        let many: Vec<PushId> = (5..2_000).map(|s| id(1, s, s)).collect();
        for chunk in many.chunks(7) {
            write(&mut d, chunk);
        }
        assert_eq!(stored(&store), [(1, 1999), (2, 1)]);
        assert_eq!(d.clients[&1].applied.len(), 1);
    }
}
