//! What every push shares: its requests fanned out to the shards, each under one sequence
//! number for all its attempts; the answers summed; a refused request's part given back to
//! the residual (a request whose fate is unknown keeps it: it may have been applied).

use std::future::Future;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures::stream::{self, StreamExt};
use ps_codec::Encoded;
use ps_proto::v1 as pb;
use tracing::Instrument as _;

use crate::transport::{Inner, Shard};
use crate::{ClientError, PushSummary};

/// Pushes ([`Inner::push_each_then`], dense or sparse) and dense pulls running now in this
/// process (every client's).
static CALLS_IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);

/// One call counted in [`CALLS_IN_FLIGHT`] for as long as it lives.
pub(crate) struct CallsInFlight;

impl CallsInFlight {
    pub(crate) fn enter() -> Self {
        CALLS_IN_FLIGHT.fetch_add(1, Ordering::Relaxed);
        Self
    }

    /// The host's cores shared evenly among the calls running now: a call's requests are
    /// shared out among more threads only while the process's other calls leave cores for
    /// them (two clients of one process on 2 cores, each sharing out its requests, were
    /// 0.89x of them each on its own task in `ps-bench` at 1 M floats, 2 × 2).
    fn cores_each(&self) -> usize {
        static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
        let cores =
            *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
        cores / CALLS_IN_FLIGHT.load(Ordering::Relaxed).max(1)
    }
}

