//! A bandwidth emulator on the client's transport: a token bucket per direction that makes each
//! request and answer to the shards take the time it would on a link of a given speed, so the
//! wall-clock effect of compression shows honestly on loopback.
//!
//! [`LinkChannel`] sits between the generated gRPC client and its HTTP/2 channel. With a link
//! set, it reads each request body whole, waits until the uplink would have carried its bytes,
//! sends it, then reads the answer whole and waits for the downlink in the same way; the bulk
//! stream's calls (`bulk.rs`) wait for their frames' bytes alike. Every shard connection of one
//! [`crate::PsClient`] shares one [`Link`], as they would share one network interface; the two
//! directions are independent (full duplex). Without a link it adds nothing.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use parking_lot::Mutex;
use tokio::time::Instant;
use tonic::body::Body;
use tonic::transport::Channel;
use tower_service::Service;

/// One direction of a link: when it is free again.
#[derive(Debug)]
struct Bucket {
    free_at: Mutex<Instant>,
}

impl Bucket {
    fn new() -> Self {
        Self {
            free_at: Mutex::new(Instant::now()),
        }
    }

    /// Queues `time` of transfer behind whatever is already on this direction; returns when
    /// it ends.
    fn reserve(&self, time: Duration) -> Instant {
        let mut free = self.free_at.lock();
        let start = (*free).max(Instant::now());
        *free = start + time;
        *free
    }

    /// Waits until `time` of transfer, queued behind whatever is already on this direction,
    /// has passed.
    async fn pass(&self, time: Duration) {
        wait_until(self.reserve(time)).await;
    }
}

/// The last part of a wait, polled rather than slept: a timer's wake-up on a virtual machine
/// comes 45-200 µs late at the median (`link-bench`, the whole wait on the timer), so the
/// timer is set this much before the end and the rest is polled.
const POLLED: Duration = Duration::from_micros(200);

/// Waits until `deadline`, to within tens of microseconds rather than tokio's millisecond, and
/// without holding a core for the wait. A plain `sleep_until` ends each transfer up to a
/// millisecond or two late: paid once per request and once per answer, that would weigh on
/// small, compressed transfers far more than on large ones and understate what compression
/// buys. So all but the last [`POLLED`] of the wait is armed on a kernel timer of its own
/// (`timerfd`, nanosecond-precise) that the runtime's reactor watches like a socket, and the
/// rest is polled: the task yields to the runtime's other tasks and the thread to other
/// processes between looks at the clock. `link-bench` on a 2-core virtual machine (300
/// transfers a size): 3-60 KB at 100 Mbit/s and 1 Gbit/s ended 0.4-2.6 µs late at the median
/// (the means, 3-235 µs, are a tail of the machine's that polling the whole wait has too) and
/// took 25-191 µs of CPU each. Polling the last 2 ms instead, as this did before, took
/// 157-1,958 µs of CPU a transfer (all of any transfer under 2 ms, so nearly all of a
/// compressed step's), from the shards and workers on the same cores; sleeping the last
/// millisecond on a blocking thread, before that, added 0.12-0.19 ms a transfer. Without a timer (another
/// system, or none to be had), tokio's timer sleeps the wait up to the polled part.
async fn wait_until(deadline: Instant) {
    let left = deadline.saturating_duration_since(Instant::now());
    if left > POLLED && timer_wait(left - POLLED).await.is_err() {
        tokio::time::sleep_until(deadline - POLLED).await;
    }
    while Instant::now() < deadline {
        std::thread::yield_now();
        tokio::task::yield_now().await;
    }
}

/// Waits `left` on a one-shot `timerfd` of its own, watched by the runtime's reactor.
#[cfg(target_os = "linux")]
async fn timer_wait(left: Duration) -> std::io::Result<()> {
    use nix::sys::time::TimeSpec;
    use nix::sys::timerfd::{ClockId, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags};
    // CLOCK_MONOTONIC: the clock `Instant` reads.
    let timer = TimerFd::new(
        ClockId::CLOCK_MONOTONIC,
        TimerFlags::TFD_NONBLOCK | TimerFlags::TFD_CLOEXEC,
    )?;
    timer.set(
        Expiration::OneShot(TimeSpec::from_duration(left)),
        TimerSetTimeFlags::empty(),
    )?;
    let fd = std::os::fd::OwnedFd::from(timer);
    #[allow(unsafe_code)]
    // SAFETY: the AsyncFd owns the timer's descriptor, which stays open and the same until the
    // AsyncFd is dropped.
    let fd = unsafe {
        tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE)
    }
    .map_err(std::io::Error::from)?;
    // Readable once the timer has fired; the descriptor is closed unread.
    fd.readable().await?.retain_ready();
    Ok(())
}

