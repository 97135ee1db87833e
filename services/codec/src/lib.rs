//! Gradient codecs for the parameter-server cluster.
//!
//! A sender (a worker's SDK pushing gradients, or a shard answering a pull) turns `f32` values
//! into an [`Encoded`] payload: a [`Header`] that says how the bytes are laid out, and the bytes.
//! A receiver checks the header against the byte count with [`Header::check`] (cheap, no
//! allocation) and then decodes with [`decode`], which validates every length, index, block
//! count, scale and lz4 frame and never panics on any input.
//!
//! - [`Codec`] and [`Encoder`] (`codec`): the sender's choice per table (fp16, bf16, int8 and
//!   int4 with a per-block scale, scaled sign, QSGD, top-k, random-k), small tensors left as f32, adaptive
//!   lz4 on top.
//! - [`ErrorFeedback`] and [`RowErrorFeedback`] (`feedback`): the residual a lossy codec dropped,
//!   kept by the sender and added to the next gradient; per tensor for dense tables and per row
//!   for embedding tables.
//! - [`PullCodec`] (`pull`): how a table's pulls come back: f32, fp16, bf16, int8, int4 or the top-k of
//!   the change since the client's last pull.
//! - `quant`, `sparse`, `lz4`: the kernels behind each layout.
//!
//! # Layouts (all little-endian)
//! | encoding | bytes |
//! | --- | --- |
//! | `F32` | `4n`: the values |
//! | `F16`, `Bf16` | `2n`: the values rounded to nearest even |
//! | `Int8` | `4⌈n/B⌉` f32 scales (max abs / 127 per block of `B`), then `n` i8 |
//! | `Int4` | `4⌈n/B⌉` f32 scales (max abs / 7 per block of `B`), then `⌈n/2⌉` bytes of 4-bit two's-complement codes in -7..=7, value `i` in the low half of byte `i/2` when `i` is even |
//! | `Sign` | `4⌈n/B⌉` f32 scales (mean abs per block), then `⌈n/8⌉` bytes, bit set = negative |
//! | `Qsgd` | `4⌈n/B⌉` f32 L2 norms, then `n` codes of `1 + bits(s)` bits (sign, level ≤ s) |
//! | `SparseF32`, `SparseF16` | `k` values, then `k` LEB128 varints: the first index, then each gap minus one |
//!
//! Bit fields are packed least-significant bit first; unused bits of the last byte are zero.

#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used))]

#[cfg(target_endian = "big")]
compile_error!("the codecs read and write little-endian values on a little-endian host");

mod codec;
mod feedback;
pub mod idmap;
pub mod lz4;
mod pull;
pub mod quant;
pub mod sparse;

use std::fmt;

use bytes::Bytes;

pub use codec::{Codec, CompressOptions, Encoder, Lz4Policy, ParseCodecError, SparseValues};
pub use feedback::{ErrorFeedback, RowErrorFeedback};
pub use idmap::{IdMap, prefetch};
pub use pull::PullCodec;

/// Largest block (bucket) size a header may name.
pub const MAX_BLOCK: u32 = 1 << 24;
/// Largest number of QSGD levels: codes stay within 9 bits.
pub const MAX_LEVELS: u32 = 255;

/// How the bytes of a payload encode its values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Encoding {
    /// IEEE-754 binary32.
    #[default]
    F32,
    /// IEEE-754 binary16, rounded to nearest even; values beyond ±65504 become infinite.
    F16,
    /// bfloat16: the top 16 bits of binary32, rounded to nearest even.
    Bf16,
    /// One i8 per value with one f32 scale per block.
    Int8,
    /// Two 4-bit codes per byte with one f32 scale per block.
    Int4,
    /// One bit per value with one f32 scale (the mean magnitude) per block.
    Sign,
    /// QSGD: stochastic levels of the block's L2 norm.
    Qsgd,
    /// Selected entries: f32 values and delta-varint indices; the rest are zero.
    SparseF32,
    /// Selected entries: f16 values and delta-varint indices; the rest are zero.
    SparseF16,
}

