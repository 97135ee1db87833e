//! Seeded initial values.
//!
//! A sparse row's values are a pure function of (seed, table name, id), and a dense chunk's of
//! (seed, table name, chunk index): any shard, in any order, after any restart, produces the same
//! numbers. That is why a pull of a row nobody pushed needs no write: it reads as its initializer.

use rand::SeedableRng;
use rand_distr::{Distribution, Normal, Uniform};
use rand_xoshiro::Xoshiro256PlusPlus;

use crate::hash::combine;
use crate::table::{Initializer, InitializerKind};

impl Initializer {
    /// Fills `out` with the initial values of the row or chunk `key` of the table whose name
    /// hashes to `table_hash`.
    pub fn fill(&self, table_hash: u64, key: u64, out: &mut [f32]) {
        let rng =
            || Xoshiro256PlusPlus::seed_from_u64(combine(combine(self.seed, table_hash), key));
        match self.kind {
            InitializerKind::Zeros => out.fill(0.0),
            InitializerKind::Uniform { low, high } => {
                // Validated: low < high, both finite.
                match Uniform::new(low, high) {
                    Ok(d) => d
                        .sample_iter(rng())
                        .zip(out.iter_mut())
                        .for_each(|(v, o)| *o = v),
                    Err(_) => out.fill(low),
                }
            }
            InitializerKind::Normal { mean, stddev } => match Normal::new(mean, stddev) {
                Ok(d) => d
                    .sample_iter(rng())
                    .zip(out.iter_mut())
                    .for_each(|(v, o)| *o = v),
                Err(_) => out.fill(mean),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_distinct_per_key() {
        let init = Initializer::normal(0.0, 1.0, 42);
        let (mut a, mut b, mut c) = ([0.0; 8], [0.0; 8], [0.0; 8]);
        init.fill(7, 1, &mut a);
        init.fill(7, 1, &mut b);
        init.fill(7, 2, &mut c);
        assert_eq!(a, b);
        assert_ne!(a, c);
        let mut other_seed = [0.0; 8];
        Initializer::normal(0.0, 1.0, 43).fill(7, 1, &mut other_seed);
        assert_ne!(a, other_seed);
    }

    #[test]
    fn uniform_stays_in_range_and_normal_has_its_moments() {
        let mut v = vec![0.0; 100_000];
        Initializer::uniform(-0.5, 0.25, 1).fill(3, 9, &mut v);
        assert!(v.iter().all(|x| (-0.5..0.25).contains(x)));
        Initializer::normal(2.0, 0.5, 1).fill(3, 9, &mut v);
        let mean = v.iter().sum::<f32>() / v.len() as f32;
        let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f32>() / v.len() as f32;
        assert!((mean - 2.0).abs() < 0.01, "{mean}");
        assert!((var.sqrt() - 0.5).abs() < 0.01, "{var}");
    }
}
