//! A bandwidth emulator: a token bucket that makes transfers take the time they would on a link
//! of a given speed, so the wall-clock effect of compression shows on loopback.
//!
//! Every push and pull of a worker passes its bytes on the wire (after the codec) through
//! [`Link::pass`], which waits until the link would have carried them. Transfers queue behind
//! each other as on one network interface.

use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

#[derive(Debug)]
pub struct Link {
    bytes_per_sec: f64,
    /// When the link is free again.
    free_at: Mutex<Instant>,
}

impl Link {
    /// A link of `mbps` megabits per second.
    pub fn mbps(mbps: f64) -> Self {
        Self {
            bytes_per_sec: (mbps.max(1e-3) * 1e6 / 8.0),
            free_at: Mutex::new(Instant::now()),
        }
    }

    /// The time `bytes` take on this link.
    pub fn time_of(&self, bytes: u64) -> Duration {
        Duration::from_secs_f64(bytes as f64 / self.bytes_per_sec)
    }

    /// Waits until `bytes` would have crossed the link (after whatever is queued before them).
    pub async fn pass(&self, bytes: u64) {
        let done = {
            let mut free = self.free_at.lock();
            let start = (*free).max(Instant::now());
            *free = start + self.time_of(bytes);
            *free
        };
        tokio::time::sleep_until(done).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn transfers_queue_at_the_link_rate() {
        let link = Link::mbps(8.0); // 1 MB/s
        let t0 = Instant::now();
        link.pass(500_000).await;
        assert_eq!(t0.elapsed(), Duration::from_millis(500));
        // Two at once share the link: the second ends a full second after the first.
        let (a, b) = tokio::join!(
            async {
                link.pass(1_000_000).await;
                t0.elapsed()
            },
            async {
                link.pass(1_000_000).await;
                t0.elapsed()
            }
        );
        assert_eq!(a.min(b), Duration::from_millis(1500));
        assert_eq!(a.max(b), Duration::from_millis(2500));
    }
}