impl Encoding {
    pub const ALL: [Self; 9] = [
        Self::F32,
        Self::F16,
        Self::Bf16,
        Self::Int8,
        Self::Int4,
        Self::Sign,
        Self::Qsgd,
        Self::SparseF32,
        Self::SparseF16,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::F16 => "f16",
            Self::Bf16 => "bf16",
            Self::Int8 => "int8",
            Self::Int4 => "int4",
            Self::Sign => "sign",
            Self::Qsgd => "qsgd",
            Self::SparseF32 => "sparse_f32",
            Self::SparseF16 => "sparse_f16",
        }
    }

    /// True for the encodings with one scale per block.
    pub fn is_blocked(self) -> bool {
        matches!(self, Self::Int8 | Self::Int4 | Self::Sign | Self::Qsgd)
    }

    pub fn is_sparse(self) -> bool {
        matches!(self, Self::SparseF32 | Self::SparseF16)
    }

    /// True when decoding gives back exactly the values that were encoded.
    pub fn is_lossless(self) -> bool {
        self == Self::F32
    }
}

impl fmt::Display for Encoding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A general-purpose compression applied to the encoded bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Compression {
    #[default]
    None,
    /// One lz4 block holding `raw_len` bytes.
    Lz4,
}

/// Everything about an encoded payload except its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Header {
    pub encoding: Encoding,
    /// Values the payload stands for (for sparse encodings, including the zeros).
    pub num_values: u64,
    /// Values per scale, for `Int8`, `Int4`, `Sign` and `Qsgd`.
    pub block_size: u32,
    /// QSGD levels `s`.
    pub levels: u32,
    /// Entries held by a sparse encoding.
    pub num_entries: u64,
    pub compression: Compression,
    /// Bytes before compression (ignored when there is none).
    pub raw_len: u64,
}

/// Why a payload cannot be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    #[error("{0}")]
    Header(String),
    #[error("{0}")]
    Data(String),
    #[error("lz4: {0}")]
    Lz4(String),
}

fn header_err(msg: impl Into<String>) -> CodecError {
    CodecError::Header(msg.into())
}

fn data_err(msg: impl Into<String>) -> CodecError {
    CodecError::Data(msg.into())
}

/// `n` values in blocks of `b`: the number of blocks.
fn blocks(n: u64, b: u32) -> u64 {
    n.div_ceil(u64::from(b.max(1)))
}

/// Bits of one QSGD code for `levels` levels: a sign bit and the level.
pub fn qsgd_code_bits(levels: u32) -> u32 {
    1 + (32 - levels.leading_zeros())
}

impl Header {
    /// The header of plain f32 data.
    pub fn f32(num_values: usize) -> Self {
        Self {
            num_values: num_values as u64,
            ..Self::default()
        }
    }

    /// Bytes of the uncompressed data as `(min, max)`: equal for dense encodings. An error when
    /// the header's parameters are out of range or the size overflows.
    fn raw_len_range(&self) -> Result<(u64, u64), CodecError> {
        let n = self.num_values;
        let overflow = || header_err(format!("{n} values overflow the payload size"));
        if self.encoding.is_blocked() && !(1..=MAX_BLOCK).contains(&self.block_size) {
            return Err(header_err(format!(
                "block_size {} is out of range: {} needs 1..={MAX_BLOCK}",
                self.block_size, self.encoding
            )));
        }
        let scales = || {
            blocks(n, self.block_size)
                .checked_mul(4)
                .ok_or_else(overflow)
        };
        let exact = match self.encoding {
            Encoding::F32 => n.checked_mul(4).ok_or_else(overflow)?,
            Encoding::F16 | Encoding::Bf16 => n.checked_mul(2).ok_or_else(overflow)?,
            Encoding::Int8 => scales()?.checked_add(n).ok_or_else(overflow)?,
            Encoding::Int4 => scales()?.checked_add(n.div_ceil(2)).ok_or_else(overflow)?,
            Encoding::Sign => scales()?.checked_add(n.div_ceil(8)).ok_or_else(overflow)?,
            Encoding::Qsgd => {
                if !(1..=MAX_LEVELS).contains(&self.levels) {
                    return Err(header_err(format!(
                        "levels {} is out of range: qsgd needs 1..={MAX_LEVELS}",
                        self.levels
                    )));
                }
                let bits = n
                    .checked_mul(u64::from(qsgd_code_bits(self.levels)))
                    .ok_or_else(overflow)?;
                scales()?
                    .checked_add(bits.div_ceil(8))
                    .ok_or_else(overflow)?
            }
            Encoding::SparseF32 | Encoding::SparseF16 => {
                let k = self.num_entries;
                if k > n {
                    return Err(header_err(format!(
                        "num_entries {k} is more than the {n} values the payload stands for"
                    )));
                }
                let vb = if self.encoding == Encoding::SparseF32 {
                    4
                } else {
                    2
                };
                let min = k.checked_mul(vb + 1).ok_or_else(overflow)?;
                let max = k
                    .checked_mul(vb + sparse::MAX_VARINT_BYTES as u64)
                    .ok_or_else(overflow)?;
                return Ok((min, max));
            }
        };
        Ok((exact, exact))
    }

