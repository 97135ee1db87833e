//! The consistency policy: which worker may start which clock. Pure (no I/O, no clock reads),
//! so its one invariant is checked by property tests:
//!
//! > no worker ever starts clock c while a live worker has finished fewer than c - s clocks.
//!
//! A worker's *clock* is the number of iterations it has finished; it works on iteration
//! `clock` next. BSP is s = 0, SSP(s) is s, ASP is no bound: one code path.

use std::collections::{BTreeMap, HashMap};

pub type WorkerId = u64;

/// Why a clock report was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClockError {
    #[error("worker {0} is not a live member of the job; join again")]
    NotMember(WorkerId),
    #[error(
        "out of order: worker {worker} has finished {clock} clocks, so the next report is for clock {clock}, not {reported}"
    )]
    OutOfOrder {
        worker: WorkerId,
        clock: u64,
        reported: u64,
    },
}

/// What a report did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Report {
    /// The clock moved forward; `min_changed` when that raised the minimum.
    Advanced { min_changed: bool },
    /// The same report again (a retried or re-polled call): nothing changed.
    Repeated,
}

/// The finished clocks of a job's live workers, with an optional barrier.
#[derive(Debug, Clone)]
pub struct Clocks {
    bound: Option<u64>,
    clocks: HashMap<WorkerId, u64>,
    /// How many live workers are at each clock: the minimum in O(log n).
    counts: BTreeMap<u64, usize>,
    /// While set, no worker may start a clock at or past it (a checkpoint boundary).
    barrier: Option<u64>,
    /// Where the job is when no worker is live: the minimum when the last one left (or the
    /// clock a resume set). A worker joining then enters here, not at 0: the shards hold every
    /// update of the clocks before it.
    floor: u64,
}

impl Clocks {
    /// `bound` is the staleness bound s (`None` = ASP).
    pub fn new(bound: Option<u64>) -> Self {
        Self {
            bound,
            clocks: HashMap::new(),
            counts: BTreeMap::new(),
            barrier: None,
            floor: 0,
        }
    }

    /// The job's clock: the slowest live worker's, or, with none live, where the last one
    /// left.
    pub fn current(&self) -> u64 {
        self.min().unwrap_or(self.floor)
    }

    /// Where a worker joining a job with no live worker enters (a restored scheduler's
    /// record).
    pub fn set_floor(&mut self, clock: u64) {
        self.floor = clock;
    }

    pub fn bound(&self) -> Option<u64> {
        self.bound
    }

    pub fn len(&self) -> usize {
        self.clocks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.clocks.is_empty()
    }

    /// The smallest clock of a live worker.
    pub fn min(&self) -> Option<u64> {
        self.counts.keys().next().copied()
    }

    pub fn max(&self) -> Option<u64> {
        self.counts.keys().next_back().copied()
    }

    pub fn clock(&self, w: WorkerId) -> Option<u64> {
        self.clocks.get(&w).copied()
    }

    pub fn contains(&self, w: WorkerId) -> bool {
        self.clocks.contains_key(&w)
    }

    pub fn barrier(&self) -> Option<u64> {
        self.barrier
    }

    pub fn set_barrier(&mut self, barrier: Option<u64>) {
        self.barrier = barrier;
    }

