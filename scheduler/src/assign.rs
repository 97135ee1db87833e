//! Who reads which part of the data set, and how many examples each worker computes per clock.
//! Pure functions of the membership and the measured throughputs.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::policy::WorkerId;

/// The owner of each data shard. A shard whose owner left goes to the least loaded live
/// worker; a worker that joins takes unowned shards, then shards from the most loaded, until
/// the loads differ by at most one. Both keep the live workers' loads within one of each other.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct DataShards {
    owner: Vec<Option<WorkerId>>,
}

impl DataShards {
    pub fn new(n: u32) -> Self {
        Self {
            owner: vec![None; n as usize],
        }
    }

    pub fn len(&self) -> u32 {
        self.owner.len() as u32
    }

    pub fn is_empty(&self) -> bool {
        self.owner.is_empty()
    }

    pub fn of(&self, w: WorkerId) -> Vec<u32> {
        self.owner
            .iter()
            .enumerate()
            .filter(|(_, o)| **o == Some(w))
            .map(|(i, _)| i as u32)
            .collect()
    }

    pub fn owner(&self, shard: u32) -> Option<WorkerId> {
        self.owner.get(shard as usize).copied().flatten()
    }

    fn loads(&self, live: &[WorkerId]) -> BTreeMap<WorkerId, usize> {
        let mut loads: BTreeMap<WorkerId, usize> = live.iter().map(|&w| (w, 0)).collect();
        for o in self.owner.iter().flatten() {
            if let Some(n) = loads.get_mut(o) {
                *n += 1;
            }
        }
        loads
    }

    fn least_loaded(loads: &BTreeMap<WorkerId, usize>) -> Option<WorkerId> {
        loads
            .iter()
            .min_by_key(|(w, n)| (**n, **w))
            .map(|(w, _)| *w)
    }

    /// Gives `w` (already in `live`) its share. Returns the workers whose shards changed.
    pub fn join(&mut self, w: WorkerId, live: &[WorkerId]) -> Vec<WorkerId> {
        let mut changed = vec![w];
        // Unowned shards first (their owner died with nobody to take them, or the job is new).
        for i in 0..self.owner.len() {
            if self.owner[i].is_none() {
                let loads = self.loads(live);
                if let Some(to) = Self::least_loaded(&loads) {
                    self.owner[i] = Some(to);
                    changed.push(to);
                }
            }
        }
        // Then even out: move one shard at a time from the most to the least loaded.
        loop {
            let loads = self.loads(live);
            let (Some((&max_w, &max_n)), Some(min_w)) = (
                loads
                    .iter()
                    .max_by_key(|(w, n)| (**n, std::cmp::Reverse(**w))),
                Self::least_loaded(&loads),
            ) else {
                break;
            };
            if max_n <= loads[&min_w] + 1 {
                break;
            }
            if let Some(i) = self.owner.iter().rposition(|o| *o == Some(max_w)) {
                self.owner[i] = Some(min_w);
                changed.extend([max_w, min_w]);
            }
        }
        changed.sort_unstable();
        changed.dedup();
        changed
    }

    /// Gives the shards of `w` (no longer in `live`) to the least loaded live workers, or
    /// leaves them unowned for the next to join. Returns the workers whose shards changed.
    pub fn leave(&mut self, w: WorkerId, live: &[WorkerId]) -> Vec<WorkerId> {
        let mut changed = Vec::new();
        for i in 0..self.owner.len() {
            if self.owner[i] == Some(w) {
                let to = Self::least_loaded(&self.loads(live));
                self.owner[i] = to;
                changed.extend(to);
            }
        }
        changed.sort_unstable();
        changed.dedup();
        changed
    }
}

