//! Payloads: a vector of values in some encoding, its header checked against its bytes.
//!
//! The encodings themselves live in `ps-codec`; this module converts them to and from the wire
//! and keeps the invariant that a [`Payload`]'s header fits its data.

use bytes::Bytes;
use ps_codec::{Codec, CompressOptions, Encoder, Lz4Policy};
pub use ps_codec::{CodecError, Compression, Encoded, Encoding, Header};
use ps_proto::v1 as pb;

pub use ps_codec::quant::read_f32_le;

use crate::error::ValidationError;

/// The wire form of an encoding.
pub fn encoding_to_pb(e: Encoding) -> pb::Encoding {
    match e {
        Encoding::F32 => pb::Encoding::F32,
        Encoding::F16 => pb::Encoding::F16,
        Encoding::Bf16 => pb::Encoding::Bf16,
        Encoding::Int8 => pb::Encoding::Int8,
        Encoding::Int4 => pb::Encoding::Int4,
        Encoding::Sign => pb::Encoding::Sign,
        Encoding::Qsgd => pb::Encoding::Qsgd,
        Encoding::SparseF32 => pb::Encoding::SparseF32,
        Encoding::SparseF16 => pb::Encoding::SparseF16,
    }
}

fn encoding_from_pb(v: i32, field: &str) -> Result<Encoding, ValidationError> {
    Ok(match pb::Encoding::try_from(v) {
        Ok(pb::Encoding::F32) => Encoding::F32,
        Ok(pb::Encoding::F16) => Encoding::F16,
        Ok(pb::Encoding::Bf16) => Encoding::Bf16,
        Ok(pb::Encoding::Int8) => Encoding::Int8,
        Ok(pb::Encoding::Int4) => Encoding::Int4,
        Ok(pb::Encoding::Sign) => Encoding::Sign,
        Ok(pb::Encoding::Qsgd) => Encoding::Qsgd,
        Ok(pb::Encoding::SparseF32) => Encoding::SparseF32,
        Ok(pb::Encoding::SparseF16) => Encoding::SparseF16,
        Ok(pb::Encoding::Unspecified) => {
            return Err(ValidationError::new(
                field,
                "the payload's encoding is not set",
            ));
        }
        Err(_) => {
            return Err(ValidationError::new(
                field,
                format!("unknown encoding {v}; this server knows 1 to 9 (f32 to int4)"),
            ));
        }
    })
}

/// The encoding a pull asks for its answer: f32 (also when unset), f16, bf16, int8 or int4.
pub fn accept_from_pb(v: i32) -> Result<Encoding, ValidationError> {
    if v == pb::Encoding::Unspecified as i32 {
        return Ok(Encoding::F32);
    }
    let e = encoding_from_pb(v, "accept")?;
    match e {
        Encoding::F32 | Encoding::F16 | Encoding::Bf16 | Encoding::Int8 | Encoding::Int4 => Ok(e),
        other => Err(ValidationError::new(
            "accept",
            format!("pulls are answered in f32, f16, bf16, int8 or int4, not {other}"),
        )),
    }
}

/// A payload whose header has been checked against its data: the byte counts, block sizes,
/// levels and entry counts are consistent. The values themselves are checked when decoded.
#[derive(Debug, Clone, PartialEq)]
pub struct Payload {
    header: Header,
    data: Bytes,
}

impl Payload {
    /// Encodes `values` as f32.
    pub fn from_f32(values: &[f32]) -> Self {
        Self::from(Encoded::f32(values))
    }