    /// Iterates over (worker, clock) of the live workers.
    pub fn iter(&self) -> impl Iterator<Item = (WorkerId, u64)> + '_ {
        self.clocks.iter().map(|(&w, &c)| (w, c))
    }

    fn count(&mut self, clock: u64, delta: isize) {
        let n = self.counts.entry(clock).or_default();
        *n = n.saturating_add_signed(delta);
        if *n == 0 {
            self.counts.remove(&clock);
        }
    }

    /// Adds a worker at the current minimum clock (0 for the first), so that it neither waits
    /// for nor holds back the others. Returns its clock. A member joining again keeps its clock.
    pub fn join(&mut self, w: WorkerId) -> u64 {
        if let Some(c) = self.clock(w) {
            return c;
        }
        let c = self.current();
        self.insert(w, c);
        c
    }

    /// Puts a worker at `clock` as recorded (a scheduler restart, a resync). Callers pass a
    /// clock the worker really reached, so the bound still holds.
    pub fn insert(&mut self, w: WorkerId, clock: u64) {
        if let Some(old) = self.clocks.insert(w, clock) {
            self.count(old, -1);
        }
        self.count(clock, 1);
    }

    /// Removes a worker (left, or its lease expired): nobody waits for it any more. Returns
    /// whether that raised the minimum.
    pub fn remove(&mut self, w: WorkerId) -> bool {
        let before = self.min();
        if let Some(c) = self.clocks.remove(&w) {
            self.count(c, -1);
        }
        if self.clocks.is_empty() {
            self.floor = before.unwrap_or(self.floor);
        }
        self.min() != before
    }

    /// Records that `w` finished clock `finished`. A report for the clock just before the
    /// current one is a repeat (the answer to the first was lost); anything else out of order
    /// is refused and changes nothing.
    pub fn finish(&mut self, w: WorkerId, finished: u64) -> Result<Report, ClockError> {
        let clock = self.clock(w).ok_or(ClockError::NotMember(w))?;
        if finished == clock {
            let before = self.min();
            self.insert(w, clock + 1);
            Ok(Report::Advanced {
                min_changed: self.min() != before,
            })
        } else if finished.checked_add(1) == Some(clock) {
            Ok(Report::Repeated)
        } else {
            Err(ClockError::OutOfOrder {
                worker: w,
                clock,
                reported: finished,
            })
        }
    }

    /// Whether `w` may start its next clock now: every live worker has finished at least
    /// `clock - s` clocks, and no barrier is at or below that clock.
    pub fn may_start(&self, w: WorkerId) -> bool {
        let Some(c) = self.clock(w) else {
            return false;
        };
        self.may_start_clock(c)
    }

    /// Whether any live worker may start clock `c` now.
    pub fn may_start_clock(&self, c: u64) -> bool {
        if self.barrier.is_some_and(|b| c >= b) {
            return false;
        }
        match (self.bound, self.min()) {
            (None, _) | (_, None) => true,
            (Some(s), Some(min)) => c <= min.saturating_add(s),
        }
    }

    /// How far `w` is ahead of the slowest live worker.
    pub fn gap(&self, w: WorkerId) -> u64 {
        match (self.clock(w), self.min()) {
            (Some(c), Some(m)) => c - m,
            _ => 0,
        }
    }

    /// Puts every live worker, and the job when none is live, at `clock` (a resumed
    /// checkpoint).
    pub fn reset_all(&mut self, clock: u64) {
        self.floor = clock;
        let ws: Vec<WorkerId> = self.clocks.keys().copied().collect();
        for w in ws {
            self.insert(w, clock);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Op {
        Join,
        /// Worker (index into the joined list) tries to start its next clock.
        Start(usize),
        /// A running worker finishes its clock.
        Finish(usize),
        Remove(usize),
        Barrier(Option<u8>),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            1 => Just(Op::Join),
            6 => (0..8usize).prop_map(Op::Start),
            6 => (0..8usize).prop_map(Op::Finish),
            1 => (0..8usize).prop_map(Op::Remove),
            1 => proptest::option::of(0..40u8).prop_map(Op::Barrier),
        ]
    }

    fn check_invariant(clocks: &Clocks, running: &HashMap<WorkerId, u64>, s: Option<u64>) {
        // Every running worker's clock c is within the bound of every live worker.
        let Some(s) = s else { return };
        for (&w, &c) in running {
            for (o, oc) in clocks.iter() {
                assert!(
                    oc + s >= c,
                    "worker {w} runs clock {c} while worker {o} has finished only {oc} (s = {s})"
                );
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn no_worker_starts_past_the_bound(
            bound in prop_oneof![Just(None), (0..4u64).prop_map(Some)],
            ops in proptest::collection::vec(op(), 1..300),
        ) {
            let mut clocks = Clocks::new(bound);
            let mut members: Vec<WorkerId> = Vec::new();
            let mut running: HashMap<WorkerId, u64> = HashMap::new();
            let mut next = 1;
            for op in ops {
                match op {
                    Op::Join => {
                        let c = clocks.join(next);
                        prop_assert_eq!(Some(c), clocks.min());
                        members.push(next);
                        next += 1;
                    }
                    Op::Start(i) => {
                        let Some(&w) = members.get(i) else { continue };
                        if running.contains_key(&w) || !clocks.contains(w) { continue }
                        let c = clocks.clock(w).unwrap();
                        if clocks.may_start(w) {
                            if let Some(b) = clocks.barrier() {
                                prop_assert!(c < b);
                            }
                            running.insert(w, c);
                        } else {
                            // Held only for a cause: the barrier, or the slowest live worker
                            // more than s clocks behind.
                            let barrier = clocks.barrier().is_some_and(|b| c >= b);
                            let behind = match (bound, clocks.iter().map(|(_, c)| c).min()) {
                                (Some(s), Some(min)) => c > min + s,
                                _ => false,
                            };
                            prop_assert!(barrier || behind, "worker {w} at clock {c} held without cause");
                        }
                    }
                    Op::Finish(i) => {
                        let Some(&w) = members.get(i) else { continue };
                        if let Some(c) = running.remove(&w) {
                            let advanced = matches!(clocks.finish(w, c), Ok(Report::Advanced { .. }));
                            prop_assert!(advanced);
                            // The same report again is a harmless repeat.
                            prop_assert_eq!(clocks.finish(w, c), Ok(Report::Repeated));
                            // A report from the future is refused and changes nothing.
                            let before = clocks.clock(w);
                            prop_assert!(clocks.finish(w, c + 5).is_err());
                            prop_assert_eq!(clocks.clock(w), before);
                        }
                    }
                    Op::Remove(i) => {
                        let Some(&w) = members.get(i) else { continue };
                        clocks.remove(w);
                        running.remove(&w);
                    }
                    Op::Barrier(b) => clocks.set_barrier(b.map(u64::from)),
                }
                check_invariant(&clocks, &running, bound);
                // Clocks spread at most s + 1 apart (a worker past the bound cannot start).
                if let (Some(min), Some(max), Some(s)) = (clocks.min(), clocks.max(), bound) {
                    prop_assert!(max - min <= s + 1, "spread {} > s + 1", max - min);
                }
            }
        }

        /// The slowest worker is never held (no deadlock): with no barrier it may always start.
        #[test]
        fn the_slowest_worker_never_waits(
            bound in prop_oneof![Just(None), (0..4u64).prop_map(Some)],
            steps in proptest::collection::vec(0..5usize, 1..200),
        ) {
            let mut clocks = Clocks::new(bound);
            for w in 0..5 {
                clocks.join(w);
            }
            for w in steps {
                let w = w as WorkerId;
                if clocks.may_start(w) {
                    let c = clocks.clock(w).unwrap();
                    clocks.finish(w, c).unwrap();
                }
                let min = clocks.min().unwrap();
                let slowest = clocks.iter().find(|&(_, c)| c == min).unwrap().0;
                prop_assert!(clocks.may_start(slowest));
            }
        }
    }

    #[test]
    fn bsp_ssp_and_asp_are_one_rule() {
        let mut bsp = Clocks::new(Some(0));
        bsp.join(1);
        bsp.join(2);
        bsp.finish(1, 0).unwrap();
        assert!(!bsp.may_start(1), "BSP: 1 waits for 2 to finish clock 0");
        assert!(bsp.may_start(2));
        bsp.finish(2, 0).unwrap();
        assert!(bsp.may_start(1));

        let mut ssp = Clocks::new(Some(2));
        ssp.join(1);
        ssp.join(2);
        for c in 0..3 {
            assert!(ssp.may_start(1), "clock {c} is within s = 2");
            ssp.finish(1, c).unwrap();
        }
        assert!(
            !ssp.may_start(1),
            "clock 3 needs worker 2 to have finished 1"
        );
        ssp.finish(2, 0).unwrap();
        assert!(ssp.may_start(1));

        let mut asp = Clocks::new(None);
        asp.join(1);
        asp.join(2);
        for c in 0..100 {
            assert!(asp.may_start(1));
            asp.finish(1, c).unwrap();
        }
    }

    #[test]
    fn the_dead_are_not_waited_for_and_joiners_start_at_the_minimum() {
        let mut c = Clocks::new(Some(0));
        c.join(1);
        c.join(2);
        c.finish(1, 0).unwrap();
        assert!(!c.may_start(1));
        assert!(c.remove(2), "removing the slowest raises the minimum");
        assert!(c.may_start(1));
        assert_eq!(c.join(3), 1, "a late joiner starts at the minimum clock");
        assert_eq!(
            c.finish(3, 4),
            Err(ClockError::OutOfOrder {
                worker: 3,
                clock: 1,
                reported: 4
            })
        );
        assert_eq!(c.finish(9, 0), Err(ClockError::NotMember(9)));
    }

    #[test]
    fn a_job_every_worker_left_is_joined_where_it_was_not_at_zero() {
        let mut c = Clocks::new(Some(2));
        c.join(1);
        c.join(2);
        for k in 0..5 {
            c.finish(1, k).unwrap();
        }
        for k in 0..3 {
            c.finish(2, k).unwrap();
        }
        assert_eq!((c.current(), c.max()), (3, Some(5)));
        c.remove(2);
        c.remove(1);
        assert_eq!((c.min(), c.current()), (None, 5), "where the last one left");
        assert_eq!(
            c.join(3),
            5,
            "every container restarted: the job goes on from clock 5"
        );
        c.remove(3);
        c.reset_all(2);
        assert_eq!(
            c.join(4),
            2,
            "a resumed checkpoint moves the job's clock with it"
        );
    }

    #[test]
    fn a_barrier_holds_everyone_at_it() {
        let mut c = Clocks::new(None);
        c.join(1);
        c.set_barrier(Some(2));
        c.finish(1, 0).unwrap();
        assert!(c.may_start(1));
        c.finish(1, 1).unwrap();
        assert!(!c.may_start(1));
        c.set_barrier(None);
        assert!(c.may_start(1));
    }
}