impl Drop for CallsInFlight {
    fn drop(&mut self) {
        CALLS_IN_FLIGHT.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A request's index, its push's answer, and what ran after it (`None` when the push failed).
pub(crate) type PushThen = (
    usize,
    Result<pb::PushResponse, ClientError>,
    Option<Result<(), ClientError>>,
);

impl Inner {
    /// Sends a push's requests (`(shard, request)`) concurrently, at most `max_in_flight` at a
    /// time, each under one push id for every attempt; answers come tagged with the request's
    /// index, in the order they arrive.
    pub(crate) async fn push_each<R, F, Fut>(
        &self,
        requests: Vec<(usize, R)>,
        send: F,
    ) -> Vec<(usize, Result<pb::PushResponse, ClientError>)>
    where
        R: Clone + Send + Sync,
        F: Fn(Shard, R, pb::PushId, u64) -> Fut + Sync,
        Fut: Future<Output = Result<pb::PushResponse, tonic::Status>> + Send,
    {
        self.push_each_then(requests, send, |_| std::future::ready(Ok(())), 1)
            .await
            .into_iter()
            .map(|(i, answer, _)| (i, answer))
            .collect()
    }

    /// [`Inner::push_each`], running `then(i)` as soon as request `i` is acknowledged, within
    /// the request's place among those in flight (a pull of the chunks it pushed, say, which
    /// then overlaps the pushes of the others). Each answer comes with what `then` returned,
    /// `None` for a push that failed.
    ///
    /// With `threads` above 1, two requests or more, and a task of a multi-thread tokio
    /// runtime to run on, the requests are shared out among that many threads, each driving
    /// its share concurrently: the calling one (its task's other work handed to another
    /// worker by `block_in_place`, so the call blocks its task until it is done) and scoped
    /// threads beside it. One task would copy every request's bytes to and from its sockets on
    /// one core at a time (see [`ClientConfig::call_threads`](crate::ClientConfig)).
    pub(crate) async fn push_each_then<R, F, Fut, G, GFut>(
        &self,
        requests: Vec<(usize, R)>,
        send: F,
        then: G,
        threads: usize,
    ) -> Vec<PushThen>
    where
        R: Clone + Send + Sync,
        F: Fn(Shard, R, pb::PushId, u64) -> Fut + Sync,
        Fut: Future<Output = Result<pb::PushResponse, tonic::Status>> + Send,
        G: Fn(usize) -> GFut + Sync,
        GFut: Future<Output = Result<(), ClientError>> + Send,
    {
        let (send, then) = (&send, &then);
        let one = |(i, (shard, req)): (usize, (usize, R))| async move {
            let answer = self
                .push(shard, |s, id, epoch| send(s, req.clone(), id, epoch))
                .await;
            let after = match answer {
                Ok(_) => Some(then(i).await),
                Err(_) => None,
            };
            (i, answer, after)
        };
        // `block_in_place` needs a worker of a multi-thread runtime: a task of one.
        let runtime = tokio::runtime::Handle::try_current().ok().filter(|h| {
            h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread
                && tokio::task::try_id().is_some()
        });
        // Counted while it runs, whether it is shared out or not.
        let calls = CallsInFlight::enter();
        let threads = threads
            .min(calls.cores_each())
            .clamp(1, requests.len().max(1));
        let Some(runtime) = runtime.filter(|_| threads > 1) else {
            return stream::iter(requests.into_iter().enumerate())
                .map(one)
                .buffer_unordered(self.cfg.max_in_flight)
                .collect()
                .await;
        };
        // Request i to share i % threads: each share's requests in flight at once, the
        // shares together at most `max_in_flight` (one each when it is below `threads`).
        let mut shares: Vec<Vec<_>> = (0..threads).map(|_| Vec::new()).collect();
        for (i, r) in requests.into_iter().enumerate() {
            shares[i % threads].push((i, r));
        }
        let per_share = (self.cfg.max_in_flight / threads).max(1);
        // Each share in the caller's span, so that its calls' spans are children of it on
        // every thread (a span's parent is the span current where it opens).
        let span = tracing::Span::current();
        let drive = |share: Vec<_>| {
            runtime.block_on(
                stream::iter(share)
                    .map(one)
                    .buffer_unordered(per_share)
                    .collect::<Vec<_>>()
                    .instrument(span.clone()),
            )
        };
        let mut shares = shares.into_iter();
        let mine = shares.next().unwrap_or_default();
        tokio::task::block_in_place(|| {
            std::thread::scope(|scope| {
                let others: Vec<_> = shares.map(|share| scope.spawn(|| drive(share))).collect();
                let mut answers = drive(mine);
                for other in others {
                    match other.join() {
                        Ok(a) => answers.extend(a),
                        Err(panic) => std::panic::resume_unwind(panic),
                    }
                }
                answers
            })
        })
    }
}

/// Sums the answers of a push's requests (`(request index, answer)`), counting the payloads
/// of each applied one (what was sent, and how many values it stands for). A request the
/// shard refused (certainly not applied) goes to `refused`, which gives its part back to the
/// residual. The first error, if any, is the push's.
pub(crate) fn settle<'a, P>(
    results: Vec<(usize, Result<pb::PushResponse, ClientError>)>,
    payloads: impl Fn(usize) -> P,
    mut refused: impl FnMut(usize),
) -> Result<PushSummary, ClientError>
where
    P: Iterator<Item = (&'a Encoded, u64)>,
{
    let mut total = PushSummary::default();
    let mut first_err = None;
    for (i, r) in results {
        match r {
            Ok(a) => {
                total.add(&a);
                for (e, values) in payloads(i) {
                    total.add_payload(e, values);
                }
            }
            Err(e) => {
                if not_applied(&e) {
                    refused(i);
                }
                first_err.get_or_insert(e);
            }
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(total),
    }
}

/// Whether a failed push was certainly not applied: the shard refused it. (After a transport
/// failure or a deadline it may have been.)
fn not_applied(e: &ClientError) -> bool {
    use tonic::Code;
    match e {
        ClientError::Status { code, .. } => !matches!(
            code,
            Code::Unavailable | Code::Unknown | Code::DeadlineExceeded | Code::Cancelled
        ),
        _ => true,
    }
}

/// One encoded dense slice: its chunk, its range in the tensor, its payload.
pub(crate) type EncodedSlice = (u64, Range<usize>, Encoded);

/// Counts a payload this client sent, standing for `values` values, by table and codec.
pub(crate) fn wire_metric(
    direction: &'static str,
    table: &str,
    codec: &str,
    e: &Encoded,
    values: u64,
) {
    count_wire(direction, table, codec, wire_len(e), values * 4);
}

/// A plain-f32 slice that stays in the caller's memory until it is sent: the header of its
/// payload, with no data (see [`is_borrowed`]).
pub(crate) fn borrowed_f32(values: usize) -> Encoded {
    Encoded {
        header: ps_codec::Header {
            raw_len: 4 * values as u64,
            ..ps_codec::Header::f32(values)
        },
        data: bytes::Bytes::new(),
    }
}

/// Whether a push's payload is [`borrowed_f32`]: values with no bytes (every encoding of at
/// least one value has some).
pub(crate) fn is_borrowed(e: &Encoded) -> bool {
    e.data.is_empty() && e.header.num_values > 0
}

/// Bytes a push's payload takes on the wire.
pub(crate) fn wire_len(e: &Encoded) -> u64 {
    if is_borrowed(e) {
        4 * e.header.num_values
    } else {
        e.data.len() as u64
    }
}

fn count_wire(direction: &'static str, table: &str, codec: &str, wire: u64, raw: u64) {
    let labels = [
        ("direction", direction.to_owned()),
        ("table", table.to_owned()),
        ("codec", codec.to_owned()),
    ];
    metrics::counter!("ps_client_wire_bytes_total", &labels).increment(wire);
    metrics::counter!("ps_client_raw_bytes_total", &labels).increment(raw);
}

impl Inner {
    /// Counts values this client pulled: `wire` bytes of them on the wire, `values` of them,
    /// under the table's pull codec `codec`.
    pub(crate) fn count_pull(&self, table: &str, codec: &str, wire: u64, values: u64) {
        self.pulled_wire.fetch_add(wire, Ordering::Relaxed);
        self.pulled_raw.fetch_add(values * 4, Ordering::Relaxed);
        count_wire("pull", table, codec, wire, values * 4);
    }

    /// Counts a pull request of table `table`, `bytes` long as encoded, sent.
    pub(crate) fn count_pull_request(&self, table: &str, bytes: usize) {
        self.pull_asked.fetch_add(bytes as u64, Ordering::Relaxed);
        metrics::counter!("ps_client_pull_request_bytes_total", "table" => table.to_owned())
            .increment(bytes as u64);
    }
}
