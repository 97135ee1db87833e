//! The bulk stream's server: `PushDense` and `PushSparse` (plain f32 values as the body,
//! compressed ones in the header), `PullDense` (plain f32 answered as the body, other
//! encodings and delta pulls in the answer's header) and `PullSparse` (answered in the header) over a raw TCP
//! stream (the framing is `ps_proto::bulk`,
//! described in `ps.proto`). Each call is decoded
//! into the same wire request the gRPC edge receives and handed to the same [`PsService`]
//! method, so validation, exactly-once, metrics and errors are the gRPC path's; only the
//! transport differs. A pushed body is read once from the socket into the buffer the engine
//! logs and applies from; a pulled answer is written from the engine's buffers straight to the
//! socket. A `PushPullDense` is a `PushDense` followed, once acknowledged, by the `PullDense`
//! of its chunks, answered together: one exchange where a training step would make two.

use std::collections::HashMap;
use std::io;
use std::mem::take;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use prost::Message;
use ps_client::tls::WAKE_BYTES;
use ps_core::ValidationError;
use ps_core::wire::reason;
use ps_proto::bulk::{
    self, Head, PULL_DENSE_PATH, PULL_SPARSE_PATH, PUSH_DENSE_PATH, PUSH_SPARSE_PATH,
};
use ps_proto::v1 as pb;
use ps_proto::v1::parameter_server_server::ParameterServer;
use ps_runtime::auth::{Admission, Auth, Caller};
use ps_runtime::status::{invalid_field, refusal};
use ps_runtime::tls::{Peer, PeerConn, ServerTls};
use ps_runtime::trace;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, BufReader};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tonic::{Code, Request, Response, Status};

use crate::body_ring::{self, BodyRing};
use crate::engine::Checked;
use crate::service::PsService;
use crate::store::Store;

/// How the bulk listener behaves: the request limit and the shutdown timings of gRPC's.
#[derive(Debug, Clone, Copy)]
pub struct BulkOptions {
    pub max_request_bytes: usize,
    /// Most bytes of calls' bodies held at once across every connection; a call waits for its
    /// body's share before the body is read.
    pub budget_bytes: usize,
    /// Longest a call may go without a byte arriving once its frame has begun.
    pub frame_timeout: Duration,
    /// Longest a connection may stay open between calls.
    pub idle_timeout: Duration,
    /// Time connections keep being served after shutdown begins.
    pub drain: Duration,
    /// Longest wait, after `drain`, for calls in progress to finish.
    pub grace: Duration,
}

/// The bulk stream's TLS and credentials check: the gRPC port's.
#[derive(Debug, Clone, Default)]
pub struct BulkSecurity {
    pub tls: Option<ServerTls>,
    pub auth: Option<Auth>,
    /// Each connection's calls per second (the gRPC port's `--connection-calls-per-second`).
    pub connection_rate: Option<f64>,
}

/// A connection, read through a buffer (which lets a call's first byte be awaited without
/// taking it, TLS or not).
type Sock = BufReader<PeerConn>;

/// Serves the bulk stream on `listener` until `shutdown` is cancelled: it then stops accepting,
/// keeps serving open connections for `drain`, closes each once its call in progress is
/// answered, and waits up to `grace` for that.
pub async fn serve<S: Store>(
    listener: TcpListener,
    svc: Arc<PsService<S>>,
    opts: BulkOptions,
    security: BulkSecurity,
    shutdown: CancellationToken,
) {
    let closing = CancellationToken::new();
    let mut conns = JoinSet::new();
    let limits = Arc::new(Limits {
        max_request_bytes: opts.max_request_bytes,
        budget: Semaphore::new((opts.budget_bytes / BUDGET_UNIT).clamp(1, Semaphore::MAX_PERMITS)),
        budget_bytes: opts.budget_bytes,
        frame_timeout: opts.frame_timeout,
        idle_timeout: opts.idle_timeout,
    });
    tracing::info!(
        local = ?listener.local_addr().ok(),
        tls = security.tls.is_some(),
        auth = security.auth.is_some(),
        "bulk stream listening"
    );
    let stop_accepting = CancellationToken::new();
    let mut accepted = ps_runtime::tls::accept_loop(
        listener,
        security.tls,
        security.connection_rate,
        stop_accepting.clone(),
        "bulk",
    );
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            conn = accepted.recv() => match conn {
                Some(conn) => {
                    crate::metrics::bulk_connection();
                    conns.spawn(connection(conn, svc.clone(), limits.clone(), security.auth.clone(), closing.clone()));
                }
                None => break,
            },
        }
    }
    // The listener closes.
    stop_accepting.cancel();
    drop(accepted);
    tokio::time::sleep(opts.drain).await;
    closing.cancel();
    let waited = tokio::time::timeout(opts.grace, async {
        while conns.join_next().await.is_some() {}
    })
    .await;
    if waited.is_err() {
        tracing::warn!("bulk calls did not finish within the grace period");
    }
    tracing::info!("bulk stream stopped");
}

