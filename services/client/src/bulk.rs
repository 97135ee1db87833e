//! The client side of a shard's bulk stream (`ps_proto::bulk`): dense pushes and pulls (a push
//! and the pull of its chunks in one exchange too), sparse pushes and sparse pulls over raw
//! TCP connections, one call per connection at a time, connections kept for the next call. A
//! pull's values are read from the socket straight into the caller's tensor.
//!
//! Failures read as gRPC's do, so the caller's retry and exactly-once logic stays the same: a
//! shard's refusal is its status; a connection that breaks under a call is `unavailable` (a
//! push is then retried under its sequence number and applied once); a call past the client's
//! request timeout is `deadline_exceeded`. When the bulk port cannot be reached, the call goes
//! through gRPC ([`BulkPool::stream`] says `None`), the port is asked for again (a shard that
//! restarts on a system-picked port has a new one) and the bulk stream is tried again later.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use prost::Message;
use ps_core::wire::{KEEPALIVE_INTERVAL, KEEPALIVE_TIMEOUT};
use ps_proto::bulk;
use ps_proto::v1 as pb;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tonic::{Code, Status};
use tracing::Instrument as _;

use crate::auth::Token;
use crate::link::Link;
use crate::tls::{ClientTls, Conn};
use crate::{ClientConfig, trace};

/// Connections kept idle per shard.
const MAX_IDLE: usize = 32;

/// Most bytes of compressed values a push sends by the bulk stream, in its header (which the
/// shard reads whole, up to 4 MiB); a larger one goes through gRPC. A sparse pull's request
/// (its ids and digests) is bounded alike.
pub(crate) const MAX_COMPRESSED_BYTES: usize = 1 << 20;

/// Most bytes of an answer's header the client reads (an answer's values in other encodings
/// than plain f32, and sparse pulls' rows, come in it).
const MAX_ANSWER_HEADER: usize = 64 << 20;

/// Most bytes of rows a sparse pull expects by the bulk stream; a larger one goes through gRPC
/// (its answer could pass [`MAX_ANSWER_HEADER`]).
pub(crate) const MAX_SPARSE_ANSWER: usize = MAX_ANSWER_HEADER / 2;

/// After a failed connect, how long calls go through gRPC before the bulk port is tried again.
const RETRY_AFTER: Duration = Duration::from_secs(5);

/// The bulk connections to one shard.
#[derive(Debug)]
pub(crate) struct BulkPool {
    /// The host of the shard's gRPC endpoint, as `host:port` wants it.
    host: String,
    /// The shard's bulk port; 0 when it offers none.
    port: AtomicU16,
    connect_timeout: Duration,
    request_timeout: Option<Duration>,
    tls: Option<ClientTls>,
    /// Sent in every call's header.
    token: Option<Token>,
    idle: Mutex<Vec<Conn>>,
    /// After a failed connect: no attempt before this time.
    retry_at: Mutex<Option<Instant>>,
    /// A connect failed: the shard should be asked for its port again.
    wants_port: AtomicBool,
    /// The shard answered a bulk sparse push `unimplemented` (it is older than them): sparse
    /// pushes go through gRPC.
    no_sparse: AtomicBool,
    /// The shard answered a push-and-pull `unimplemented` (it is older than them): a push and
    /// a pull are sent instead.
    no_push_pull: AtomicBool,
    /// The shard refused a compressed push as not for the bulk stream (it is older than them):
    /// compressed pushes go through gRPC.
    no_compressed: AtomicBool,
    /// The shard answered a bulk sparse pull `unimplemented` (it is older than them): sparse
    /// pulls go through gRPC.
    no_sparse_pull: AtomicBool,
    /// The shard refused a delta pull as not for the bulk stream (it is older than them):
    /// delta pulls go through gRPC.
    no_delta: AtomicBool,
    /// The emulated link every call's frames cross (`ClientConfig::link_mbps`), shared with
    /// the client's gRPC channels.
    link: Option<Arc<Link>>,
}

