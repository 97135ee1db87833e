//! What the benchmark binaries share.

use std::time::Duration;

/// The `p` quantile (0 < p ≤ 1) of `sorted`, nearest rank: the smallest value with at least
/// that share of the values at or below it.
///
/// # Panics
/// If `sorted` is empty.
pub fn pct(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_quantiles() {
        let v: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(pct(&v, 0.5), Duration::from_millis(50));
        assert_eq!(pct(&v, 0.99), Duration::from_millis(99));
        assert_eq!(pct(&v, 1.0), Duration::from_millis(100));
        assert_eq!(pct(&v[..1], 0.01), Duration::from_millis(1));
    }
}