/// Budget units are KiB, so that large budgets fit a semaphore's permits.
const BUDGET_UNIT: usize = 1024;

/// Most bytes of a call's header: chunk numbers and names, never tensors.
const MAX_HEADER_BYTES: usize = 4 << 20;

/// What every connection of one listener shares.
#[derive(Debug)]
struct Limits {
    max_request_bytes: usize,
    /// Bodies being read or served, in [`BUDGET_UNIT`]s.
    budget: Semaphore,
    budget_bytes: usize,
    frame_timeout: Duration,
    idle_timeout: Duration,
}

/// One connection: calls one after another until the peer closes it, it breaks the framing,
/// stalls in the middle of a call, stays idle too long, or the shard closes.
async fn connection<S: Store>(
    conn: PeerConn,
    svc: Arc<PsService<S>>,
    limits: Arc<Limits>,
    auth: Option<Auth>,
    closing: CancellationToken,
) {
    let gate = Gate {
        auth,
        peer: conn.peer.clone(),
    };
    let mut sock = BufReader::with_capacity(16 << 10, conn);
    let header_limit = limits.max_request_bytes.min(MAX_HEADER_BYTES);
    loop {
        // Between calls the connection holds nothing; it waits for a call's first byte.
        let arrived = tokio::select! {
            biased;
            () = closing.cancelled() => return,
            arrived = tokio::time::timeout(limits.idle_timeout, sock.fill_buf()) => {
                arrived.map(|r| r.map(|b| b.len()))
            }
        };
        match arrived {
            Ok(Ok(0)) | Ok(Err(_)) => return,
            Ok(Ok(_)) => {}
            Err(_) => {
                tracing::debug!("bulk stream closed: idle");
                return;
            }
        }
        let next = tokio::select! {
            biased;
            () = closing.cancelled() => return,
            next = tokio::time::timeout(limits.frame_timeout, bulk::read_head(&mut sock, header_limit)) => next,
        };
        let (head, header) = match next {
            Ok(Ok(Some(h))) => h,
            Ok(Ok(None)) => return,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "bulk stream closed: bad frame");
                return;
            }
            Err(_) => {
                tracing::debug!("bulk stream closed: the call's head stalled");
                return;
            }
        };
        let (code, header, body) = match call(&svc, head, &header, &mut sock, &limits, &gate).await
        {
            Ok(Ok((header, body))) => (0, header, body),
            // A refusal: the message, and its error details (a google.rpc.Status) as body.
            Ok(Err(s)) => (
                s.code() as u32,
                s.message().as_bytes().to_vec(),
                vec![Bytes::copy_from_slice(s.details())],
            ),
            Err(e) => {
                tracing::debug!(error = %e, "bulk stream closed while reading a call");
                return;
            }
        };
        svc.bulk_call();
        if let Err(e) = bulk::write_frame(&mut sock, code, &header, &body).await {
            tracing::debug!(error = %e, "bulk stream closed while answering");
            return;
        }
    }
}

/// An answer's header and body, or the status refusing the call.
type Answer = Result<(Vec<u8>, Vec<Bytes>), Status>;

/// Who is at the other end of a connection, and the credentials check its calls pass.
struct Gate {
    auth: Option<Auth>,
    peer: Peer,
}

