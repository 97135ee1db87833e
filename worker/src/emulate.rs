//! Slow machines on demand, for the consistency experiments: a persistently slower worker
//! (its compute stretched `slowdown` times; its network is no slower, which is what balanced
//! batch sizes can make up for) and transient stragglers (a whole step, pulls and push
//! included, taking `straggler_factor` times longer with probability `straggler_prob`).
//! Both sleep, which costs no CPU, so the emulation does not slow the other processes down.

use std::time::Duration;

use rand::Rng;
use rand_xoshiro::Xoshiro256PlusPlus;

/// A worker's emulated slowness.
#[derive(Debug)]
pub struct Emulation {
    slowdown: f64,
    straggler_prob: f64,
    straggler_factor: f64,
    rng: Xoshiro256PlusPlus,
}

impl Emulation {
    pub fn new(
        slowdown: f64,
        straggler_prob: f64,
        straggler_factor: f64,
        rng: Xoshiro256PlusPlus,
    ) -> Self {
        Self {
            slowdown,
            straggler_prob,
            straggler_factor,
            rng,
        }
    }

    /// Stretches a clock's `compute` on a slower machine; returns the time added.
    pub async fn slow_compute(&self, compute: Duration) -> Duration {
        if self.slowdown <= 1.0 {
            return Duration::ZERO;
        }
        let extra = compute.mul_f64(self.slowdown - 1.0);
        tokio::time::sleep(extra).await;
        extra
    }

    /// Makes a straggler of the step that took `step` so far, with the configured probability;
    /// returns the time added.
    pub async fn straggle(&mut self, step: Duration) -> Duration {
        if self.straggler_prob <= 0.0 || self.rng.random::<f64>() >= self.straggler_prob {
            return Duration::ZERO;
        }
        let extra = step.mul_f64(self.straggler_factor.max(1.0) - 1.0);
        tokio::time::sleep(extra).await;
        extra
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[tokio::test(start_paused = true)]
    async fn a_slow_machine_and_a_certain_straggler_add_what_they_say() {
        let rng = Xoshiro256PlusPlus::seed_from_u64(1);
        let mut e = Emulation::new(3.0, 1.0, 4.0, rng.clone());
        let t0 = tokio::time::Instant::now();
        assert_eq!(
            e.slow_compute(Duration::from_millis(10)).await,
            Duration::from_millis(20)
        );
        assert_eq!(
            e.straggle(Duration::from_millis(10)).await,
            Duration::from_millis(30)
        );
        assert_eq!(t0.elapsed(), Duration::from_millis(50));
        let mut off = Emulation::new(1.0, 0.0, 4.0, rng);
        assert_eq!(
            off.slow_compute(Duration::from_millis(10)).await,
            Duration::ZERO
        );
        assert_eq!(
            off.straggle(Duration::from_millis(10)).await,
            Duration::ZERO
        );
    }
}