#[cfg(not(target_os = "linux"))]
async fn timer_wait(_left: Duration) -> std::io::Result<()> {
    Err(std::io::ErrorKind::Unsupported.into())
}

/// An emulated network link of a fixed speed, full duplex.
#[derive(Debug)]
pub struct Link {
    bytes_per_sec: f64,
    up: Bucket,
    down: Bucket,
}

impl Link {
    /// A link of `mbps` megabits per second in each direction.
    pub fn mbps(mbps: f64) -> Self {
        Self {
            bytes_per_sec: mbps.max(1e-3) * 1e6 / 8.0,
            up: Bucket::new(),
            down: Bucket::new(),
        }
    }

    /// The time `bytes` take on this link.
    pub fn time_of(&self, bytes: u64) -> Duration {
        Duration::from_secs_f64(bytes as f64 / self.bytes_per_sec)
    }

    /// Waits until `bytes` sent would have crossed the link.
    pub async fn send(&self, bytes: u64) {
        self.up.pass(self.time_of(bytes)).await;
    }

    /// Waits until `bytes` received would have crossed the link.
    pub async fn receive(&self, bytes: u64) {
        self.down.pass(self.time_of(bytes)).await;
    }
}

/// A shard channel that passes its traffic through a [`Link`] when one is set.
#[derive(Debug, Clone)]
pub struct LinkChannel {
    inner: Channel,
    link: Option<Arc<Link>>,
}

impl LinkChannel {
    pub fn new(inner: Channel, link: Option<Arc<Link>>) -> Self {
        Self { inner, link }
    }
}

/// Reads a body whole; returns it as one frame of data (and its trailers) or as the error.
async fn buffer(body: Body) -> (u64, Body) {
    match body.collect().await {
        Ok(collected) => {
            let trailers = collected.trailers().cloned();
            let data = collected.to_bytes();
            let len = data.len() as u64;
            let mut frames: Vec<Result<Frame<Bytes>, tonic::Status>> = vec![Ok(Frame::data(data))];
            frames.extend(trailers.map(|t| Ok(Frame::trailers(t))));
            (
                len,
                Body::new(StreamBody::new(futures::stream::iter(frames))),
            )
        }
        Err(status) => (
            0,
            Body::new(StreamBody::new(futures::stream::iter([Err::<
                Frame<Bytes>,
                _,
            >(
                status
            )]))),
        ),
    }
}

impl Service<http::Request<Body>> for LinkChannel {
    type Response = http::Response<Body>;
    type Error = tonic::transport::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let Some(link) = self.link.clone() else {
            return Box::pin(self.inner.call(request));
        };
        // The channel was made ready for this call: hand the ready one to the future and keep
        // a fresh clone here (tower's rule for buffered services).
        let fresh = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, fresh);
        Box::pin(async move {
            let (parts, body) = request.into_parts();
            let (sent, body) = buffer(body).await;
            link.send(sent).await;
            let response = inner.call(http::Request::from_parts(parts, body)).await?;
            let (parts, body) = response.into_parts();
            let (received, body) = buffer(body).await;
            link.receive(received).await;
            Ok(http::Response::from_parts(parts, body))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn transfers_queue_at_the_link_rate_in_each_direction() {
        let link = Link::mbps(8.0); // 1 MB/s
        let t0 = Instant::now();
        let ends = |bucket: &Bucket, bytes| bucket.reserve(link.time_of(bytes)) - t0;
        assert_eq!(ends(&link.up, 500_000), Duration::from_millis(500));
        // Two sends queued at once share the uplink: the second ends a full second after the
        // first.
        assert_eq!(ends(&link.up, 1_000_000), Duration::from_millis(1500));
        assert_eq!(ends(&link.up, 1_000_000), Duration::from_millis(2500));
        // The downlink is independent: a receive now takes its own time only.
        assert_eq!(ends(&link.down, 250_000), Duration::from_millis(250));
        // Once the uplink has gone idle, a transfer starts when it is asked for.
        tokio::time::advance(Duration::from_secs(10)).await;
        let t1 = Instant::now();
        assert_eq!(
            link.up.reserve(link.time_of(1_000)) - t1,
            Duration::from_millis(1)
        );
    }

    #[tokio::test]
    async fn a_transfer_ends_no_sooner_than_the_link_allows() {
        // 100 Mbit/s: 10 KB take 0.8 ms, less than one of tokio's timer ticks.
        let link = Link::mbps(100.0);
        for bytes in [10_000, 30_000, 125_000] {
            let t0 = std::time::Instant::now();
            link.send(bytes).await;
            let waited = t0.elapsed();
            assert!(
                waited >= link.time_of(bytes),
                "{bytes} bytes took {waited:?}, less than the link's {:?}",
                link.time_of(bytes)
            );
        }
    }
}
