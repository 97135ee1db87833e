//! Payloads: a vector of values in some encoding, checked against its header.

use bytes::Bytes;
use ps_proto::v1 as pb;

use crate::error::ValidationError;

/// How the bytes of a payload encode its values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Encoding {
    /// Little-endian IEEE-754 binary32.
    #[default]
    F32,
}

impl Encoding {
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
        }
    }

    /// Bytes the data must hold for `num_values` values, or `None` when that overflows.
    fn data_len(self, num_values: u64) -> Option<u64> {
        match self {
            Self::F32 => num_values.checked_mul(4),
        }
    }

    /// The encoding a pull asks for; `UNSPECIFIED` means f32.
    pub fn from_accept(v: i32) -> Result<Self, ValidationError> {
        match pb::Encoding::try_from(v) {
            Ok(pb::Encoding::Unspecified | pb::Encoding::F32) => Ok(Self::F32),
            Err(_) => Err(ValidationError::new(
                "accept",
                format!("unknown encoding {v}"),
            )),
        }
    }
}

impl From<Encoding> for pb::Encoding {
    fn from(e: Encoding) -> Self {
        match e {
            Encoding::F32 => pb::Encoding::F32,
        }
    }
}

/// Reads little-endian f32 values from `bytes` into `out` (as many as both hold), with one copy
/// when the bytes are aligned and value by value when they are not (a slice of a receive
/// buffer usually is not).
pub fn read_f32_le(bytes: &[u8], out: &mut [f32]) {
    match bytemuck::try_cast_slice::<u8, f32>(bytes) {
        Ok(v) => {
            let n = v.len().min(out.len());
            out[..n].copy_from_slice(&v[..n]);
        }
        Err(_) => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
    }
}

/// A payload whose data length matches its header and encoding.
#[derive(Debug, Clone, PartialEq)]
pub struct Payload {
    encoding: Encoding,
    num_values: usize,
    data: Bytes,
}

impl Payload {
    /// Encodes `values` as f32.
    pub fn from_f32(values: &[f32]) -> Self {
        Self {
            encoding: Encoding::F32,
            num_values: values.len(),
            data: Bytes::copy_from_slice(bytemuck::cast_slice(values)),
        }
    }

    /// Encodes the concatenation of `parts` as f32, with one copy.
    pub fn from_f32_parts<'a>(parts: impl IntoIterator<Item = &'a [f32]>) -> Self {
        let mut buf = Vec::new();
        for p in parts {
            buf.extend_from_slice(bytemuck::cast_slice::<f32, u8>(p));
        }
        Self {
            encoding: Encoding::F32,
            num_values: buf.len() / 4,
            data: Bytes::from(buf),
        }
    }

    pub fn encoding(&self) -> Encoding {
        self.encoding
    }

    pub fn len(&self) -> usize {
        self.num_values
    }

    pub fn is_empty(&self) -> bool {
        self.num_values == 0
    }

    /// The encoded bytes.
    pub fn data(&self) -> &Bytes {
        &self.data
    }

    /// Decodes the values into `out` (which must hold `len()` values).
    pub fn decode_into(&self, out: &mut [f32]) {
        debug_assert_eq!(out.len(), self.num_values);
        match self.encoding {
            Encoding::F32 => read_f32_le(&self.data, out),
        }
    }

    /// Decodes the values into a new vector.
    pub fn to_vec(&self) -> Vec<f32> {
        let mut v = vec![0.0; self.num_values];
        self.decode_into(&mut v);
        v
    }

    /// The sub-range `start..end` of the values as its own payload, without copying.
    pub fn slice(&self, start: usize, end: usize) -> Self {
        match self.encoding {
            Encoding::F32 => Self {
                encoding: Encoding::F32,
                num_values: end - start,
                data: self.data.slice(start * 4..end * 4),
            },
        }
    }

    /// Index of the first NaN or infinity, if any.
    pub fn first_non_finite(&self) -> Option<usize> {
        match self.encoding {
            Encoding::F32 => first_non_finite_f32_le(&self.data),
        }
    }
}

/// Index of the first NaN or infinity among little-endian f32 values. Each block is scanned
/// with a branch-free fold (which vectorizes, aligned or not); only a block holding one is
/// searched value by value.
fn first_non_finite_f32_le(bytes: &[u8]) -> Option<usize> {
    // Exponent bits all ones: NaN or infinity.
    const EXP: u32 = 0x7f80_0000;
    const BLOCK: usize = 4096;
    let word = |b: &[u8]| u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    bytes.chunks(BLOCK).enumerate().find_map(|(i, block)| {
        let any = block
            .chunks_exact(4)
            .fold(0u32, |acc, b| acc | u32::from(word(b) & EXP == EXP));
        (any != 0).then(|| {
            i * BLOCK / 4
                + block
                    .chunks_exact(4)
                    .position(|b| word(b) & EXP == EXP)
                    .unwrap_or(0)
        })
    })
}

impl TryFrom<pb::Payload> for Payload {
    type Error = ValidationError;

    fn try_from(p: pb::Payload) -> Result<Self, Self::Error> {
        let encoding = match pb::Encoding::try_from(p.encoding) {
            Ok(pb::Encoding::F32) => Encoding::F32,
            Ok(pb::Encoding::Unspecified) => {
                return Err(ValidationError::new(
                    "encoding",
                    "the payload's encoding is not set",
                ));
            }
            Err(_) => {
                return Err(ValidationError::new(
                    "encoding",
                    format!("unknown encoding {}; this server knows f32", p.encoding),
                ));
            }
        };
        let want = encoding.data_len(p.num_values);
        if want != Some(p.data.len() as u64) {
            return Err(ValidationError::new(
                "data",
                format!(
                    "header says {} {} values ({} bytes) but the data holds {} bytes",
                    p.num_values,
                    encoding.name(),
                    want.map_or_else(|| "too many".to_owned(), |w| w.to_string()),
                    p.data.len()
                ),
            ));
        }
        Ok(Self {
            encoding,
            num_values: p.num_values as usize,
            data: p.data,
        })
    }
}

impl From<Payload> for pb::Payload {
    fn from(p: Payload) -> Self {
        pb::Payload {
            encoding: pb::Encoding::from(p.encoding) as i32,
            num_values: p.num_values as u64,
            data: p.data,
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
        })
        .unwrap_err();
        assert!(e.reason.contains("header says 3"), "{e}");
        let e = Payload::try_from(pb::Payload {
            encoding: 99,
            num_values: 0,
            data: Bytes::new(),
        })
        .unwrap_err();
        assert_eq!(e.field, "encoding");
        let e = Payload::try_from(pb::Payload {
            encoding: pb::Encoding::F32 as i32,
            num_values: u64::MAX,
            data: Bytes::new(),
        })
        .unwrap_err();
        assert_eq!(e.field, "data");
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
            let back = Payload::try_from(shifted).unwrap().to_vec();
            prop_assert_eq!(bytemuck::cast_slice::<f32, u32>(&back), bytemuck::cast_slice::<f32, u32>(&values));
        }
    }
}