impl Gate {
    /// The call to `path` as the handler gets it: admitted with the header's credentials (as
    /// the gRPC port admits its calls), the caller in its extensions; the admission holds the
    /// call's place in its caller's limits until dropped.
    fn admit<T>(
        &self,
        path: &str,
        authorization: &str,
        req: T,
    ) -> Result<(Request<T>, Option<Admission>), Status> {
        ps_runtime::auth::admit_connection(path, Some(&self.peer))?;
        let mut request = Request::new(req);
        let Some(auth) = &self.auth else {
            return Ok((request, None));
        };
        let (caller, admission) = auth.admit(path, Some(authorization), Some(&self.peer))?;
        request.extensions_mut().insert(caller);
        Ok((request, Some(admission)))
    }
}

/// Reads the rest of one call (its body) and runs it. The outer error is the socket's: the
/// stream is unusable. A refused call has had its whole body read, so the stream stays usable.
async fn call<S: Store>(
    svc: &PsService<S>,
    head: Head,
    header: &[u8],
    sock: &mut Sock,
    limits: &Limits,
    gate: &Gate,
) -> io::Result<Answer> {
    let timeout = limits.frame_timeout;
    match head.kind {
        bulk::PUSH_DENSE | bulk::PUSH_PULL_DENSE => {
            let checked = push_header(head, header, limits.max_request_bytes);
            // A large body goes straight into the push log's body ring (`body_ring.rs`).
            let ring = svc
                .body_ring()
                .filter(|_| head.body_len >= body_ring::MIN_BODY as u64);
            let into = BodyDest {
                ring: ring.as_ref(),
            };
            let push =
                match push_call(sock, head, limits, gate, PUSH_DENSE_PATH, checked, into).await? {
                    Ok(push) => push,
                    Err(refused) => return Ok(Err(refused)),
                };
            // What pulls the pushed chunks back, taken before the push is handed over.
            let then_pull = (head.kind == bulk::PUSH_PULL_DENSE)
                .then(|| pull_of(&push.req))
                .flatten();
            let answer = svc.push_dense(push.req);
            let pushed = match trace::serve_bulk(PUSH_DENSE_PATH, &push.parent, answer).await {
                Ok(r) => r.into_inner(),
                Err(refused) => return Ok(Err(refused)),
            };
            let Some(pull) = then_pull else {
                return Ok(Ok((pushed.encode_to_vec(), Vec::new())));
            };
            // The push is acknowledged whatever the pull does: a pull that fails leaves the
            // answer without values, and the client pulls them by themselves.
            let answer = trace::serve_bulk(PULL_DENSE_PATH, &push.parent, svc.pull_dense(pull));
            let (pull, body) = match answer.await.map(Response::into_inner) {
                Ok(mut r) => {
                    let body = bulk::take_slice_data(&mut r.slices);
                    (Some(r), body)
                }
                Err(s) => {
                    tracing::debug!(status = %s, "a pushed chunks' pull failed; answered without");
                    (None, Vec::new())
                }
            };
            let answer = pb::PushPullDenseResponse {
                push: Some(pushed),
                pull,
            };
            Ok(Ok((answer.encode_to_vec(), body)))
        }
        bulk::PUSH_SPARSE => {
            let checked = sparse_push_header(head, header, limits.max_request_bytes);
            let into = BodyDest { ring: None };
            let push =
                match push_call(sock, head, limits, gate, PUSH_SPARSE_PATH, checked, into).await? {
                    Ok(push) => push,
                    Err(refused) => return Ok(Err(refused)),
                };
            let answer = svc.push_sparse(push.req);
            let answer = trace::serve_bulk(PUSH_SPARSE_PATH, &push.parent, answer).await;
            Ok(answer.map(|r| (r.into_inner().encode_to_vec(), Vec::new())))
        }
        bulk::PULL_DENSE => {
            discard(sock, head.body_len, timeout).await?;
            let (req, parent, _admitted) =
                match admit_call(gate, PULL_DENSE_PATH, pull_header(head, header)) {
                    Ok(a) => a,
                    Err(refused) => return Ok(Err(refused)),
                };
            // A delta pull's chunks come as changes or whole, each as the shard chose: like
            // another encoding, answered whole in the header.
            let plain = req.get_ref().delta.is_none()
                && matches!(
                    req.get_ref().accept(),
                    pb::Encoding::F32 | pb::Encoding::Unspecified
                );
            let answer = trace::serve_bulk(PULL_DENSE_PATH, &parent, svc.pull_dense(req)).await;
            Ok(match answer {
                // Another encoding or a delta: the answer whole in the header, its values in
                // place.
                Ok(r) if !plain => Ok((r.into_inner().encode_to_vec(), Vec::new())),
                Ok(r) => {
                    let mut r = r.into_inner();
                    let body = bulk::take_slice_data(&mut r.slices);
                    match bulk::f32_body_len(&r.slices) {
                        Ok(_) => Ok((r.encode_to_vec(), body)),
                        Err(e) => Err(refusal(
                            Code::Internal,
                            reason::INTERNAL,
                            format!("bulk answer: {e}"),
                            [],
                        )),
                    }
                }
                Err(s) => Err(s),
            })
        }
        bulk::PULL_SPARSE => {
            discard(sock, head.body_len, timeout).await?;
            let (req, parent, _admitted) =
                match admit_call(gate, PULL_SPARSE_PATH, sparse_pull_header(head, header)) {
                    Ok(a) => a,
                    Err(refused) => return Ok(Err(refused)),
                };
            // The answer whole in the header: its rows are gathered into one payload per table
            // already, between the tables' `unchanged` masks.
            let answer = trace::serve_bulk(PULL_SPARSE_PATH, &parent, svc.pull_sparse(req)).await;
            Ok(answer.map(|r| (r.into_inner().encode_to_vec(), Vec::new())))
        }
        other => {
            discard(sock, head.body_len, timeout).await?;
            Ok(Err(refusal(
                Code::Unimplemented,
                reason::NOT_ON_BULK_STREAM,
                format!(
                    "bulk method {other} is unknown to this shard (1 PushDense, 2 PullDense, \
                     3 PushSparse, 4 PushPullDense, 5 PullSparse)"
                ),
                [("method", other.to_string())],
            )))
        }
    }
}

