//! Exactly-once: the push ids each client has had applied. A client promises never to retry
//! below its `min_unacked_seq` (its floor), so only the ids above the floor are remembered.
//!
//! A push id goes into the store with its push's writes, except where the push log's record
//! of the push holds it (a dense push applied through the log): there the record is what
//! makes it durable, and replay takes the ids of the records it applies. Such an id waits in
//! memory ([`Dedup::record_logged`]) until the next write that moves the log's tail, which
//! takes every waiting id, floor and deletion with it ([`Dedup::store_waiting`]): a record
//! the tail leaves behind is never replayed again, so its ids must be in the store by then.
//! A group of dense pushes thus costs no store write at all, only its record. The store may
//! then lag memory (fewer ids, a lower floor, ids the floor has dropped): each only makes it
//! remember more, never forget an applied push.

use std::collections::{BTreeSet, HashMap, HashSet};

use ps_core::PushId;

use super::keys::{dedup_key, floor_key};
use crate::store::{Cf, StoreBatch};

/// Applied push ids of one client: everything below `floor`, plus the set above it.
#[derive(Debug, Default)]
pub(super) struct ClientWindow {
    pub(super) floor: u64,
    pub(super) applied: BTreeSet<u64>,
    /// Of `applied`, the ids that only the push log holds so far.
    logged: BTreeSet<u64>,
    /// Stored ids below the floor, whose deletion waits with the logged ids.
    dropped: Vec<u64>,
    /// The floor has risen since it was stored.
    floor_waits: bool,
}

#[derive(Debug, Default)]
pub(super) struct Dedup {
    pub(super) clients: HashMap<u64, ClientWindow>,
    /// The clients with ids, deletions or a floor waiting for the store.
    waiting: HashSet<u64>,
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
        if w.raise_floor(id, |seq| {
            batch.delete(Cf::Meta, &dedup_key(id.client_id, seq))
        }) {
            batch.put(Cf::Meta, &floor_key(id.client_id), &w.floor.to_le_bytes());
            w.floor_waits = false;
        }
    }

    /// Records `id` as applied in memory only: the push log's record of the push holds it.
    /// It goes into the store with the next write that moves the log's tail
    /// ([`Dedup::store_waiting`]), as do the floor it raises and the deletions that follow.
    pub(super) fn record_logged(&mut self, id: &PushId) {
        let w = self.clients.entry(id.client_id).or_default();
        w.applied.insert(id.seq);
        w.logged.insert(id.seq);
        let mut dropped = std::mem::take(&mut w.dropped);
        if w.raise_floor(id, |seq| dropped.push(seq)) {
            w.floor_waits = true;
        }
        w.dropped = dropped;
        self.waiting.insert(id.client_id);
    }

    /// Puts every waiting id, floor and deletion into `batch`.
    pub(super) fn store_waiting(&mut self, batch: &mut impl StoreBatch) {
        for client in self.waiting.drain() {
            let Some(w) = self.clients.get_mut(&client) else {
                continue;
            };
            for seq in std::mem::take(&mut w.logged) {
                batch.put(Cf::Meta, &dedup_key(client, seq), &[]);
            }
            for seq in w.dropped.drain(..) {
                batch.delete(Cf::Meta, &dedup_key(client, seq));
            }
            if std::mem::take(&mut w.floor_waits) {
                batch.put(Cf::Meta, &floor_key(client), &w.floor.to_le_bytes());
            }
        }
    }
}

impl ClientWindow {
    /// Raises the floor to `id`'s `min_unacked_seq` if that is higher, dropping the ids below
    /// it; `delete` is called with each dropped id the store holds. Returns whether it rose.
    fn raise_floor(&mut self, id: &PushId, mut delete: impl FnMut(u64)) -> bool {
        if id.min_unacked_seq <= self.floor {
            return false;
        }
        self.floor = id.min_unacked_seq;
        let kept = self.applied.split_off(&self.floor);
        for seq in std::mem::replace(&mut self.applied, kept) {
            // An id only the log held never reached the store: nothing to delete.
            if !self.logged.remove(&seq) {
                delete(seq);
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::keys::{META_DEDUP, META_FLOOR};
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

    /// The stored floors, as (client, floor).
    fn floors(store: &RocksStore) -> Vec<(u64, u64)> {
        let mut floors = Vec::new();
        store
            .scan(Cf::Meta, &[META_FLOOR], &mut |k, v| {
                let client = u64::from_be_bytes(k[1..9].try_into().unwrap());
                floors.push((client, u64::from_le_bytes(v.try_into().unwrap())));
                Ok(())
            })
            .unwrap();
        floors
    }

    /// Pipelining clients (acknowledgements out of order, floors rising), their pushes
    /// recorded now in the store or through the log at random, with the log's tail moving
    /// now and then: whenever it moves, the store holds exactly what recording every push at
    /// once would have left; in between, every applied push is in it, below its stored floor,
    /// or still held by the log (recorded through it since the tail last moved).
    #[test]
    fn ids_the_log_holds_reach_the_store_when_its_tail_moves_and_nothing_is_forgotten() {
        let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
        let [now, logged] = dirs
            .each_ref()
            .map(|d| RocksStore::open(d.path(), &RocksOptions::default()).unwrap());
        let (mut d_now, mut d_logged) = (Dedup::default(), Dedup::default());
        let mut rng = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        };
        // Per client: the next seq to send, and the seqs sent but not acknowledged.
        let mut clients: Vec<(u64, Vec<u64>)> = vec![(1, Vec::new()); 3];
        let mut since_tail: Vec<PushId> = Vec::new();
        let mut applied: Vec<PushId> = Vec::new();
        for step in 0..3_000 {
            let c = next(3) as usize;
            let (sent, unacked) = &mut clients[c];
            // Send up to four ahead, then acknowledge one of them at random.
            while unacked.len() < 4 {
                unacked.push(*sent);
                *sent += 1;
            }
            let seq = unacked.swap_remove(next(unacked.len() as u64) as usize);
            let floor = unacked.iter().copied().min().unwrap_or(*sent).min(seq);
            let push = id(c as u64 + 1, seq, floor);
            let mut b = now.batch();
            d_now.record(&push, &mut b);
            now.write(b).unwrap();
            if next(2) == 0 {
                d_logged.record_logged(&push);
                since_tail.push(push);
            } else {
                let mut b = logged.batch();
                d_logged.record(&push, &mut b);
                logged.write(b).unwrap();
            }
            applied.push(push);
            if next(50) == 0 || step == 2_999 {
                let mut b = logged.batch();
                d_logged.store_waiting(&mut b);
                logged.write(b).unwrap();
                since_tail.clear();
                assert_eq!(stored(&logged), stored(&now), "ids after step {step}");
                assert_eq!(floors(&logged), floors(&now), "floors after step {step}");
            } else {
                let (ids, floors) = (stored(&logged), floors(&logged));
                for p in &applied {
                    let floor = floors
                        .iter()
                        .find(|f| f.0 == p.client_id)
                        .map_or(0, |f| f.1);
                    assert!(
                        p.seq < floor
                            || ids.contains(&(p.client_id, p.seq))
                            || since_tail.contains(p),
                        "push {p:?} forgotten after step {step}"
                    );
                }
            }
            assert_eq!(
                d_logged.clients[&(c as u64 + 1)].floor,
                d_now.clients[&(c as u64 + 1)].floor
            );
        }
        // The floors dropped most of the 3 000 (the test would prove little otherwise).
        assert!(
            stored(&now).len() < 100,
            "{} ids stored",
            stored(&now).len()
        );
    }
}
