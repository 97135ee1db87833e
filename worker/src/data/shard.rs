//! Deterministic sharding and per-epoch order.
//!
//! A seeded permutation of the examples is cut into `n` data shards (position `p` of the
//! permutation goes to shard `p % n`), so every example is in exactly one shard and every worker
//! computes the same cut. A worker owning some shards visits their examples once per epoch in
//! an order shuffled by (seed, epoch, shards).

use ps_core::hash::{combine, mix64};
use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_xoshiro::Xoshiro256PlusPlus;

/// The cut of `len` examples into `n` data shards.
#[derive(Debug, Clone)]
pub struct ShardPlan {
    perm: Vec<u32>,
    n: usize,
}

impl ShardPlan {
    pub fn new(len: usize, n: usize, seed: u64) -> Self {
        let mut perm: Vec<u32> = (0..len as u32).collect();
        perm.shuffle(&mut Xoshiro256PlusPlus::seed_from_u64(mix64(seed)));
        Self { perm, n: n.max(1) }
    }

    pub fn num_shards(&self) -> usize {
        self.n
    }

    /// The examples of data shard `k`.
    pub fn shard(&self, k: usize) -> impl Iterator<Item = usize> + '_ {
        self.perm
            .iter()
            .skip(k)
            .step_by(self.n)
            .map(|&i| i as usize)
    }

    /// The examples of `shards` (unknown shard numbers are ignored).
    pub fn examples(&self, shards: &[u32]) -> Vec<usize> {
        let mut v = Vec::new();
        for &k in shards {
            if (k as usize) < self.n {
                v.extend(self.shard(k as usize));
            }
        }
        v
    }
}

/// A worker's walk over its examples: one shuffled pass per epoch, then the next epoch.
#[derive(Debug, Clone)]
pub struct EpochOrder {
    examples: Vec<usize>,
    order: Vec<usize>,
    pos: usize,
    epoch: u64,
    seed: u64,
}

impl EpochOrder {
    pub fn new(examples: Vec<usize>, seed: u64, epoch: u64) -> Self {
        let mut o = Self {
            examples,
            order: Vec::new(),
            pos: 0,
            epoch,
            seed,
        };
        o.shuffle();
        o
    }

    fn shuffle(&mut self) {
        self.order.clone_from(&self.examples);
        let key = combine(combine(self.seed, self.epoch), self.examples.len() as u64);
        self.order
            .shuffle(&mut Xoshiro256PlusPlus::seed_from_u64(mix64(key)));
        self.pos = 0;
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Appends up to `k` next examples to `out` (crossing into the next epoch when this one
    /// runs out); returns the epoch of the first one. Nothing when the worker owns no examples.
    pub fn take(&mut self, k: usize, out: &mut Vec<usize>) -> u64 {
        if self.order.is_empty() {
            return self.epoch;
        }
        if self.pos == self.order.len() {
            self.epoch += 1;
            self.shuffle();
        }
        let epoch = self.epoch;
        let mut need = k;
        while need > 0 {
            if self.pos == self.order.len() {
                self.epoch += 1;
                self.shuffle();
            }
            let end = (self.pos + need).min(self.order.len());
            out.extend_from_slice(&self.order[self.pos..end]);
            need -= end - self.pos;
            self.pos = end;
        }
        epoch
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn every_example_is_in_exactly_one_shard(len in 0usize..2000, n in 1usize..17, seed: u64) {
            let plan = ShardPlan::new(len, n, seed);
            let mut seen = vec![0u8; len];
            for k in 0..n {
                for i in plan.shard(k) {
                    seen[i] += 1;
                }
            }
            prop_assert!(seen.iter().all(|&c| c == 1));
            // Shards differ in size by at most one.
            let sizes: Vec<usize> = (0..n).map(|k| plan.shard(k).count()).collect();
            prop_assert!(sizes.iter().max().unwrap() - sizes.iter().min().unwrap() <= 1);
            // Every worker computes the same cut.
            let again = ShardPlan::new(len, n, seed);
            prop_assert_eq!(plan.examples(&[0]), again.examples(&[0]));
        }

        #[test]
        fn an_epoch_visits_each_owned_example_once(len in 1usize..500, n in 1usize..5, seed: u64, batch in 1usize..64) {
            let plan = ShardPlan::new(len, n, seed);
            let mine = plan.examples(&[0]);
            prop_assume!(!mine.is_empty());
            let mut walk = EpochOrder::new(mine.clone(), seed, 0);
            let mut got = Vec::new();
            while got.len() < mine.len() {
                let e = walk.take(batch.min(mine.len() - got.len()), &mut got);
                prop_assert_eq!(e, 0);
            }
            let mut a = got.clone();
            a.sort_unstable();
            let mut b = mine.clone();
            b.sort_unstable();
            prop_assert_eq!(a, b);
            // The next epoch is a different order of the same examples (when there are a few).
            let mut next = Vec::new();
            prop_assert_eq!(walk.take(mine.len(), &mut next), 1);
            if mine.len() > 8 {
                prop_assert_ne!(&next, &got);
            }
        }
    }
}