/// A request as the bulk stream carries it: credentials and trace context in the message
/// (gRPC carries them in metadata).
trait Credentialed {
    /// Takes out the caller's credentials and trace context.
    fn credentials(&mut self) -> (String, HashMap<String, String>);
}

macro_rules! credentialed {
    ($($t:ty),*) => {$(
        impl Credentialed for $t {
            fn credentials(&mut self) -> (String, HashMap<String, String>) {
                (take(&mut self.authorization), take(&mut self.trace_context))
            }
        }
    )*};
}
credentialed!(
    pb::PushDenseRequest,
    pb::PushSparseRequest,
    pb::PullDenseRequest,
    pb::PullSparseRequest
);

/// A call admitted on the bulk stream: its request (the caller in its extensions), the
/// caller's trace context, and the admission that holds its place in the caller's limits.
type Admitted<T> = (Request<T>, HashMap<String, String>, Option<Admission>);

/// Admits a call to `path` whose header was `checked`, by the credentials in it.
fn admit_call<T: Credentialed>(
    gate: &Gate,
    path: &str,
    checked: Result<T, Status>,
) -> Result<Admitted<T>, Status> {
    let mut req = checked?;
    let (authorization, parent) = req.credentials();
    let (req, admission) = gate.admit(path, &authorization, req)?;
    Ok((req, parent, admission))
}

/// A push request as the bulk stream carries it, its values in the body.
trait BulkPush: Credentialed {
    /// Gives the payloads their data: `body`, exactly the bytes the header called for. True
    /// when every payload took its data from the body (none came in the header).
    fn fill(&mut self, body: Bytes) -> bool;
}

impl BulkPush for pb::PushDenseRequest {
    fn fill(&mut self, body: Bytes) -> bool {
        let all = (self.slices.iter()).all(|s| s.values.as_ref().is_some_and(bulk::takes_body));
        bulk::put_slice_data(&mut self.slices, body);
        all
    }
}

impl BulkPush for pb::PushSparseRequest {
    fn fill(&mut self, body: Bytes) -> bool {
        match self.values.as_mut().filter(|v| bulk::takes_body(v)) {
            Some(v) => {
                v.data = body;
                true
            }
            None => false,
        }
    }
}

/// A push admitted on the bulk stream, its body in place: the request and its caller's trace
/// context; the caller's admission and the body's share of the budget are held until it is
/// answered.
struct Push<'a, T> {
    req: Request<T>,
    parent: HashMap<String, String>,
    _admitted: Option<Admission>,
    _held: SemaphorePermit<'a>,
}

