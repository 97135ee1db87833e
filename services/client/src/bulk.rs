//! The client side of a shard's bulk stream (`ps_proto::bulk`): plain-f32 dense pushes and
//! pulls over raw TCP connections, one call per connection at a time, connections kept for
//! the next call. A pull's values are read from the socket straight into the caller's tensor.
//!
//! Failures read as gRPC's do, so the caller's retry and exactly-once logic stays the same: a
//! shard's refusal is its status; a connection that breaks under a call is `unavailable` (a
//! push is then retried under its sequence number and applied once). A shard whose bulk port
//! cannot be reached at all is left to gRPC from then on ([`BulkPool::stream`] says `None`).

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use prost::Message;
use ps_proto::bulk;
use ps_proto::v1 as pb;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tonic::Status;

/// Connections kept idle per shard.
const MAX_IDLE: usize = 32;

/// The bulk connections to one shard.
#[derive(Debug)]
pub(crate) struct BulkPool {
    /// `host:port`.
    addr: String,
    connect_timeout: Duration,
    idle: Mutex<Vec<TcpStream>>,
    /// Set once a connection could not be made: gRPC carries everything from then on.
    unreachable: AtomicBool,
}

/// A destination of pulled values: one chunk's place in the caller's tensor.
pub(crate) type Dst<'a> = (u64, &'a mut [f32]);

impl BulkPool {
    /// The pool for the bulk port `port` of the shard whose gRPC endpoint is `endpoint`.
    pub(crate) fn new(endpoint: &str, port: u16, connect_timeout: Duration) -> Option<Self> {
        let uri: http::Uri = endpoint.parse().ok()?;
        let host = uri.host()?;
        // An IPv6 host comes bracketed in a URI and must stay so in host:port.
        Some(Self {
            addr: format!("{host}:{port}"),
            connect_timeout,
            idle: Mutex::new(Vec::new()),
            unreachable: AtomicBool::new(false),
        })
    }

    pub(crate) fn usable(&self) -> bool {
        !self.unreachable.load(Ordering::Relaxed)
    }

    /// An idle connection or a new one; `None` when the shard's bulk port cannot be reached.
    async fn stream(&self) -> Option<TcpStream> {
        if let Some(s) = self.idle.lock().pop() {
            return Some(s);
        }
        match tokio::time::timeout(self.connect_timeout, TcpStream::connect(&self.addr)).await {
            Ok(Ok(s)) => {
                let _ = s.set_nodelay(true);
                Some(s)
            }
            Ok(Err(e)) => self.give_up(&e.to_string()),
            Err(_) => self.give_up("connect timed out"),
        }
    }

    fn give_up(&self, why: &str) -> Option<TcpStream> {
        if !self.unreachable.swap(true, Ordering::Relaxed) {
            tracing::warn!(addr = %self.addr, error = why, "shard's bulk stream unreachable; using gRPC only");
        }
        None
    }

    fn keep(&self, s: TcpStream) {
        let mut idle = self.idle.lock();
        if idle.len() < MAX_IDLE {
            idle.push(s);
        }
    }

    /// Pushes `req` (its slices plain f32). `Ok(None)`: no connection could be made; send it
    /// through gRPC.
    pub(crate) async fn push_dense(
        &self,
        mut req: pb::PushDenseRequest,
    ) -> Result<Option<pb::PushResponse>, Status> {
        let Some(mut s) = self.stream().await else {
            return Ok(None);
        };
        let body = bulk::take_slice_data(&mut req.slices);
        let answer = async {
            bulk::write_frame(&mut s, bulk::PUSH_DENSE, &req.encode_to_vec(), &body).await?;
            let (head, header) = read_answer(&mut s).await?;
            if head.body_len != 0 {
                return Err(protocol("a push answer with a body"));
            }
            Ok(header)
        }
        .await
        .map_err(|e| self.broken(e))?;
        // A refusal leaves the stream in place for the next call, as an answer does.
        self.keep(s);
        let header = status_of(answer)?;
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
        let Some(mut s) = self.stream().await else {
            return Ok(None);
        };
        let answered = async {
            bulk::write_frame(&mut s, bulk::PULL_DENSE, &req.encode_to_vec(), &[]).await?;
            let (head, header) = read_answer(&mut s).await?;
            let header = match status_of(header) {
                Ok(h) => h,
                // A refusal has no body; the stream stays usable.
                Err(status) => return Ok(Err(status)),
            };
            let resp = pb::PullDenseResponse::decode(header.as_slice())
                .map_err(|e| protocol(format!("pull answer does not decode: {e}")))?;
            check_pull(&resp, head.body_len, dsts).map_err(protocol)?;
            for (_, dst) in dsts.iter_mut() {
                s.read_exact(bytemuck::cast_slice_mut(dst)).await?;
                from_le(dst);
            }
            Ok(Ok(()))
        }
        .await
        .map_err(|e| self.broken(e))?;
        self.keep(s);
        answered.map(Some)
    }

    /// A connection that failed under a call: dropped, and `unavailable` (retried by the
    /// caller). Framing errors are the shard's fault and are not retried.
    fn broken(&self, e: io::Error) -> Status {
        if e.kind() == io::ErrorKind::InvalidData {
            return Status::internal(format!("bulk stream to {}: {e}", self.addr));
        }
        Status::unavailable(format!("bulk stream to {} broke: {e}", self.addr))
    }
}

fn protocol(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

/// The answer frame kept as (head, header), with the status code folded into the header's
/// meaning: see [`status_of`].
async fn read_answer(s: &mut TcpStream) -> io::Result<(bulk::Head, (u32, Vec<u8>))> {
    let (head, header) = bulk::read_head(s, 64 << 20)
        .await?
        .ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof))?;
    if head.kind != 0 && head.body_len != 0 {
        return Err(protocol("a refusal with a body"));
    }
    Ok((head, (head.kind, header)))
}

/// The header of an OK answer, or the status a refusal carries.
fn status_of((code, header): (u32, Vec<u8>)) -> Result<Vec<u8>, Status> {
    if code == 0 {
        return Ok(header);
    }
    let code = i32::try_from(code).map_or(tonic::Code::Unknown, tonic::Code::from_i32);
    Err(Status::new(code, String::from_utf8_lossy(&header)))
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