/// A destination of pulled values: one chunk's place in the caller's tensor.
pub(crate) type Dst<'a> = (u64, &'a mut [f32]);

impl BulkPool {
    /// The pool for the bulk port `port` of the shard whose gRPC endpoint is `endpoint`, with
    /// the client's timeouts and credentials; `None`: not known yet, asked for on the shard's
    /// next gRPC call.
    pub(crate) fn new(
        endpoint: &str,
        port: Option<u16>,
        cfg: &ClientConfig,
        link: Option<Arc<Link>>,
    ) -> Option<Self> {
        let uri: http::Uri = endpoint.parse().ok()?;
        // An IPv6 host comes bracketed in a URI and stays so in host:port.
        let host = uri.host()?.to_owned();
        Some(Self {
            host,
            port: AtomicU16::new(port.unwrap_or(0)),
            connect_timeout: cfg.connect_timeout,
            request_timeout: cfg.request_timeout,
            tls: cfg.credentials.tls.clone(),
            token: cfg.credentials.token.clone(),
            idle: Mutex::new(Vec::new()),
            retry_at: Mutex::new(None),
            wants_port: AtomicBool::new(port.is_none()),
            no_sparse: AtomicBool::new(false),
            no_push_pull: AtomicBool::new(false),
            no_compressed: AtomicBool::new(false),
            no_sparse_pull: AtomicBool::new(false),
            no_delta: AtomicBool::new(false),
            link,
        })
    }

    /// Whether a call may try the bulk stream now.
    pub(crate) fn usable(&self) -> bool {
        self.port.load(Ordering::Relaxed) != 0
            && self.retry_at.lock().is_none_or(|t| Instant::now() >= t)
    }

    /// Whether a connect failed since the shard last told its port.
    pub(crate) fn wants_port(&self) -> bool {
        self.wants_port.load(Ordering::Relaxed)
    }

    /// The port the shard reports now; a new one may be tried at once.
    pub(crate) fn set_port(&self, port: u16) {
        self.wants_port.store(false, Ordering::Relaxed);
        if self.port.swap(port, Ordering::Relaxed) != port {
            *self.retry_at.lock() = None;
        }
    }

    /// What a call's header carries as its `authorization` (empty without a token).
    fn authorization(&self) -> String {
        self.token
            .as_ref()
            .map(|t| format!("Bearer {}", t.secret()))
            .unwrap_or_default()
    }

    fn addr(&self) -> String {
        format!("{}:{}", self.host, self.port.load(Ordering::Relaxed))
    }

    /// An idle connection or a new one; `None` when the shard's bulk port cannot be reached.
    async fn stream(&self) -> Option<Conn> {
        if let Some(s) = self.idle.lock().pop() {
            return Some(s);
        }
        let addr = self.addr();
        let why =
            match Conn::connect(&addr, &self.host, self.tls.as_ref(), self.connect_timeout).await {
                Ok(s) => {
                    keep_alive(s.tcp());
                    return Some(s);
                }
                Err(e) => e.to_string(),
            };
        tracing::info!(%addr, error = why, "shard's bulk stream unreachable; using gRPC for now");
        *self.retry_at.lock() = Some(Instant::now() + RETRY_AFTER);
        self.wants_port.store(true, Ordering::Relaxed);
        None
    }

    fn keep(&self, s: Conn) {
        let mut idle = self.idle.lock();
        if idle.len() < MAX_IDLE {
            idle.push(s);
        }
    }

    /// Whether compressed pushes (their data in the header, [`bulk::takes_body`]) and pulls
    /// answered in other encodings than f32 may go by this shard's bulk stream: `false` once
    /// it refused one as older than them.
    pub(crate) fn takes_compressed(&self) -> bool {
        !self.no_compressed.load(Ordering::Relaxed)
    }

