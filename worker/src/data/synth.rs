//! Synthetic data generated per example from (seed, part, index), so a set of any size costs no
//! memory and every worker sees the same example at the same index.

use ps_core::hash::{combine, mix64};
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, StandardNormal, Zipf};
use rand_xoshiro::Xoshiro256PlusPlus;

use super::{Batch, Dataset, Features, Input};

fn rng(seed: u64, part: u64, index: u64) -> Xoshiro256PlusPlus {
    Xoshiro256PlusPlus::seed_from_u64(mix64(combine(combine(seed, part), index)))
}

/// A dense classification set: Gaussian clusters (unit noise) around one centre per class.
#[derive(Debug, Clone)]
pub struct SyntheticDense {
    n: usize,
    dim: usize,
    classes: usize,
    seed: u64,
    part: u64,
    centres: Vec<f32>,
}

impl SyntheticDense {
    /// `part` tells the training set (0) from the test set (1): same centres, other samples.
    pub fn new(n: usize, dim: usize, classes: usize, seed: u64, part: u64) -> Self {
        let mut r = rng(seed, u64::MAX, 0);
        let centres = (0..classes * dim)
            .map(|_| r.random_range(-1.0f32..1.0))
            .collect();
        Self {
            n,
            dim,
            classes,
            seed,
            part,
            centres,
        }
    }
}

impl Dataset for SyntheticDense {
    fn len(&self) -> usize {
        self.n
    }

    fn classes(&self) -> usize {
        self.classes
    }

    fn input(&self) -> Input {
        Input::Dense { dim: self.dim }
    }

    fn gather(&self, indices: &[usize], out: &mut Batch) {
        out.labels.clear();
        let mut values = super::take_dense(out);
        for &i in indices {
            let mut r = rng(self.seed, self.part, i as u64);
            let c = r.random_range(0..self.classes);
            out.labels.push(c as u32);
            let centre = &self.centres[c * self.dim..(c + 1) * self.dim];
            values.extend(centre.iter().map(|m| {
                let z: f32 = StandardNormal.sample(&mut r);
                m + z
            }));
        }
        out.features = Features::Dense {
            dim: self.dim,
            values,
        };
    }
}

/// A CTR-like set: `fields` categorical fields, each example takes one id per field drawn from
/// a Zipf law (exponent 1.1) over that field's ids; the label is drawn from a planted logistic
/// model whose weight for each id is fixed by the seed ([`SyntheticCtr::true_weight`]).
#[derive(Debug, Clone)]
pub struct SyntheticCtr {
    n: usize,
    fields: usize,
    seed: u64,
    part: u64,
    zipf: Zipf<f64>,
}

impl SyntheticCtr {
    pub fn new(n: usize, ids: u64, fields: usize, seed: u64, part: u64) -> Self {
        let per_field = (ids / fields as u64).max(1);
        Self {
            n,
            fields,
            seed,
            part,
            zipf: Zipf::new(per_field as f64, 1.1).expect("n >= 1 and s > 0"),
        }
    }

    /// The planted weight of feature `id`.
    pub fn true_weight(&self, id: u64) -> f32 {
        let mut r = rng(self.seed, u64::MAX - 1, id);
        let z: f32 = StandardNormal.sample(&mut r);
        z * 1.5 / (self.fields as f32).sqrt()
    }

    /// The features and the label probability of example `i`.
    fn example(&self, i: usize, ids: &mut Vec<u64>) -> (f32, u32) {
        let mut r = rng(self.seed, self.part, i as u64);
        let mut logit = -0.5f32;
        for f in 0..self.fields {
            let rank = self.zipf.sample(&mut r) as u64;
            let id = combine(f as u64 + 1, rank);
            logit += self.true_weight(id);
            ids.push(id);
        }
        let p = 1.0 / (1.0 + (-logit).exp());
        let label = u32::from(r.random::<f32>() < p);
        (p, label)
    }
}

impl Dataset for SyntheticCtr {
    fn len(&self) -> usize {
        self.n
    }

    fn classes(&self) -> usize {
        2
    }

    fn input(&self) -> Input {
        Input::Sparse
    }

    fn gather(&self, indices: &[usize], out: &mut Batch) {
        out.labels.clear();
        let (mut offsets, mut ids, mut values) = super::take_sparse(out);
        offsets.push(0);
        for &i in indices {
            let (_, label) = self.example(i, &mut ids);
            out.labels.push(label);
            values.resize(ids.len(), 1.0);
            offsets.push(ids.len() as u32);
        }
        out.features = Features::Sparse {
            offsets,
            ids,
            values,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn examples_are_reproducible_and_parts_differ() {
        let a = SyntheticDense::new(100, 8, 3, 5, 0);
        let b = SyntheticDense::new(100, 8, 3, 5, 0);
        let t = SyntheticDense::new(100, 8, 3, 5, 1);
        let (mut x, mut y, mut z) = (
            Batch::empty(a.input()),
            Batch::empty(a.input()),
            Batch::empty(a.input()),
        );
        a.gather(&[3, 7], &mut x);
        b.gather(&[3, 7], &mut y);
        t.gather(&[3, 7], &mut z);
        assert_eq!(x, y);
        assert_ne!(x.features, z.features);
    }

    #[test]
    fn ctr_ids_are_zipf_skewed_and_labels_follow_the_planted_model() {
        let s = SyntheticCtr::new(20_000, 10_000, 4, 9, 0);
        let mut b = Batch::empty(s.input());
        let all: Vec<usize> = (0..s.len()).collect();
        s.gather(&all, &mut b);
        let Features::Sparse { ids, offsets, .. } = &b.features else {
            panic!()
        };
        assert_eq!(offsets.len(), 20_001);
        let mut counts = std::collections::HashMap::new();
        for id in ids {
            *counts.entry(*id).or_insert(0usize) += 1;
        }
        let mut c: Vec<usize> = counts.values().copied().collect();
        c.sort_unstable_by(|a, b| b.cmp(a));
        // The head is heavy: the top 1% of ids carry far more than 1% of the occurrences.
        let head: usize = c[..c.len() / 100].iter().sum();
        assert!(head * 5 > ids.len(), "head {head} of {}", ids.len());
        // Labels agree with the planted model more often than chance.
        let agree = (0..s.len())
            .filter(|&i| {
                let logit: f32 = -0.5
                    + ids[offsets[i] as usize..offsets[i + 1] as usize]
                        .iter()
                        .map(|&id| s.true_weight(id))
                        .sum::<f32>();
                (logit > 0.0) == (b.labels[i] == 1)
            })
            .count();
        assert!(agree as f64 / s.len() as f64 > 0.65, "{agree}");
    }
}
