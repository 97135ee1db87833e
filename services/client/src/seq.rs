//! Sequence numbers for exactly-once pushes.
//!
//! Each push takes the next number and keeps it for all its retries. The lowest number still in
//! flight is the client's floor: it will never retry anything below it, so it sends the floor
//! along and the shards forget older records.

use std::collections::BTreeSet;
use std::sync::Arc;

use parking_lot::Mutex;

#[derive(Debug, Default)]
struct State {
    next: u64,
    in_flight: BTreeSet<u64>,
}

#[derive(Debug, Default, Clone)]
pub(crate) struct SeqTracker {
    state: Arc<Mutex<State>>,
}

/// A sequence number in flight; dropping it (on success, failure or cancellation) ends it.
#[derive(Debug)]
pub(crate) struct Ticket {
    seq: u64,
    min_unacked: u64,
    state: Arc<Mutex<State>>,
}

impl SeqTracker {
    pub(crate) fn begin(&self) -> Ticket {
        let mut s = self.state.lock();
        s.next += 1;
        let seq = s.next;
        s.in_flight.insert(seq);
        let min_unacked = s.in_flight.first().copied().unwrap_or(seq);
        Ticket {
            seq,
            min_unacked,
            state: self.state.clone(),
        }
    }
}

impl Ticket {
    pub(crate) fn seq(&self) -> u64 {
        self.seq
    }

    pub(crate) fn min_unacked(&self) -> u64 {
        self.min_unacked
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.state.lock().in_flight.remove(&self.seq);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floor_is_the_oldest_push_in_flight() {
        let t = SeqTracker::default();
        let a = t.begin();
        let b = t.begin();
        assert_eq!((a.seq(), a.min_unacked()), (1, 1));
        assert_eq!((b.seq(), b.min_unacked()), (2, 1));
        drop(a);
        let c = t.begin();
        assert_eq!((c.seq(), c.min_unacked()), (3, 2));
        drop(b);
        drop(c);
        let d = t.begin();
        assert_eq!((d.seq(), d.min_unacked()), (4, 4));
    }
}