/// Where a push's body is read into: the body ring when one is given and has room, else
/// memory.
#[derive(Debug, Clone, Copy)]
struct BodyDest<'r> {
    ring: Option<&'r Arc<BodyRing>>,
}

/// Admits a push whose header was `checked` (credentials before the body is read or held),
/// waits for its body's share of the budget and reads the body into it (`into`). A refusal has
/// had its body read and dropped, so the stream stays in step. The outer error is the
/// socket's.
async fn push_call<'a, T: BulkPush>(
    sock: &mut Sock,
    head: Head,
    limits: &'a Limits,
    gate: &Gate,
    path: &str,
    checked: Result<T, Status>,
    into: BodyDest<'_>,
) -> io::Result<Result<Push<'a, T>, Status>> {
    let timeout = limits.frame_timeout;
    let (mut req, parent, admission) = match admit_call(gate, path, checked) {
        Ok(a) => a,
        Err(refused) => {
            discard(sock, head.body_len, timeout).await?;
            return Ok(Err(refused));
        }
    };
    // The body's share of the budget across connections, before it is read. A call that
    // cannot have it within the call timeout (other calls hold it) is answered `unavailable`,
    // to be retried, its body dropped.
    let len = head.body_len as usize;
    let units = (len / BUDGET_UNIT).clamp(1, limits.budget_bytes / BUDGET_UNIT);
    let share = limits
        .budget
        .acquire_many(u32::try_from(units).unwrap_or(u32::MAX));
    let held = match tokio::time::timeout(timeout, share).await {
        Ok(held) => held.map_err(|_| io::Error::other("the bulk budget is closed"))?,
        Err(_) => {
            discard(sock, head.body_len, timeout).await?;
            return Ok(Err(refusal(
                Code::Unavailable,
                reason::RESOURCE_LIMIT,
                format!(
                    "the bulk stream's budget of {} bytes is held by other calls; retry",
                    limits.budget_bytes
                ),
                [
                    ("resource", "bulk stream budget".to_owned()),
                    ("needed_bytes", len.to_string()),
                    ("limit_bytes", limits.budget_bytes.to_string()),
                ],
            )));
        }
    };
    let (body, finite) = match into.ring.and_then(|ring| ring.reserve(len)) {
        Some(mut reserved) => {
            let into = BodyBuf::Slice(reserved.as_mut_slice());
            let finite = read_body(sock, into, len, timeout).await?;
            crate::metrics::bulk_body(true);
            (reserved.into_bytes(), finite)
        }
        None => {
            let mut buf = BytesMut::with_capacity(len);
            let finite = read_body(sock, BodyBuf::Heap(&mut buf), len, timeout).await?;
            crate::metrics::bulk_body(false);
            (buf.freeze(), finite)
        }
    };
    // The scan stands for the push's values only when the body holds all of them.
    if req.get_mut().fill(body) && finite {
        req.extensions_mut().insert(Checked::Finite);
    }
    Ok(Ok(Push {
        req,
        parent,
        _admitted: admission,
        _held: held,
    }))
}

/// The pull of the chunks `push` carries, plain f32, as its caller (admitted for the push)
/// would send it; `None` when the caller's role may not pull (none that may push is refused
/// today), so that the answer carries no values and the client's own pull is refused.
fn pull_of(push: &Request<pb::PushDenseRequest>) -> Option<Request<pb::PullDenseRequest>> {
    let caller = Caller::of(push);
    if let Some(role) = caller.role()
        && !ps_runtime::auth::allowed(PULL_DENSE_PATH).is_some_and(|r| r.contains(&role))
    {
        return None;
    }
    let p = push.get_ref();
    let mut pull = Request::new(pb::PullDenseRequest {
        table: p.table.clone(),
        chunks: p.slices.iter().map(|s| s.chunk).collect(),
        accept: pb::Encoding::F32 as i32,
        map_epoch: p.map_epoch,
        delta: None,
        trace_context: HashMap::new(),
        authorization: String::new(),
    });
    pull.extensions_mut().insert(caller);
    Some(pull)
}