    /// Encodes the concatenation of `parts` as f32, with one copy.
    pub fn from_f32_parts<'a>(parts: impl IntoIterator<Item = &'a [f32]>) -> Self {
        let mut buf = Vec::new();
        for p in parts {
            buf.extend_from_slice(bytemuck::cast_slice::<f32, u8>(p));
        }
        Self {
            header: Header::f32(buf.len() / 4),
            data: Bytes::from(buf),
        }
    }

    /// Encodes `values` as `encoding` when it is f16, bf16, int8 or int4 (the pull encodings),
    /// else as f32. `dim` is the row length of a sparse table's values (0 for a dense table's):
    /// an int8 or int4 answer takes one scale per [`ps_codec::PullCodec::scale_block`] values.
    pub fn encode_plain(values: &[f32], encoding: Encoding, dim: usize) -> Self {
        match pull_codec(encoding, dim) {
            Some(codec) => Self::encode_with(codec, values),
            None => Self::from_f32(values),
        }
    }

    /// [`Payload::encode_plain`] of values whose bytes in memory `shared` gives without a copy
    /// (memory shared with their owner): an f32 answer on a little-endian machine holds those
    /// bytes as they are; another encoding, or f32 on a big-endian machine, is made from
    /// `values`.
    pub fn encode_plain_shared(
        values: &[f32],
        shared: impl FnOnce() -> Bytes,
        encoding: Encoding,
        dim: usize,
    ) -> Self {
        match pull_codec(encoding, dim) {
            Some(codec) => Self::encode_with(codec, values),
            None if cfg!(target_endian = "little") => {
                let data = shared();
                debug_assert_eq!(
                    data.len(),
                    values.len() * 4,
                    "the shared bytes are the values'"
                );
                Self {
                    header: Header::f32(values.len()),
                    data,
                }
            }
            None => Self::from_f32(values),
        }
    }

    fn encode_with(codec: Codec, values: &[f32]) -> Self {
        let opts = CompressOptions {
            codec,
            min_values: 0,
            lz4: Lz4Policy {
                enabled: false,
                ..Lz4Policy::default()
            },
            error_feedback: false,
        };
        Self::from(Encoder::new(opts, 0).encode(values))
    }

    pub fn header(&self) -> &Header {
        &self.header
    }

    pub fn encoding(&self) -> Encoding {
        self.header.encoding
    }

    /// Values the payload stands for.
    pub fn len(&self) -> usize {
        self.header.num_values as usize
    }

    pub fn is_empty(&self) -> bool {
        self.header.num_values == 0
    }

    /// The bytes as they travel.
    pub fn data(&self) -> &Bytes {
        &self.data
    }

    /// True for uncompressed f32: the data are the values.
    pub fn is_plain_f32(&self) -> bool {
        self.header.encoding == Encoding::F32 && self.header.compression == Compression::None
    }

    /// Decodes the values into `out`, which must hold `len()` values, checking everything.
    pub fn decode_into(&self, out: &mut [f32]) -> Result<(), CodecError> {
        ps_codec::decode(&self.header, &self.data, out)
    }

    /// Decodes the values into a new vector.
    pub fn to_vec(&self) -> Result<Vec<f32>, CodecError> {
        let mut v = vec![0.0; self.len()];
        self.decode_into(&mut v)?;
        Ok(v)
    }

    /// The same values as uncompressed f32 (no copy when they already are).
    pub fn decoded(&self) -> Result<Self, CodecError> {
        if self.is_plain_f32() {
            return Ok(self.clone());
        }
        Ok(Self::from_f32(&self.to_vec()?))
    }

    /// The sub-range `start..end` of uncompressed f32 values as its own payload, without
    /// copying; `None` for other encodings or a range outside the payload.
    pub fn slice(&self, start: usize, end: usize) -> Option<Self> {
        if !self.is_plain_f32() || start > end || end > self.len() {
            return None;
        }
        Some(Self {
            header: Header::f32(end - start),
            data: self.data.slice(start * 4..end * 4),
        })
    }

    /// Index of the first NaN or infinity, if any (decoding first unless plain f32; a payload
    /// that does not decode reports none: decoding it is what fails).
    pub fn first_non_finite(&self) -> Option<usize> {
        if self.is_plain_f32() {
            return ps_codec::quant::first_non_finite_le(&self.data);
        }
        let v = self.to_vec().ok()?;
        v.iter().position(|x| !x.is_finite())
    }
}

/// The codec a pull answer in `encoding` takes (f16, bf16, int8 or int4); `None` for f32, which
/// every other encoding is answered as.
fn pull_codec(encoding: Encoding, dim: usize) -> Option<Codec> {
    Some(match encoding {
        Encoding::F16 => Codec::F16,
        Encoding::Bf16 => Codec::Bf16,
        // At most 4096: fits a u32.
        Encoding::Int8 => Codec::Int8 {
            block: ps_codec::PullCodec::scale_block(dim) as u32,
        },
        Encoding::Int4 => Codec::Int4 {
            block: ps_codec::PullCodec::scale_block(dim) as u32,
        },
        _ => return None,
    })
}

impl From<Encoded> for Payload {
    /// Wraps what an encoder made; its header fits its data by construction.
    fn from(e: Encoded) -> Self {
        debug_assert!(e.header.check(e.data.len()).is_ok(), "{:?}", e.header);
        Self {
            header: e.header,
            data: e.data,
        }
    }
}

impl From<Payload> for Encoded {
    fn from(p: Payload) -> Self {
        Encoded {
            header: p.header,
            data: p.data,
        }
    }
}

impl TryFrom<pb::Payload> for Payload {
    type Error = ValidationError;

    fn try_from(p: pb::Payload) -> Result<Self, Self::Error> {
        let encoding = encoding_from_pb(p.encoding, "encoding")?;
        let compression = match pb::Compression::try_from(p.compression) {
            Ok(pb::Compression::None) => Compression::None,
            Ok(pb::Compression::Lz4) => Compression::Lz4,
            Err(_) => {
                return Err(ValidationError::new(
                    "compression",
                    format!(
                        "unknown compression {}; this server knows none and lz4",
                        p.compression
                    ),
                ));
            }
        };
        if usize::try_from(p.num_values).is_err() {
            return Err(ValidationError::new("num_values", "too many values"));
        }
        let header = Header {
            encoding,
            num_values: p.num_values,
            block_size: p.block_size,
            levels: p.levels,
            num_entries: p.num_entries,
            compression,
            raw_len: p.raw_len,
        };
        header
            .check(p.data.len())
            .map_err(|e| ValidationError::new("data", e.to_string()))?;
        Ok(Self {
            header,
            data: p.data,
        })
    }
}