    /// Checks the header's parameters and that `data_len` bytes can hold what it describes.
    /// Cheap: nothing is read or allocated. [`decode`] checks the rest.
    pub fn check(&self, data_len: usize) -> Result<(), CodecError> {
        let (min, max) = self.raw_len_range()?;
        let data_len = data_len as u64;
        match self.compression {
            Compression::None => {
                if data_len < min || data_len > max {
                    return Err(header_err(if min == max {
                        format!(
                            "{} {} values need {min} bytes, but the data holds {data_len}",
                            self.num_values, self.encoding
                        )
                    } else {
                        format!(
                            "{} {} entries need {min} to {max} bytes, but the data holds \
                             {data_len}",
                            self.num_entries, self.encoding
                        )
                    }));
                }
            }
            Compression::Lz4 => {
                if self.raw_len < min || self.raw_len > max {
                    return Err(header_err(format!(
                        "raw_len {} does not fit {} {} values ({min} to {max} bytes)",
                        self.raw_len, self.num_values, self.encoding
                    )));
                }
                if data_len > lz4::max_compressed_len(self.raw_len) {
                    return Err(header_err(format!(
                        "{data_len} bytes of lz4 cannot hold {} raw bytes",
                        self.raw_len
                    )));
                }
            }
        }
        Ok(())
    }
}

/// An encoded payload: its header and its bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct Encoded {
    pub header: Header,
    pub data: Bytes,
}

impl Encoded {
    /// `values` as plain f32.
    pub fn f32(values: &[f32]) -> Self {
        Self {
            header: Header::f32(values.len()),
            data: Bytes::copy_from_slice(bytemuck::cast_slice(values)),
        }
    }

    /// Decodes into `out`, which must hold `header.num_values` values.
    pub fn decode_into(&self, out: &mut [f32]) -> Result<(), CodecError> {
        decode(&self.header, &self.data, out)
    }

    /// Decodes into a new vector.
    pub fn to_vec(&self) -> Result<Vec<f32>, CodecError> {
        let n = usize::try_from(self.header.num_values)
            .map_err(|_| header_err("num_values does not fit this machine"))?;
        let mut v = vec![0.0; n];
        self.decode_into(&mut v)?;
        Ok(v)
    }

    /// Adds `alpha` times the decoded values to `acc` (sparse encodings touch only their entries).
    pub fn decode_add(&self, acc: &mut [f32], alpha: f32) -> Result<(), CodecError> {
        check_out(&self.header, acc.len())?;
        let raw = raw_bytes(&self.header, &self.data)?;
        if self.header.encoding.is_sparse() {
            return sparse::for_each_entry(&self.header, &raw, |i, v| acc[i] += alpha * v);
        }
        let mut tmp = vec![0.0; acc.len()];
        decode_raw(&self.header, &raw, &mut tmp)?;
        for (a, t) in acc.iter_mut().zip(&tmp) {
            *a += alpha * t;
        }
        Ok(())
    }