/// A push's header, checked against its body before the body is read.
fn push_header(
    head: Head,
    header: &[u8],
    max_request_bytes: usize,
) -> Result<pb::PushDenseRequest, Status> {
    let req = pb::PushDenseRequest::decode(header)
        .map_err(|e| bad_header(format!("the PushDense header does not decode: {e}")))?;
    let want = bulk::push_body_len(&req.slices).map_err(bad_header)?;
    body_fits(head, header, want, max_request_bytes)?;
    Ok(req)
}

/// A sparse push's header, checked against its body before the body is read: its rows'
/// values, plain f32, are the body; compressed ones are in the header.
fn sparse_push_header(
    head: Head,
    header: &[u8],
    max_request_bytes: usize,
) -> Result<pb::PushSparseRequest, Status> {
    let req = pb::PushSparseRequest::decode(header)
        .map_err(|e| bad_header(format!("the PushSparse header does not decode: {e}")))?;
    let values = req
        .values
        .as_ref()
        .ok_or_else(|| bad_header("a PushSparse header needs its values".into()))?;
    let want = bulk::push_payload_len(values).map_err(bad_header)?;
    body_fits(head, header, want, max_request_bytes)?;
    Ok(req)
}

/// Checks that a push's body is the `want` bytes its header calls for, and that the call is
/// within the shard's request limit.
fn body_fits(head: Head, header: &[u8], want: u64, max_request_bytes: usize) -> Result<(), Status> {
    if want != head.body_len {
        return Err(bad_header(format!(
            "the header holds {want} bytes of f32 values but the body is {} bytes",
            head.body_len
        )));
    }
    let len = head.body_len.saturating_add(header.len() as u64);
    if len > max_request_bytes as u64 {
        return Err(refusal(
            Code::ResourceExhausted,
            reason::REQUEST_TOO_LARGE,
            format!(
                "request too large: {len} bytes, over the shard's limit of {max_request_bytes}; \
                 send smaller requests or raise the server's --max-request-bytes"
            ),
            [("limit_bytes", max_request_bytes.to_string())],
        ));
    }
    Ok(())
}

/// A pull's header: plain f32, no body.
fn pull_header(head: Head, header: &[u8]) -> Result<pb::PullDenseRequest, Status> {
    let req = pb::PullDenseRequest::decode(header)
        .map_err(|e| bad_header(format!("the PullDense header does not decode: {e}")))?;
    if head.body_len != 0 {
        return Err(bad_header("a bulk PullDense has no body".into()));
    }
    Ok(req)
}

/// A sparse pull's header: no body.
fn sparse_pull_header(head: Head, header: &[u8]) -> Result<pb::PullSparseRequest, Status> {
    let req = pb::PullSparseRequest::decode(header)
        .map_err(|e| bad_header(format!("the PullSparse header does not decode: {e}")))?;
    if head.body_len != 0 {
        return Err(bad_header("a bulk PullSparse has no body".into()));
    }
    Ok(req)
}

/// A bulk call whose header does not match the stream's framing rules.
fn bad_header(reason: String) -> Status {
    invalid_field(&ValidationError::new("bulk header", reason))
}

/// Where a body is read to: the body ring's reservation, or memory allocated for it (filled
/// as bytes arrive, never zeroed first).
enum BodyBuf<'b> {
    Slice(&'b mut [u8]),
    Heap(&'b mut BytesMut),
}

impl BodyBuf<'_> {
    /// Reads what `from` has next after the `filled` bytes already here.
    async fn read_from(
        &mut self,
        from: &mut (impl AsyncRead + Unpin),
        filled: usize,
    ) -> io::Result<usize> {
        match self {
            Self::Slice(s) => from.read(&mut s[filled..]).await,
            Self::Heap(b) => from.read_buf(*b).await,
        }
    }

    /// The bytes read so far in `range`.
    fn got(&self, range: Range<usize>) -> &[u8] {
        match self {
            Self::Slice(s) => &s[range],
            Self::Heap(b) => &b[range],
        }
    }
}

