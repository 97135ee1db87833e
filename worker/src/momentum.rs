//! Momentum correction (Deep Gradient Compression): the worker keeps the momentum of each
//! dense table and pushes its velocity `u = m u + g` (the job's tables then use plain SGD), so
//! what a sparse codec holds back in its residual is momentum, not raw gradient. Momentum
//! factor masking: where a sparse codec sent a position, its momentum is cleared so it is not
//! sent again; the client says which positions a push carried.

/// The worker-side momentum of each dense table.
#[derive(Debug)]
pub struct LocalMomentum {
    m: f32,
    velocity: Vec<Vec<f32>>,
}

impl LocalMomentum {
    /// Momentum `m`; `None` when it is 0 (off).
    pub fn new(m: f32) -> Option<Self> {
        (m > 0.0).then(|| Self {
            m,
            velocity: Vec::new(),
        })
    }

    /// Turns each table's gradient into its velocity: `u = m u + g`, and `g = u`.
    pub fn apply(&mut self, dense: &mut [(String, Vec<f32>)]) {
        self.velocity.resize_with(dense.len(), Vec::new);
        for ((_, g), u) in dense.iter_mut().zip(&mut self.velocity) {
            u.resize(g.len(), 0.0);
            for (u, g) in u.iter_mut().zip(g.iter_mut()) {
                *u = self.m * *u + *g;
                *g = *u;
            }
        }
    }

    /// Clears table `table`'s momentum at the positions its push sent.
    pub fn mask(&mut self, table: usize, sent: &[usize]) {
        if let Some(u) = self.velocity.get_mut(table) {
            for &i in sent {
                if let Some(x) = u.get_mut(i) {
                    *x = 0.0;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn velocity_accumulates_and_sent_positions_start_over() {
        let mut mo = LocalMomentum::new(0.5).unwrap();
        let mut g = vec![("w".to_owned(), vec![1.0, 2.0, 4.0])];
        mo.apply(&mut g);
        assert_eq!(g[0].1, [1.0, 2.0, 4.0]);
        mo.mask(0, &[2]);
        let mut g = vec![("w".to_owned(), vec![1.0, 1.0, 1.0])];
        mo.apply(&mut g);
        // u = 0.5 u + g; position 2 was sent, so its momentum restarted from 0.
        assert_eq!(g[0].1, [1.5, 2.0, 1.0]);
        assert!(LocalMomentum::new(0.0).is_none());
    }
}
