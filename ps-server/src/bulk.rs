//! The bulk stream's server: plain-f32 `PushDense` and `PullDense` over a raw TCP stream (the
//! framing is `ps_proto::bulk`, described in `ps.proto`). Each call is decoded into the same
//! wire request the gRPC edge receives and handed to the same [`PsService`] method, so
//! validation, exactly-once, metrics and errors are the gRPC path's; only the transport
//! differs. A pushed body is read once from the socket into the buffer the engine logs and
//! applies from; a pulled answer is written from the engine's buffers straight to the socket.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use prost::Message;
use ps_core::ValidationError;
use ps_core::wire::reason;
use ps_proto::bulk::{self, Head};
use ps_proto::v1 as pb;
use ps_proto::v1::parameter_server_server::ParameterServer;
use ps_runtime::status::{invalid_field, refusal};
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tonic::{Code, Request, Status};

use crate::service::PsService;
use crate::store::Store;

/// How the bulk listener behaves: the request limit and the shutdown timings of gRPC's.
#[derive(Debug, Clone, Copy)]
pub struct BulkOptions {
    pub max_request_bytes: usize,
    /// Time connections keep being served after shutdown begins.
    pub drain: Duration,
    /// Longest wait, after `drain`, for calls in progress to finish.
    pub grace: Duration,
}

/// Serves the bulk stream on `listener` until `shutdown` is cancelled: it then stops accepting,
/// keeps serving open connections for `drain`, closes each once its call in progress is
/// answered, and waits up to `grace` for that.
pub async fn serve<S: Store>(
    listener: TcpListener,
    svc: Arc<PsService<S>>,
    opts: BulkOptions,
    shutdown: CancellationToken,
) {
    let closing = CancellationToken::new();
    let mut conns = JoinSet::new();
    tracing::info!(local = ?listener.local_addr().ok(), "bulk stream listening");
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((sock, _)) => {
                    crate::metrics::bulk_connection();
                    conns.spawn(connection(sock, svc.clone(), opts.max_request_bytes, closing.clone()));
                }
                Err(e) => {
                    // Out of descriptors and the like: the next accept may succeed.
                    tracing::warn!(error = %e, "bulk accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
        }
    }
    drop(listener);
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

/// One connection: calls one after another until the peer closes it, it breaks the framing,
/// or the shard closes.
async fn connection<S: Store>(
    mut sock: TcpStream,
    svc: Arc<PsService<S>>,
    max_request_bytes: usize,
    closing: CancellationToken,
) {
    let _ = sock.set_nodelay(true);
    loop {
        let next = tokio::select! {
            biased;
            () = closing.cancelled() => return,
            next = bulk::read_head(&mut sock, max_request_bytes) => next,
        };
        let (head, header) = match next {
            Ok(Some(h)) => h,
            Ok(None) => return,
            Err(e) => {
                tracing::debug!(error = %e, "bulk stream closed: bad frame");
                return;
            }
        };
        let (code, header, body) =
            match call(&svc, head, &header, &mut sock, max_request_bytes).await {
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

/// Reads the rest of one call (its body) and runs it. The outer error is the socket's: the
/// stream is unusable. A refused call has had its whole body read, so the stream stays usable.
async fn call<S: Store>(
    svc: &PsService<S>,
    head: Head,
    header: &[u8],
    sock: &mut TcpStream,
    max_request_bytes: usize,
) -> io::Result<Answer> {
    match head.kind {
        bulk::PUSH_DENSE => {
            let mut req = match push_header(head, header, max_request_bytes) {
                Ok(r) => r,
                Err(refused) => {
                    discard(sock, head.body_len).await?;
                    return Ok(Err(refused));
                }
            };
            let body = read_body(sock, head.body_len as usize).await?;
            bulk::put_slice_data(&mut req.slices, body);
            Ok(svc
                .push_dense(Request::new(req))
                .await
                .map(|r| (r.into_inner().encode_to_vec(), Vec::new())))
        }
        bulk::PULL_DENSE => {
            discard(sock, head.body_len).await?;
            let req = match pull_header(head, header) {
                Ok(r) => r,
                Err(refused) => return Ok(Err(refused)),
            };
            Ok(match svc.pull_dense(Request::new(req)).await {
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
        other => {
            discard(sock, head.body_len).await?;
            Ok(Err(refusal(
                Code::Unimplemented,
                reason::NOT_ON_BULK_STREAM,
                format!("bulk method {other} is unknown to this shard (1 PushDense, 2 PullDense)"),
                [("method", other.to_string())],
            )))
        }
    }
}

/// A push's header, checked against its body before the body is read.
fn push_header(
    head: Head,
    header: &[u8],
    max_request_bytes: usize,
) -> Result<pb::PushDenseRequest, Status> {
    let req = pb::PushDenseRequest::decode(header)
        .map_err(|e| bad_header(format!("the PushDense header does not decode: {e}")))?;
    if req
        .slices
        .iter()
        .any(|s| s.values.as_ref().is_some_and(|v| !bulk::is_plain_f32(v)))
    {
        return Err(not_on_bulk_stream(
            "the bulk stream carries uncompressed ENCODING_F32 pushes only; send other \
             encodings through gRPC",
        ));
    }
    let want = bulk::f32_body_len(&req.slices).map_err(bad_header)?;
    if want != head.body_len {
        return Err(bad_header(format!(
            "the slices hold {want} bytes of f32 values but the body is {} bytes",
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
    Ok(req)
}

/// A pull's header: plain f32, no body.
fn pull_header(head: Head, header: &[u8]) -> Result<pb::PullDenseRequest, Status> {
    let req = pb::PullDenseRequest::decode(header)
        .map_err(|e| bad_header(format!("the PullDense header does not decode: {e}")))?;
    if head.body_len != 0 {
        return Err(bad_header("a bulk PullDense has no body".into()));
    }
    if !matches!(req.accept(), pb::Encoding::F32 | pb::Encoding::Unspecified) || req.delta.is_some()
    {
        return Err(not_on_bulk_stream(
            "the bulk stream answers plain f32 pulls only; pull other encodings and deltas \
             through gRPC",
        ));
    }
    Ok(req)
}

/// A call the bulk stream does not carry, which gRPC does.
fn not_on_bulk_stream(message: &str) -> Status {
    refusal(
        Code::InvalidArgument,
        reason::NOT_ON_BULK_STREAM,
        message,
        [],
    )
}

/// A bulk call whose header does not match the stream's framing rules.
fn bad_header(reason: String) -> Status {
    invalid_field(&ValidationError::new("bulk header", reason))
}

/// Reads exactly `len` bytes of body into one buffer, without zeroing it first.
async fn read_body(sock: &mut TcpStream, len: usize) -> io::Result<Bytes> {
    let mut buf = BytesMut::with_capacity(len);
    while buf.len() < len {
        let want = (len - buf.len()) as u64;
        if (&mut *sock).take(want).read_buf(&mut buf).await? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
    }
    Ok(buf.freeze())
}

/// Reads and drops `len` bytes of a refused call's body, so the next call starts in place.
async fn discard(sock: &mut TcpStream, len: u64) -> io::Result<()> {
    let copied = tokio::io::copy(&mut (&mut *sock).take(len), &mut tokio::io::sink()).await?;
    if copied < len {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(())
}
