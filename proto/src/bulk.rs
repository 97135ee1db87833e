//! Framing of the bulk stream, the shard's second listener for dense and sparse pushes and
//! plain-f32 dense pulls (described with `ShardInfoResponse.bulk_port` in `ps.proto`): a fixed
//! 20-byte head, a protobuf header, then the payload bytes themselves. Plain f32 values cross
//! once, as they are, with no HTTP/2 frames around them and no protobuf encoding of them;
//! compressed pushes carry their data in the header, and take the stream for its lower cost
//! per call.
//!
//! The shard's handler and the client's caller both live next to their gRPC twins; this module
//! holds only what both sides must agree on.

use std::io;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::v1 as pb;

/// First bytes of every head.
pub const MAGIC: [u8; 4] = *b"PSB1";
/// Bytes of a head: magic, kind, header length, body length.
pub const HEAD_LEN: usize = 20;
/// Request kind of a `PushDense` call.
pub const PUSH_DENSE: u32 = 1;
/// Request kind of a `PullDense` call.
pub const PULL_DENSE: u32 = 2;
/// Request kind of a `PushSparse` call.
pub const PUSH_SPARSE: u32 = 3;
/// Request kind of a `PushPullDense` call: a `PushDense` answered with its chunks' values
/// after the push (`PushPullDenseResponse`), on the bulk stream only.
pub const PUSH_PULL_DENSE: u32 = 4;
/// Request kind of a `PullSparse` call, answered whole in the header (no body).
pub const PULL_SPARSE: u32 = 5;
/// The gRPC method a bulk `PushDense` stands for: the name its spans carry on both sides.
pub const PUSH_DENSE_PATH: &str = "/ps.v1.ParameterServer/PushDense";
/// The gRPC method a bulk `PullDense` stands for.
pub const PULL_DENSE_PATH: &str = "/ps.v1.ParameterServer/PullDense";
/// The gRPC method a bulk `PushSparse` stands for.
pub const PUSH_SPARSE_PATH: &str = "/ps.v1.ParameterServer/PushSparse";
/// The gRPC method a bulk `PullSparse` stands for.
pub const PULL_SPARSE_PATH: &str = "/ps.v1.ParameterServer/PullSparse";

/// A frame's head. `kind` is the method of a request, the gRPC status code of an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head {
    pub kind: u32,
    pub header_len: u32,
    pub body_len: u64,
}

impl Head {
    pub fn encode(&self) -> [u8; HEAD_LEN] {
        let mut b = [0u8; HEAD_LEN];
        b[..4].copy_from_slice(&MAGIC);
        b[4..8].copy_from_slice(&self.kind.to_le_bytes());
        b[8..12].copy_from_slice(&self.header_len.to_le_bytes());
        b[12..].copy_from_slice(&self.body_len.to_le_bytes());
        b
    }

    /// Parses a head; anything not starting with the magic is `InvalidData` (the stream is not
    /// a bulk stream, or lost its place, and must be closed).
    pub fn decode(b: &[u8; HEAD_LEN]) -> io::Result<Self> {
        let magic = &b[..4];
        if magic != MAGIC {
            return Err(invalid(format!(
                "not a bulk frame: it starts with {magic:02x?}, not {MAGIC:02x?}"
            )));
        }
        let word = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        Ok(Self {
            kind: word(4),
            header_len: word(8),
            body_len: u64::from(word(12)) | u64::from(word(16)) << 32,
        })
    }
}