    /// Pushes `req`: its plain-f32 slices with their data left out, `body` holding their values
    /// as bytes, in slice order (the caller's own memory: nothing is copied); any compressed
    /// slice with its data in place. `Ok(None)`: no connection could be made, or the shard is
    /// older than compressed pushes on the bulk stream; send it through gRPC.
    pub(crate) async fn push_dense(
        &self,
        mut req: pb::PushDenseRequest,
        body: &[&[u8]],
    ) -> Result<Option<pb::PushResponse>, Status> {
        let compressed = req
            .slices
            .iter()
            .any(|s| s.values.as_ref().is_some_and(|v| !bulk::takes_body(v)));
        let span = trace::client_span(bulk::PUSH_DENSE_PATH, &self.addr());
        req.trace_context = trace::context_map(&span);
        req.authorization = self.authorization();
        let answer = self
            .push(bulk::PUSH_DENSE, &req.encode_to_vec(), body, span)
            .await;
        self.unless_older(compressed, answer)
    }

    /// A compressed push's answer: `Ok(None)` (and later ones through gRPC) when the shard
    /// refused it as not for the bulk stream, as one older than them does; it applied nothing.
    fn unless_older(
        &self,
        compressed: bool,
        answer: Result<Option<pb::PushResponse>, Status>,
    ) -> Result<Option<pb::PushResponse>, Status> {
        match answer {
            Err(s) if compressed && refused_as_older(&s) => {
                self.no_compressed.store(true, Ordering::Relaxed);
                Ok(None)
            }
            answer => answer,
        }
    }