/// Splits `global` examples per clock between workers in proportion to their throughput
/// (examples per second; 0 = not measured yet, counted as the mean of the measured ones). Every
/// worker gets at least one example and the sizes sum to `global` exactly (largest remainder).
pub fn batch_sizes(global: u64, throughput: &[(WorkerId, f64)]) -> Vec<(WorkerId, u64)> {
    let n = throughput.len() as u64;
    if n == 0 {
        return Vec::new();
    }
    let measured: Vec<f64> = throughput
        .iter()
        .map(|t| t.1)
        .filter(|t| t.is_finite() && *t > 0.0)
        .collect();
    let fill = if measured.is_empty() {
        1.0
    } else {
        measured.iter().sum::<f64>() / measured.len() as f64
    };
    let weights: Vec<f64> = throughput
        .iter()
        .map(|t| {
            if t.1.is_finite() && t.1 > 0.0 {
                t.1
            } else {
                fill
            }
        })
        .collect();
    let total: f64 = weights.iter().sum();
    // One example each first, then the rest in proportion.
    let spare = global.saturating_sub(n);
    let exact: Vec<f64> = weights.iter().map(|w| spare as f64 * w / total).collect();
    let mut sizes: Vec<u64> = exact.iter().map(|e| 1 + e.floor() as u64).collect();
    let mut left = global.saturating_sub(sizes.iter().sum());
    let mut order: Vec<usize> = (0..sizes.len()).collect();
    order.sort_by(|&a, &b| {
        let ra = exact[a] - exact[a].floor();
        let rb = exact[b] - exact[b].floor();
        rb.total_cmp(&ra).then(a.cmp(&b))
    });
    for i in order.into_iter().cycle() {
        if left == 0 {
            break;
        }
        sizes[i] += 1;
        left -= 1;
    }
    throughput.iter().map(|t| t.0).zip(sizes).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_dead_workers_shards_go_to_the_living_and_joiners_even_out() {
        let mut d = DataShards::new(4);
        d.join(1, &[1]);
        assert_eq!(d.of(1), vec![0, 1, 2, 3]);
        d.join(2, &[1, 2]);
        assert_eq!((d.of(1).len(), d.of(2).len()), (2, 2));
        d.leave(1, &[2]);
        assert_eq!(d.of(2), vec![0, 1, 2, 3]);
        d.leave(2, &[]);
        assert_eq!(d.owner(0), None, "nobody left: kept for the next to join");
        d.join(3, &[3]);
        assert_eq!(d.of(3), vec![0, 1, 2, 3]);
    }

    #[test]
    fn batches_follow_throughput() {
        let b = batch_sizes(300, &[(1, 100.0), (2, 200.0)]);
        assert_eq!(b, vec![(1, 100), (2, 200)]);
        let b = batch_sizes(10, &[(1, 0.0), (2, 0.0), (3, 0.0)]);
        assert_eq!(b.iter().map(|x| x.1).sum::<u64>(), 10);
        assert!(b.iter().all(|x| x.1 >= 3));
    }

    proptest! {
        #[test]
        fn batches_sum_to_the_global_batch(
            global in 1u64..100_000,
            tps in proptest::collection::vec(prop_oneof![Just(0.0), 0.1f64..1e6], 1..50),
        ) {
            let ws: Vec<(WorkerId, f64)> = tps.iter().enumerate().map(|(i, t)| (i as u64, *t)).collect();
            let b = batch_sizes(global.max(ws.len() as u64), &ws);
            prop_assert_eq!(b.iter().map(|x| x.1).sum::<u64>(), global.max(ws.len() as u64));
            prop_assert!(b.iter().all(|x| x.1 >= 1));
        }

        #[test]
        fn every_shard_has_a_live_owner_and_loads_are_even(
            shards in 1u32..40,
            ops in proptest::collection::vec((any::<bool>(), 0u64..10), 1..60),
        ) {
            let mut d = DataShards::new(shards);
            let mut live: Vec<WorkerId> = Vec::new();
            for (join, w) in ops {
                if join && !live.contains(&w) {
                    live.push(w);
                    d.join(w, &live);
                } else if !join && live.contains(&w) {
                    live.retain(|x| *x != w);
                    d.leave(w, &live);
                }
                for s in 0..shards {
                    match d.owner(s) {
                        Some(o) => prop_assert!(live.contains(&o)),
                        None => prop_assert!(live.is_empty()),
                    }
                }
                if !live.is_empty() {
                    let loads: Vec<usize> = live.iter().map(|w| d.of(*w).len()).collect();
                    let (lo, hi) = (loads.iter().min().unwrap(), loads.iter().max().unwrap());
                    // A join evens the loads out; a leaver's shards go one by one to the
                    // least loaded, which keeps them even: they never differ by more than one.
                    prop_assert!(hi - lo <= 1, "loads {loads:?}");
                }
            }
        }
    }
}