/// Reads exactly `len` bytes of body into `buf`. Each read must bring bytes within `timeout`.
/// The reader is woken once per `WAKE_BYTES` of the body rather than once per segment
/// (`Conn::wake_after`), and asks for every byte again once the body is in. A sender too slow
/// to bring that many within half of `timeout` is read byte by byte from then on, so that
/// `timeout` still bounds the time without a byte, not without `WAKE_BYTES`.
///
/// A body is little-endian f32 values. Each read (at most `WAKE_BYTES`) is looked at for a
/// NaN or an infinity as soon as it lands, while it is in the core's own cache; the answer is
/// whether none held one, which spares the engine a pass over the whole body from memory
/// ([`Checked::Finite`]). ps-bench at 1 M floats read durable goodput 4-9% higher this way
/// than with the engine's pass.
async fn read_body(
    sock: &mut Sock,
    mut buf: BodyBuf<'_>,
    len: usize,
    timeout: Duration,
) -> io::Result<bool> {
    let mut stall = Stall::new(timeout);
    let mut asked = 0;
    let mut slow = false;
    let mut filled = 0;
    let mut scanned = 0;
    let mut non_finite = false;
    let read = async {
        while filled < len {
            // Bytes the reader's buffer holds are read without waiting for the socket.
            let want = (len - filled)
                .saturating_sub(sock.buffer().len())
                .min(WAKE_BYTES);
            if !slow && want > 0 && want != asked {
                sock.get_ref().conn.wake_after(want);
                asked = want;
            }
            let patience = if asked > 1 { timeout / 2 } else { timeout };
            // At most `WAKE_BYTES` a read, so that what is scanned is still in the core's
            // own cache: a larger read copies several MiB, and its start then comes from
            // memory again.
            let mut rest = (&mut *sock).take((len - filled).min(WAKE_BYTES) as u64);
            let read = tokio::select! {
                biased;
                read = buf.read_from(&mut rest, filled) => read?,
                () = stall.quiet_for(patience) => {
                    if asked > 1 {
                        sock.get_ref().conn.wake_after(1);
                        (asked, slow) = (1, true);
                        continue;
                    }
                    return Err(stalled());
                }
            };
            if read == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            filled += read;
            let whole = filled & !3;
            non_finite |= ps_codec::quant::any_non_finite_le(buf.got(scanned..whole));
            scanned = whole;
            stall.progress();
        }
        Ok(!non_finite)
    };
    let result = read.await;
    if asked > 1 {
        sock.get_ref().conn.wake_after(1);
    }
    result
}

/// Whether a call has gone `timeout` without a byte arriving, with one timer per `timeout`
/// rather than one per read (a body arrives in many reads).
struct Stall {
    timeout: Duration,
    last: tokio::time::Instant,
    timer: std::pin::Pin<Box<tokio::time::Sleep>>,
}

impl Stall {
    fn new(timeout: Duration) -> Self {
        let last = tokio::time::Instant::now();
        Self {
            timeout,
            last,
            timer: Box::pin(tokio::time::sleep_until(last + timeout)),
        }
    }

    fn progress(&mut self) {
        self.last = tokio::time::Instant::now();
    }

    /// Resolves once `timeout` has passed since the last progress.
    async fn expired(&mut self) {
        self.quiet_for(self.timeout).await;
    }

    /// Resolves once `d` (at most `timeout`) has passed since the last progress.
    async fn quiet_for(&mut self, d: Duration) {
        loop {
            let due = self.last + d;
            if self.timer.deadline() > due {
                self.timer.as_mut().reset(due);
            }
            self.timer.as_mut().await;
            if tokio::time::Instant::now() >= self.last + d {
                return;
            }
            self.timer.as_mut().reset(self.last + d);
        }
    }
}

/// Reads and drops `len` bytes of a refused call's body, so the next call starts in place.
async fn discard(sock: &mut Sock, len: u64, timeout: Duration) -> io::Result<()> {
    let mut left = len;
    let mut scratch = vec![0u8; (64 << 10).min(len as usize)];
    let mut stall = Stall::new(timeout);
    while left > 0 {
        let want = (scratch.len() as u64).min(left) as usize;
        let read = tokio::select! {
            biased;
            read = sock.read(&mut scratch[..want]) => read?,
            () = stall.expired() => return Err(stalled()),
        };
        if read == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        left -= read as u64;
        stall.progress();
    }
    Ok(())
}

fn stalled() -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        "the call stalled in the middle of its body",
    )
}
