//! Admission by frequency for a sparse table (`TableSpec::admit_after`): a count-min sketch of
//! how often each id not yet stored was pushed. A new id's row is stored on the push that brings
//! its count to `admit_after`; the pushes before are acknowledged (and recorded as applied, so
//! a retry is still a duplicate) but change nothing, and pulls of the id get the initializer's
//! value.
//!
//! Depth 4 of 2^17 16-bit counters (1 MiB per table that uses admission); conservative update
//! (only the smallest counters grow), so an id is overcounted only when all four of its counters
//! are shared with more frequent ids. Every 2^17 counted pushes all counters are halved, which
//! keeps the load near one count per counter (few ids admitted early by collisions, measured in
//! the tests below) and lets ids pushed long ago fade: an id must get its `admit_after` pushes
//! within about two such windows. The counts are in memory only: after a restart every id not
//! yet stored starts again from zero.

use parking_lot::Mutex;

const DEPTH: usize = 4;
const WIDTH_BITS: u32 = 17;
const WIDTH: usize = 1 << WIDTH_BITS;
/// Counted pushes between two halvings: one per counter of one row.
const AGE_EVERY: u64 = WIDTH as u64;
const SEEDS: [u64; DEPTH] = [
    0x9e37_79b9_7f4a_7c15,
    0xc2b2_ae3d_27d4_eb4f,
    0x1656_67b1_9e37_79f9,
    0x27d4_eb2f_1656_67c5,
];

#[derive(Debug)]
struct Counts {
    cells: Box<[u16]>,
    counted: u64,
}

/// The sketch of one table on one shard; only the writer thread counts.
#[derive(Debug)]
pub(super) struct Admission {
    admit_after: u16,
    counts: Mutex<Counts>,
}

impl Admission {
    /// A sketch for a table whose ids are stored from their `admit_after`-th push; `None` when
    /// every id is stored on its first.
    pub(super) fn new(admit_after: u32) -> Option<Self> {
        (admit_after > 1).then(|| Self {
            admit_after: u16::try_from(admit_after).unwrap_or(u16::MAX),
            counts: Mutex::new(Counts {
                cells: vec![0; DEPTH * WIDTH].into_boxed_slice(),
                counted: 0,
            }),
        })
    }

    /// Counts one push of `id` (not stored yet); whether its row is stored now.
    pub(super) fn admit(&self, id: u64) -> bool {
        let mut c = self.counts.lock();
        let slots: [usize; DEPTH] = std::array::from_fn(|d| {
            let h = ps_core::hash::mix64(id ^ SEEDS[d]);
            d * WIDTH + (h >> (64 - WIDTH_BITS)) as usize
        });
        let seen = slots.iter().map(|&s| c.cells[s]).min().unwrap_or(0);
        let now = seen.saturating_add(1);
        for &s in &slots {
            if c.cells[s] < now {
                c.cells[s] = now;
            }
        }
        c.counted += 1;
        if c.counted.is_multiple_of(AGE_EVERY) {
            for v in c.cells.iter_mut() {
                *v >>= 1;
            }
        }
        now >= self.admit_after
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_is_admitted_on_its_nth_push_and_others_are_not_counted_with_it() {
        let a = Admission::new(3).unwrap();
        assert!(!a.admit(7));
        assert!(!a.admit(7));
        assert!(a.admit(7));
        // A window's worth of other ids pushed twice each: few reach 3 by collisions.
        let n = AGE_EVERY / 2;
        let mut early = 0;
        for id in 1000..1000 + n {
            a.admit(id);
            early += u64::from(a.admit(id));
        }
        assert!(
            early * 100 < n,
            "{early} of {n} ids admitted on their second push"
        );
        // Ids seen once each, at the full load: few admitted on their first push at 2.
        let b = Admission::new(2).unwrap();
        let first: u64 = (0..AGE_EVERY).map(|id| u64::from(b.admit(id * 7919))).sum();
        assert!(
            first * 10 < AGE_EVERY,
            "{first} of {AGE_EVERY} admitted on a first push"
        );
        assert!(Admission::new(1).is_none() && Admission::new(0).is_none());
    }

    #[test]
    fn counts_age_so_that_old_pushes_fade() {
        let a = Admission::new(4).unwrap();
        a.admit(1);
        a.admit(1);
        // Enough other pushes to halve every counter twice: id 1 is back near zero.
        for id in 0..2 * AGE_EVERY {
            a.admit(1_000_000 + id);
        }
        assert!(!a.admit(1), "an old count must not admit on the next push");
    }
}