impl From<Payload> for pb::Payload {
    fn from(p: Payload) -> Self {
        let h = p.header;
        pb::Payload {
            encoding: encoding_to_pb(h.encoding) as i32,
            num_values: h.num_values,
            data: p.data,
            block_size: h.block_size,
            levels: h.levels,
            num_entries: h.num_entries,
            compression: match h.compression {
                Compression::None => pb::Compression::None,
                Compression::Lz4 => pb::Compression::Lz4,
            } as i32,
            raw_len: if h.compression == Compression::Lz4 {
                h.raw_len
            } else {
                0
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn header_must_match_data() {
        let e = Payload::try_from(pb::Payload {
            encoding: pb::Encoding::F32 as i32,
            num_values: 3,
            data: Bytes::from_static(&[0; 8]),
            ..Default::default()
        })
        .unwrap_err();
        assert!(e.reason.contains("3 f32 values need 12 bytes"), "{e}");
        let e = Payload::try_from(pb::Payload {
            encoding: 99,
            ..Default::default()
        })
        .unwrap_err();
        assert_eq!(e.field, "encoding");
        let e = Payload::try_from(pb::Payload {
            encoding: pb::Encoding::F32 as i32,
            num_values: u64::MAX / 2,
            ..Default::default()
        })
        .unwrap_err();
        assert_eq!(e.field, "data");
        let e = Payload::try_from(pb::Payload {
            encoding: pb::Encoding::Int8 as i32,
            num_values: 4,
            data: Bytes::from_static(&[0; 8]),
            ..Default::default()
        })
        .unwrap_err();
        assert!(e.reason.contains("block_size 0"), "{e}");
        assert!(accept_from_pb(pb::Encoding::Sign as i32).is_err());
        assert_eq!(accept_from_pb(0).unwrap(), Encoding::F32);
        assert_eq!(
            accept_from_pb(pb::Encoding::Int8 as i32).unwrap(),
            Encoding::Int8
        );
    }

    #[test]
    fn int8_answers_take_a_scale_per_whole_rows() {
        // Two rows of dim 32 with very different magnitudes: each keeps its own scale.
        let values: Vec<f32> = (0..64)
            .map(|i| {
                if i < 32 {
                    i as f32 * 1e-3
                } else {
                    i as f32 * 10.0
                }
            })
            .collect();
        let p = Payload::encode_plain(&values, Encoding::Int8, 32);
        assert_eq!(p.encoding(), Encoding::Int8);
        assert_eq!(p.header().block_size, 32);
        assert_eq!(p.data().len(), 64 + 2 * 4);
        let back = p.to_vec().unwrap();
        for (row, scale) in [(0..32, 31e-3 / 254.0), (32..64, 630.0 / 254.0)] {
            for i in row {
                assert!((back[i] - values[i]).abs() <= scale * 1.0001, "{i}");
            }
        }
        // A dense table's answer: 256 values a scale.
        let dense = Payload::encode_plain(&vec![1.0; 1000], Encoding::Int8, 0);
        assert_eq!(dense.header().block_size, 256);
    }

    #[test]
    fn finds_nan_and_inf() {
        assert_eq!(Payload::from_f32(&[1.0, 2.0]).first_non_finite(), None);
        let mut long = vec![1.0f32; 5000];
        long[4097] = f32::NAN;
        assert_eq!(Payload::from_f32(&long).first_non_finite(), Some(4097));
        // The same at an unaligned offset.
        let p = Payload::from_f32(&long);
        let mut buf = vec![0u8; 1];
        buf.extend_from_slice(p.data());
        let shifted = Payload::try_from(pb::Payload {
            encoding: pb::Encoding::F32 as i32,
            num_values: 5000,
            data: Bytes::from(buf).slice(1..),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(shifted.first_non_finite(), Some(4097));
        assert_eq!(
            Payload::from_f32(&[1.0, f32::NAN]).first_non_finite(),
            Some(1)
        );
        assert_eq!(
            Payload::from_f32(&[f32::NEG_INFINITY]).first_non_finite(),
            Some(0)
        );
    }

    proptest! {
        #[test]
        fn round_trips_aligned_and_not(values in proptest::collection::vec(any::<f32>(), 0..64), skip in 0usize..4) {
            let p = Payload::from_f32(&values);
            let wire = pb::Payload::from(p.clone());
            // Put the data at an odd offset of a bigger buffer, as a receive buffer would.
            let mut buf = vec![0u8; skip];
            buf.extend_from_slice(&wire.data);
            let shifted = pb::Payload { data: Bytes::from(buf).slice(skip..), ..wire };
            let back = Payload::try_from(shifted).unwrap().to_vec().unwrap();
            prop_assert_eq!(bytemuck::cast_slice::<f32, u32>(&back), bytemuck::cast_slice::<f32, u32>(&values));
        }
    }
}