    /// Pushes `req` as [`BulkPool::push_dense`] does and, in the same exchange, reads the
    /// pushed chunks' values after the push into `dsts` (one per slice, in slice order). With
    /// the answer comes whether they were read: not when the shard could not read them, or is
    /// older than the method (the call was then a plain push); they are then to be pulled.
    /// `Ok(None)`: no connection could be made; send it through gRPC.
    pub(crate) async fn push_pull_dense(
        &self,
        req: pb::PushDenseRequest,
        body: &[&[u8]],
        dsts: &mut [Dst<'_>],
    ) -> Result<Option<(pb::PushResponse, bool)>, Status> {
        let unpulled = |a: Option<pb::PushResponse>| a.map(|r| (r, false));
        if self.no_push_pull.load(Ordering::Relaxed) {
            return self.push_dense(req, body).await.map(unpulled);
        }
        let span = trace::client_span(bulk::PUSH_DENSE_PATH, &self.addr());
        let header = pb::PushDenseRequest {
            trace_context: trace::context_map(&span),
            authorization: self.authorization(),
            ..req.clone()
        }
        .encode_to_vec();
        match traced(span, self.push_pull_untraced(&header, body, dsts)).await {
            // A shard that does not know the method applied nothing.
            Err(s) if s.code() == Code::Unimplemented => {
                self.no_push_pull.store(true, Ordering::Relaxed);
                self.push_dense(req, body).await.map(unpulled)
            }
            answer => answer,
        }
    }

    async fn push_pull_untraced(
        &self,
        header: &[u8],
        body: &[&[u8]],
        dsts: &mut [Dst<'_>],
    ) -> Result<Option<(pb::PushResponse, bool)>, Status> {
        let Some(mut s) = self.stream().await else {
            return Ok(None);
        };
        let answered = self
            .timed(async {
                self.uplink(header, body).await;
                bulk::write_frame_parts(&mut s, bulk::PUSH_PULL_DENSE, header, body).await?;
                let (body_len, answer) = read_answer(&mut s).await?;
                let header = match answer {
                    Ok(h) => h,
                    Err(status) => {
                        self.downlink(0).await;
                        return Ok(Err(status));
                    }
                };
                let resp = pb::PushPullDenseResponse::decode(header.as_slice())
                    .map_err(|e| protocol(format!("push-and-pull answer does not decode: {e}")))?;
                let push = resp
                    .push
                    .ok_or_else(|| protocol("a push-and-pull answer without its push"))?;
                let Some(pull) = resp.pull else {
                    if body_len != 0 {
                        return Err(protocol("an answer with values but no pull"));
                    }
                    self.downlink(header.len() as u64).await;
                    return Ok(Ok((push, false)));
                };
                read_pulled(&mut s, &pull, body_len, dsts).await?;
                self.downlink(header.len() as u64 + body_len).await;
                Ok(Ok((push, true)))
            })
            .await
            .map_err(|e| self.broken(e))?;
        self.keep(s);
        answered.map(Some)
    }

    /// Pushes `req`, whose values are either plain f32 left out (`body` holds them) or
    /// compressed and in place (`body` is empty). `req` is left as it came, for gRPC.
    /// `Ok(None)`: no connection could be made, or the shard is older than bulk sparse pushes
    /// (or than compressed ones); send it through gRPC.
    pub(crate) async fn push_sparse(
        &self,
        req: &mut pb::PushSparseRequest,
        body: &[u8],
    ) -> Result<Option<pb::PushResponse>, Status> {
        if self.no_sparse.load(Ordering::Relaxed) {
            return Ok(None);
        }
        let compressed = req.values.as_ref().is_some_and(|v| !bulk::takes_body(v));
        let span = trace::client_span(bulk::PUSH_SPARSE_PATH, &self.addr());
        req.trace_context = trace::context_map(&span);
        req.authorization = self.authorization();
        let header = req.encode_to_vec();
        // Credentials and trace context travel in the bulk header only (gRPC: metadata).
        req.trace_context.clear();
        req.authorization.clear();
        match self.push(bulk::PUSH_SPARSE, &header, &[body], span).await {
            // A shard that does not know the method applied nothing.
            Err(s) if s.code() == Code::Unimplemented => {
                self.no_sparse.store(true, Ordering::Relaxed);
                Ok(None)
            }
            answer => self.unless_older(compressed, answer),
        }
    }

    /// One push call of `kind` under `span`: its encoded header, then `body`.
    async fn push(
        &self,
        kind: u32,
        header: &[u8],
        body: &[&[u8]],
        span: tracing::Span,
    ) -> Result<Option<pb::PushResponse>, Status> {
        traced(span, self.push_untraced(kind, header, body)).await
    }

    async fn push_untraced(
        &self,
        kind: u32,
        header: &[u8],
        body: &[&[u8]],
    ) -> Result<Option<pb::PushResponse>, Status> {
        let Some(mut s) = self.stream().await else {
            return Ok(None);
        };
        let answer = self
            .timed(async {
                self.uplink(header, body).await;
                bulk::write_frame_parts(&mut s, kind, header, body).await?;
                let (body_len, answer) = read_answer(&mut s).await?;
                self.downlink(answer.as_ref().map_or(0, |h| h.len() as u64))
                    .await;
                if body_len != 0 {
                    return Err(protocol("a push answer with a body"));
                }
                Ok(answer)
            })
            .await
            .map_err(|e| self.broken(e))?;
        // A refusal leaves the stream in place for the next call, as an answer does.
        self.keep(s);
        let header = answer?;
        pb::PushResponse::decode(header.as_slice())
            .map(Some)
            .map_err(|e| Status::internal(format!("bulk push answer does not decode: {e}")))
    }

    /// Pulls `req` (plain f32), writing each answered chunk into its destination, in request
    /// order. `Ok(None)`: no connection could be made; pull through gRPC.
    pub(crate) async fn pull_dense(
        &self,
        req: &pb::PullDenseRequest,
        dsts: &mut [Dst<'_>],
    ) -> Result<Option<()>, Status> {
        let span = trace::client_span(bulk::PULL_DENSE_PATH, &self.addr());
        let req = pb::PullDenseRequest {
            trace_context: trace::context_map(&span),
            authorization: self.authorization(),
            ..req.clone()
        };
        traced(span, self.pull_dense_untraced(&req, dsts)).await
    }

    async fn pull_dense_untraced(
        &self,
        req: &pb::PullDenseRequest,
        dsts: &mut [Dst<'_>],
    ) -> Result<Option<()>, Status> {
        let Some(mut s) = self.stream().await else {
            return Ok(None);
        };
        let answered = self
            .timed(async {
                let (body_len, answer) = self.ask_pull(&mut s, req).await?;
                let header = match answer {
                    Ok(h) => h,
                    // A refusal's body was read with it; the stream stays usable.
                    Err(status) => {
                        self.downlink(0).await;
                        return Ok(Err(status));
                    }
                };
                let resp = pb::PullDenseResponse::decode(header.as_slice())
                    .map_err(|e| protocol(format!("pull answer does not decode: {e}")))?;
                read_pulled(&mut s, &resp, body_len, dsts).await?;
                self.downlink(header.len() as u64 + body_len).await;
                Ok(Ok(()))
            })
            .await
            .map_err(|e| self.broken(e))?;
        self.keep(s);
        answered.map(Some)
    }

    /// With an emulated link: waits until the uplink would have carried a request frame of
    /// `header` and `body` (before it is written, as the gRPC channels' emulation waits before
    /// it sends).
    async fn uplink(&self, header: &[u8], body: &[&[u8]]) {
        if let Some(link) = &self.link {
            let body: usize = body.iter().map(|b| b.len()).sum();
            link.send((bulk::HEAD_LEN + header.len() + body) as u64)
                .await;
        }
    }

    /// With an emulated link: waits until the downlink would have carried an answer of `bytes`
    /// after its head (once it is read).
    async fn downlink(&self, bytes: u64) {
        if let Some(link) = &self.link {
            link.receive(bulk::HEAD_LEN as u64 + bytes).await;
        }
    }

    /// Pulls `req`, whose `accept` is an encoding other than plain f32 or which is a delta
    /// pull: the answer comes whole, its values in its header. `Ok(None)`: no connection could
    /// be made, or the shard is older than such pulls on the bulk stream (it refused one, and
    /// the later ones are not sent); pull through gRPC.
    pub(crate) async fn pull_dense_encoded(
        &self,
        req: &pb::PullDenseRequest,
    ) -> Result<Option<pb::PullDenseResponse>, Status> {
        let older = if req.delta.is_some() {
            &self.no_delta
        } else {
            &self.no_compressed
        };
        if older.load(Ordering::Relaxed) {
            return Ok(None);
        }
        let span = trace::client_span(bulk::PULL_DENSE_PATH, &self.addr());
        let req = pb::PullDenseRequest {
            trace_context: trace::context_map(&span),
            authorization: self.authorization(),
            ..req.clone()
        };
        let header = req.encode_to_vec();
        let call = self.answered_in_header(bulk::PULL_DENSE, &header, "an encoded pull");
        match traced(span, call).await {
            Err(s) if refused_as_older(&s) => {
                older.store(true, Ordering::Relaxed);
                Ok(None)
            }
            answer => answer,
        }
    }

    /// One call of `kind` without a body whose answer comes whole in its header, decoded as
    /// `M` (`what` names the call in errors). `Ok(None)`: no connection could be made.
    async fn answered_in_header<M: Message + Default>(
        &self,
        kind: u32,
        header: &[u8],
        what: &str,
    ) -> Result<Option<M>, Status> {
        let Some(mut s) = self.stream().await else {
            return Ok(None);
        };
        let answered = self
            .timed(async {
                let (body_len, answer) = self.ask(&mut s, kind, header).await?;
                self.downlink(answer.as_ref().map_or(0, |h| h.len() as u64))
                    .await;
                let header = match answer {
                    Ok(h) => h,
                    Err(status) => return Ok(Err(status)),
                };
                if body_len != 0 {
                    return Err(protocol(format!("{what} answered with a body")));
                }
                M::decode(header.as_slice())
                    .map(Ok)
                    .map_err(|e| protocol(format!("{what} answer does not decode: {e}")))
            })
            .await
            .map_err(|e| self.broken(e))?;
        self.keep(s);
        answered.map(Some)
    }

    /// Pulls rows as `req` asks (its `map_epoch` set by the caller): the answer comes whole in
    /// the header. `Ok(None)`: no connection could be made, or the shard is older than sparse
    /// pulls on the bulk stream; pull through gRPC.
    pub(crate) async fn pull_sparse(
        &self,
        req: &pb::PullSparseRequest,
    ) -> Result<Option<pb::PullSparseResponse>, Status> {
        if self.no_sparse_pull.load(Ordering::Relaxed) {
            return Ok(None);
        }
        let span = trace::client_span(bulk::PULL_SPARSE_PATH, &self.addr());
        let header = pb::PullSparseRequest {
            trace_context: trace::context_map(&span),
            authorization: self.authorization(),
            ..req.clone()
        }
        .encode_to_vec();
        let call = self.answered_in_header(bulk::PULL_SPARSE, &header, "a sparse pull");
        let answer = traced(span, call).await;
        match answer {
            // A shard that does not know the method answered nothing.
            Err(s) if s.code() == Code::Unimplemented => {
                self.no_sparse_pull.store(true, Ordering::Relaxed);
                Ok(None)
            }
            answer => answer,
        }
    }

    /// Sends a pull (paced by the link) and reads its answer's head and header: the body's
    /// length, and the header or the refusal.
    async fn ask_pull(
        &self,
        s: &mut Conn,
        req: &pb::PullDenseRequest,
    ) -> io::Result<(u64, Result<Vec<u8>, Status>)> {
        self.ask(s, bulk::PULL_DENSE, &req.encode_to_vec()).await
    }

    /// Sends a call of `kind` without a body (paced by the link) and reads its answer's head
    /// and header: the body's length, and the header or the refusal.
    async fn ask(
        &self,
        s: &mut Conn,
        kind: u32,
        header: &[u8],
    ) -> io::Result<(u64, Result<Vec<u8>, Status>)> {
        self.uplink(header, &[]).await;
        bulk::write_frame(s, kind, header, &[]).await?;
        read_answer(s).await
    }

    /// Runs one call's I/O under the client's request timeout.
    async fn timed<T>(&self, call: impl Future<Output = io::Result<T>>) -> io::Result<T> {
        match self.request_timeout {
            Some(t) => tokio::time::timeout(t, call)
                .await
                .unwrap_or_else(|_| Err(io::ErrorKind::TimedOut.into())),
            None => call.await,
        }
    }

    /// A connection that failed under a call: dropped with every idle one (a shard that went
    /// away took them all), and `unavailable`, which the caller retries. A timeout is
    /// `deadline_exceeded`, as gRPC says it; framing errors are the shard's fault.
    fn broken(&self, e: io::Error) -> Status {
        self.idle.lock().clear();
        let addr = self.addr();
        match e.kind() {
            io::ErrorKind::InvalidData => Status::internal(format!("bulk stream to {addr}: {e}")),
            io::ErrorKind::TimedOut => Status::deadline_exceeded(format!(
                "bulk call to {addr} took longer than the request timeout"
            )),
            _ => Status::unavailable(format!("bulk stream to {addr} broke: {e}")),
        }
    }
}

/// Whether a compressed push or an encoded pull was refused as not for the bulk stream, as a
/// shard older than them refuses it (having applied nothing).
fn refused_as_older(s: &Status) -> bool {
    s.code() == Code::InvalidArgument
        && crate::error::reason_of(s).as_deref() == Some(ps_core::wire::reason::NOT_ON_BULK_STREAM)
}

/// Runs one call under its client span and records its outcome there.
async fn traced<T>(
    span: tracing::Span,
    call: impl Future<Output = Result<T, Status>>,
) -> Result<T, Status> {
    let answer = call.instrument(span.clone()).await;
    trace::record_status(
        &span,
        answer.as_ref().map_or_else(Status::code, |_| Code::Ok),
    );
    answer
}

fn protocol(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

/// Reads an answer's head and header: the body's length and the header of an OK answer, or
/// the status a refusal carries (its body, the error details, read with it).
async fn read_answer(s: &mut Conn) -> io::Result<(u64, Result<Vec<u8>, Status>)> {
    /// Error details are a few hundred bytes; more is not a refusal of ours.
    const MAX_DETAILS: u64 = 64 << 10;
    let (head, header) = bulk::read_head(s, MAX_ANSWER_HEADER)
        .await?
        .ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof))?;
    if head.kind == 0 {
        return Ok((head.body_len, Ok(header)));
    }
    if head.body_len > MAX_DETAILS {
        return Err(protocol("a refusal with a body larger than error details"));
    }
    let mut details = vec![0u8; head.body_len as usize];
    s.read_exact(&mut details).await?;
    let code = i32::try_from(head.kind).map_or(tonic::Code::Unknown, tonic::Code::from_i32);
    let message = String::from_utf8_lossy(&header).into_owned();
    Ok((0, Err(Status::with_details(code, message, details.into()))))
}

/// Reads a pull answer's body, `body_len` bytes of the values `resp` describes, into `dsts`,
/// once the answer is checked against them.
async fn read_pulled(
    s: &mut Conn,
    resp: &pb::PullDenseResponse,
    body_len: u64,
    dsts: &mut [Dst<'_>],
) -> io::Result<()> {
    check_pull(resp, body_len, dsts).map_err(protocol)?;
    for (_, dst) in dsts.iter_mut() {
        s.read_body(bytemuck::cast_slice_mut(dst)).await?;
        from_le(dst);
    }
    Ok(())
}

/// Checks that a pull's answer is what was asked: one plain-f32 slice per requested chunk, in
/// order, each the length of its destination, and a body of exactly their bytes.
fn check_pull(resp: &pb::PullDenseResponse, body_len: u64, dsts: &[Dst<'_>]) -> Result<(), String> {
    if resp.slices.len() != dsts.len() {
        return Err(format!(
            "{} slices answered for {} chunks",
            resp.slices.len(),
            dsts.len()
        ));
    }
    let want = bulk::f32_body_len(&resp.slices)?;
    if want != body_len {
        return Err(format!("slices of {want} bytes in a body of {body_len}"));
    }
    for (s, (chunk, dst)) in resp.slices.iter().zip(dsts) {
        let n = s.values.as_ref().map_or(0, |v| v.num_values);
        if s.chunk != *chunk || n != dst.len() as u64 {
            return Err(format!(
                "chunk {} of {n} values answered where chunk {chunk} of {} was asked",
                s.chunk,
                dst.len()
            ));
        }
    }
    Ok(())
}

/// Values arrive little-endian; on a big-endian host they are swapped in place.
fn from_le(values: &mut [f32]) {
    if cfg!(target_endian = "big") {
        for v in values {
            *v = f32::from_bits(u32::from_le(v.to_bits()));
        }
    }
}

/// A bulk connection whose peer goes silent fails within about half a minute instead of the
/// kernel's many minutes: keepalive probes once it has been idle for [`KEEPALIVE_INTERVAL`]
/// (waiting for an answer is idle), and data left unacknowledged for as long fails it too. The
/// call then fails as `unavailable` and is retried on a new connection.
fn keep_alive(s: &TcpStream) {
    let sock = socket2::SockRef::from(s);
    let probes = socket2::TcpKeepalive::new()
        .with_time(KEEPALIVE_INTERVAL)
        .with_interval(Duration::from_secs(2))
        .with_retries(5);
    if let Err(e) = sock
        .set_tcp_keepalive(&probes)
        .and_then(|()| sock.set_tcp_user_timeout(Some(KEEPALIVE_INTERVAL + KEEPALIVE_TIMEOUT)))
    {
        tracing::debug!(error = %e, "bulk stream: keepalive not set");
    }
}