    /// The positions a sparse payload (top-k, random-k) carries, ascending, checked as a
    /// decode checks them; `None` for a dense encoding, which carries every position.
    pub fn indices(&self) -> Result<Option<Vec<usize>>, CodecError> {
        if !self.header.encoding.is_sparse() {
            return Ok(None);
        }
        let raw = raw_bytes(&self.header, &self.data)?;
        let mut out = Vec::with_capacity(
            usize::try_from(self.header.num_entries)
                .unwrap_or(0)
                .min(raw.len()),
        );
        sparse::for_each_entry(&self.header, &raw, |i, _| out.push(i))?;
        Ok(Some(out))
    }

    /// For a sparse payload (top-k, random-k) over rows of `dim` values: the rows holding at
    /// least one entry, ascending, and the same entries re-indexed over those rows alone (their
    /// values' bytes unchanged, uncompressed). `None` for a dense encoding, which carries every
    /// row. A sparse push sends only these rows and their ids.
    pub fn rows_carried(&self, dim: usize) -> Result<Option<(Vec<usize>, Encoded)>, CodecError> {
        if !self.header.encoding.is_sparse() {
            return Ok(None);
        }
        if dim == 0 || !self.header.num_values.is_multiple_of(dim as u64) {
            return Err(header_err(format!(
                "{} values are not rows of {dim}",
                self.header.num_values
            )));
        }
        let raw = raw_bytes(&self.header, &self.data)?;
        let (rows, data) = sparse::compact_rows(&self.header, &raw, dim)?;
        let header = Header {
            num_values: (rows.len() * dim) as u64,
            compression: Compression::None,
            raw_len: data.len() as u64,
            ..self.header
        };
        Ok(Some((
            rows,
            Encoded {
                header,
                data: Bytes::from(data),
            },
        )))
    }

    /// Bytes on the wire.
    pub fn wire_len(&self) -> usize {
        self.data.len()
    }
}

fn check_out(header: &Header, len: usize) -> Result<(), CodecError> {
    if header.num_values != len as u64 {
        return Err(header_err(format!(
            "the payload holds {} values but {len} are wanted",
            header.num_values
        )));
    }
    Ok(())
}

/// The uncompressed bytes of a checked payload.
fn raw_bytes<'a>(
    header: &Header,
    data: &'a [u8],
) -> Result<std::borrow::Cow<'a, [u8]>, CodecError> {
    header.check(data.len())?;
    match header.compression {
        Compression::None => Ok(std::borrow::Cow::Borrowed(data)),
        Compression::Lz4 => {
            let len = usize::try_from(header.raw_len)
                .map_err(|_| header_err("raw_len does not fit this machine"))?;
            lz4::decompress(data, len).map(std::borrow::Cow::Owned)
        }
    }
}

/// Decodes `data` laid out as `header` says into `out` (`header.num_values` values). Every
/// length, index, block count, scale and lz4 frame is checked; nothing panics.
pub fn decode(header: &Header, data: &[u8], out: &mut [f32]) -> Result<(), CodecError> {
    check_out(header, out.len())?;
    let raw = raw_bytes(header, data)?;
    decode_raw(header, &raw, out)
}

fn decode_raw(header: &Header, raw: &[u8], out: &mut [f32]) -> Result<(), CodecError> {
    let block = header.block_size as usize;
    match header.encoding {
        Encoding::F32 => {
            quant::read_f32_le(raw, out);
            Ok(())
        }
        Encoding::F16 => {
            quant::decode_f16(raw, out);
            Ok(())
        }
        Encoding::Bf16 => {
            quant::decode_bf16(raw, out);
            Ok(())
        }
        Encoding::Int8 => quant::decode_int8(raw, block, out),
        Encoding::Int4 => quant::decode_int4(raw, block, out),
        Encoding::Sign => quant::decode_sign(raw, block, out),
        Encoding::Qsgd => quant::decode_qsgd(raw, block, header.levels, out),
        Encoding::SparseF32 | Encoding::SparseF16 => {
            out.fill(0.0);
            sparse::for_each_entry(header, raw, |i, v| out[i] = v)
        }
    }
}

#[cfg(test)]
mod tests;
