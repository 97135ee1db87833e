//! A worker's copy of the dense tables under the consistency model: when it must be pulled
//! again, and, between pulls under the SSP cache rule, this worker's own updates applied to it
//! with each table's own optimizer (read-my-writes).

use std::time::{Duration, Instant};

use ps_core::{JobSpec, Optimizer};

use crate::schedule::SspRefresh;

/// Read-my-writes for a cached model, one per dense table: the table as last pulled plus this
/// worker's own pushes since, applied with the table's own optimizer (a replica of the worker's
/// share of the optimizer state). Under SSP a worker computes up to `s` clocks on one pull;
/// without its own updates it would compute those clocks' gradients at the same point, and its
/// momentum overshoots.
#[derive(Debug)]
struct OwnTable {
    name: String,
    optimizer: Optimizer,
    values: Vec<f32>,
    state: Vec<f32>,
    step: u64,
}

/// When the dense tables were last pulled, and what to pull next.
#[derive(Debug)]
pub struct ModelCache {
    /// The job's staleness bound (`None`: ASP).
    bound: Option<u64>,
    /// Pull only when the bound requires it.
    lazy: bool,
    /// The job's minimum clock at the last pull, and when it was.
    last: Option<(u64, Instant)>,
    /// Under the cache rule with a bound above 0: the tables with this worker's own updates.
    own: Option<Vec<OwnTable>>,
}

impl ModelCache {
    /// The cache of a worker of `spec` computing `dense` (table, length) under `refresh`.
    pub fn new(spec: &JobSpec, dense: &[(String, usize)], refresh: SspRefresh) -> Self {
        let bound = spec.consistency.bound();
        let lazy = refresh == SspRefresh::Bound;
        let own = (lazy && bound.is_some_and(|s| s > 0)).then(|| {
            dense
                .iter()
                .filter_map(|(t, len)| {
                    let optimizer = spec.table(t)?.spec.optimizer;
                    Some(OwnTable {
                        name: t.clone(),
                        state: ps_core::optim::initial_state(&optimizer, *len),
                        optimizer,
                        values: Vec::new(),
                        step: 0,
                    })
                })
                .collect()
        });
        Self {
            bound,
            lazy,
            last: None,
            own,
        }
    }

    /// Whether clock `clock` must pull first: at clock c the step must see every update of
    /// clocks below c - s, and a pull made when the slowest worker was at m holds those below m.
    pub fn stale(&self, clock: u64) -> bool {
        match (self.last, self.bound) {
            (None, _) | (_, None) => true,
            (Some((min_clock, _)), Some(s)) => !self.lazy || clock > min_clock + s,
        }
    }

    /// Takes freshly pulled tables (one tensor per dense table, in order) as the cached copy.
    pub fn set_values(&mut self, pulled: Vec<Vec<f32>>) {
        if let Some(own) = &mut self.own {
            for (o, v) in own.iter_mut().zip(pulled) {
                o.values = v;
            }
        }
    }

    /// Records that the copy was pulled while the job's minimum clock was `min_clock`: the
    /// bound is counted from it.
    pub fn pulled_at(&mut self, min_clock: u64) {
        self.last = Some((min_clock, Instant::now()));
    }

    /// Time since the last pull: the age of the parameters a clock trained on.
    pub fn age(&self) -> Duration {
        self.last.map_or(Duration::ZERO, |(_, at)| at.elapsed())
    }

    /// Applies this worker's own gradients (one per dense table, in order) to the cached copy
    /// as the shards will; returns the updated tables to compute with, if the cache keeps them.
    pub fn own_push(&mut self, grads: &[(String, Vec<f32>)]) -> Vec<(&str, &[f32])> {
        let Some(own) = &mut self.own else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (o, (t, g)) in own.iter_mut().zip(grads) {
            if o.name != *t || o.values.len() != g.len() {
                continue;
            }
            ps_core::optim::apply(&o.optimizer, &mut o.values, &mut o.state, &mut o.step, g);
            out.push((o.name.as_str(), o.values.as_slice()));
        }
        out
    }
}
