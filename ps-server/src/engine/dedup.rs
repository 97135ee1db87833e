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
    pub(super) fn record(&mut self, id: &PushId, batch: &mut impl StoreBatch) {
        let w = self.clients.entry(id.client_id).or_default();
        w.applied.insert(id.seq);
        batch.put(Cf::Meta, &dedup_key(id.client_id, id.seq), &[]);
        if id.min_unacked_seq > w.floor {
            w.floor = id.min_unacked_seq;
            w.applied = w.applied.split_off(&w.floor);
            batch.delete_range(
                Cf::Meta,
                &dedup_key(id.client_id, 0),
                &dedup_key(id.client_id, w.floor),
            );
            batch.put(Cf::Meta, &floor_key(id.client_id), &w.floor.to_le_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemoryBatch;

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
}