fn invalid(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

/// Reads a frame's head and its header (at most `max_header` bytes). `Ok(None)` when the
/// stream ends cleanly before the frame's first byte.
pub async fn read_head<R: AsyncRead + Unpin>(
    r: &mut R,
    max_header: usize,
) -> io::Result<Option<(Head, Vec<u8>)>> {
    let mut b = [0u8; HEAD_LEN];
    let n = r.read(&mut b).await?;
    if n == 0 {
        return Ok(None);
    }
    r.read_exact(&mut b[n..]).await?;
    let head = Head::decode(&b)?;
    let len = head.header_len as usize;
    if len > max_header {
        return Err(invalid(format!(
            "a bulk header of {len} bytes is over the limit of {max_header}"
        )));
    }
    // Read as the bytes arrive: a head claiming a large header reserves nothing it was not
    // sent.
    let mut header = Vec::with_capacity(len.min(64 << 10));
    if (&mut *r).take(len as u64).read_to_end(&mut header).await? != len {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(Some((head, header)))
}

/// Bodies up to this size are copied behind their head and header and sent in one write.
const COALESCE_BYTES: u64 = 64 << 10;

/// Writes a frame: its head and header in one write, then each part of its body. A small
/// body goes in the same write: with Nagle's algorithm off, each write is a segment of its
/// own, and a peer woken by the head alone would wait again, a scheduler round trip, for a
/// body a few microseconds behind it.
pub async fn write_frame<W: AsyncWrite + Unpin>(
    w: &mut W,
    kind: u32,
    header: &[u8],
    body: &[Bytes],
) -> io::Result<()> {
    let parts: Vec<&[u8]> = body.iter().map(Bytes::as_ref).collect();
    write_frame_parts(w, kind, header, &parts).await
}

/// [`write_frame`] with a body of borrowed parts: a client pushes the caller's own values
/// this way, without copying them into a payload first.
pub async fn write_frame_parts<W: AsyncWrite + Unpin>(
    w: &mut W,
    kind: u32,
    header: &[u8],
    body: &[&[u8]],
) -> io::Result<()> {
    let header_len = u32::try_from(header.len())
        .map_err(|_| invalid(format!("a header of {} bytes", header.len())))?;
    let head = Head {
        kind,
        header_len,
        body_len: body.iter().map(|b| b.len() as u64).sum(),
    };
    // The parts copied into the first write, and those written from their own buffers.
    let (inline, rest) = if head.body_len <= COALESCE_BYTES {
        (body, &[][..])
    } else {
        (&[][..], body)
    };
    let mut first =
        Vec::with_capacity(HEAD_LEN + header.len() + inline.iter().map(|p| p.len()).sum::<usize>());
    first.extend_from_slice(&head.encode());
    first.extend_from_slice(header);
    for part in inline {
        first.extend_from_slice(part);
    }
    w.write_all(&first).await?;
    for part in rest {
        w.write_all(part).await?;
    }
    w.flush().await
}

/// Moves every slice's payload data out, leaving it empty: the header's slices, and the
/// body's parts in slice order.
pub fn take_slice_data(slices: &mut [pb::DenseSlice]) -> Vec<Bytes> {
    slices
        .iter_mut()
        .filter_map(|s| s.values.as_mut().map(|v| std::mem::take(&mut v.data)))
        .collect()
}

/// Whether a payload is what the bulk stream carries: uncompressed `ENCODING_F32`.
pub fn is_plain_f32(p: &pb::Payload) -> bool {
    p.encoding() == pb::Encoding::F32 && p.compression() == pb::Compression::None
}

/// The body a pull answer's slices call for, in bytes: each slice must hold an uncompressed
/// `ENCODING_F32` payload with its data left out, the one form a pull is answered in.
pub fn f32_body_len(slices: &[pb::DenseSlice]) -> Result<u64, String> {
    body_len(slices, f32_payload_len)
}

/// The sum of `len_of` over the slices' payloads (each slice must have one).
fn body_len(
    slices: &[pb::DenseSlice],
    len_of: impl Fn(&pb::Payload) -> Result<u64, String>,
) -> Result<u64, String> {
    let mut total = 0u64;
    for (i, s) in slices.iter().enumerate() {
        let v = s
            .values
            .as_ref()
            .ok_or_else(|| format!("slices[{i}]: a slice needs its values"))?;
        total = len_of(v)
            .and_then(|b| total.checked_add(b).ok_or_else(|| "overflow".to_owned()))
            .map_err(|e| format!("slices[{i}]: {e}"))?;
    }
    Ok(total)
}

/// The body one answer payload calls for, in bytes: it must be uncompressed `ENCODING_F32`
/// with its data left out (the data is the body).
pub fn f32_payload_len(v: &pb::Payload) -> Result<u64, String> {
    if !is_plain_f32(v) {
        return Err(format!(
            "the bulk stream carries uncompressed ENCODING_F32 only (got {:?}, {:?}); \
             send other encodings through gRPC",
            v.encoding(),
            v.compression()
        ));
    }
    if !v.data.is_empty() {
        return Err("a bulk header's payloads are empty; their data is the body".to_owned());
    }
    v.num_values
        .checked_mul(4)
        .ok_or_else(|| format!("{} values overflow", v.num_values))
}

/// Whether a push header's payload takes its data from the body: uncompressed `ENCODING_F32`
/// with its data left out. Any other payload carries its data in the header itself: a
/// compressed push (top-k, fp16, int8 of a gradient) is small, and goes by the bulk stream
/// for its lower cost per call, not to keep its bytes out of a protobuf message.
pub fn takes_body(v: &pb::Payload) -> bool {
    is_plain_f32(v) && v.data.is_empty()
}

/// The body one push header's payload calls for, in bytes: `4 * num_values` when it takes its
/// data from the body ([`takes_body`]), else none.
pub fn push_payload_len(v: &pb::Payload) -> Result<u64, String> {
    if !takes_body(v) {
        return Ok(0);
    }
    v.num_values
        .checked_mul(4)
        .ok_or_else(|| format!("{} values overflow", v.num_values))
}

/// The body a push header's slices call for, in bytes: slice after slice, the values of those
/// that take theirs from the body ([`takes_body`]).
pub fn push_body_len(slices: &[pb::DenseSlice]) -> Result<u64, String> {
    body_len(slices, push_payload_len)
}

/// Gives each slice that takes its data from the body ([`takes_body`]) its data from `body`
/// (split, not copied); `body` holds exactly what [`push_body_len`] asked for.
pub fn put_slice_data(slices: &mut [pb::DenseSlice], mut body: Bytes) {
    for v in slices
        .iter_mut()
        .filter_map(|s| s.values.as_mut())
        .filter(|v| takes_body(v))
    {
        let len = usize::try_from(v.num_values.saturating_mul(4))
            .unwrap_or(usize::MAX)
            .min(body.len());
        v.data = body.split_to(len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32_slice(chunk: u64, values: &[f32]) -> pb::DenseSlice {
        pb::DenseSlice {
            chunk,
            values: Some(pb::Payload {
                encoding: pb::Encoding::F32 as i32,
                num_values: values.len() as u64,
                data: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn a_push_header_carries_compressed_payloads_and_the_body_the_plain_ones() {
        let fp16 = pb::DenseSlice {
            chunk: 4,
            values: Some(pb::Payload {
                encoding: pb::Encoding::F16 as i32,
                num_values: 2,
                data: Bytes::from_static(&[0, 60, 0, 188]),
                ..Default::default()
            }),
        };
        let mut slices = vec![f32_slice(3, &[1.0, 2.0]), fp16, f32_slice(5, &[-0.5])];
        let want = slices.clone();
        // Only the plain slices' data leaves the header: 3 values, 12 bytes of body.
        let body: Vec<u8> = [&slices[0], &slices[2]]
            .iter()
            .flat_map(|s| s.values.as_ref().unwrap().data.to_vec())
            .collect();
        for i in [0, 2] {
            slices[i].values.as_mut().unwrap().data = Bytes::new();
        }
        assert_eq!(push_body_len(&slices), Ok(12));
        put_slice_data(&mut slices, Bytes::from(body));
        assert_eq!(slices, want);
        // A plain payload whose data is in the header stays as it is, and takes no body.
        assert_eq!(push_payload_len(want[0].values.as_ref().unwrap()), Ok(0));
        let huge = pb::Payload {
            encoding: pb::Encoding::F32 as i32,
            num_values: u64::MAX,
            ..Default::default()
        };
        assert!(push_payload_len(&huge).unwrap_err().contains("overflow"));
    }

    #[tokio::test]
    async fn a_frame_round_trips_and_splits_back_into_its_slices() {
        let mut slices = vec![f32_slice(3, &[1.0, 2.0]), f32_slice(5, &[-0.5])];
        let want = slices.clone();
        let body = take_slice_data(&mut slices);
        assert_eq!(f32_body_len(&slices), Ok(12));
        let header = prost::Message::encode_to_vec(&pb::PushDenseRequest {
            table: "w".into(),
            slices,
            ..Default::default()
        });
        let mut wire = Vec::new();
        write_frame(&mut wire, PUSH_DENSE, &header, &body)
            .await
            .unwrap();
        assert_eq!(wire.len(), HEAD_LEN + header.len() + 12);

        let mut r = wire.as_slice();
        let (head, got) = read_head(&mut r, 1 << 10).await.unwrap().unwrap();
        assert_eq!((head.kind, head.body_len), (PUSH_DENSE, 12));
        let mut req: pb::PushDenseRequest = prost::Message::decode(got.as_slice()).unwrap();
        put_slice_data(&mut req.slices, Bytes::copy_from_slice(r));
        assert_eq!(req.slices, want);
        // The stream ends cleanly after the frame.
        assert!(read_head(&mut &r[12..], 1 << 10).await.unwrap().is_none());
    }

    #[tokio::test]
    async fn a_stream_that_is_not_bulk_or_has_a_huge_header_is_refused() {
        let e = read_head(&mut &b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"[..], 1 << 10)
            .await
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("not a bulk frame"), "{e}");
        let head = Head {
            kind: PULL_DENSE,
            header_len: 1 << 20,
            body_len: 0,
        };
        let e = read_head(&mut &head.encode()[..], 1 << 10)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("over the limit"), "{e}");
        // Cut short inside the head: an error, not a clean end.
        let e = read_head(&mut &head.encode()[..7], 1 << 10)
            .await
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn only_empty_uncompressed_f32_payloads_fit_a_bulk_header() {
        let mut s = vec![f32_slice(0, &[1.0])];
        let e = f32_body_len(&s).unwrap_err();
        assert!(e.contains("empty"), "{e}");
        take_slice_data(&mut s);
        if let Some(v) = s[0].values.as_mut() {
            v.encoding = pb::Encoding::F16 as i32;
        }
        let e = f32_body_len(&s).unwrap_err();
        assert!(e.contains("through gRPC"), "{e}");
        s[0].values = None;
        assert!(f32_body_len(&s).unwrap_err().contains("needs its values"));
    }
}
