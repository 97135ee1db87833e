//! Dense quantizers: fp16, bf16, int8 and int4 with a per-block scale, scaled sign and QSGD.
//!
//! Encoders append to a byte buffer; decoders read a buffer whose length the header check has
//! already matched, and still never index past it. A block holding a NaN or an infinity gets a
//! NaN scale, so the receiver's non-finite policy sees it instead of a silently zeroed value.

use half::f16;
use half::slice::HalfFloatSliceExt;
use rand::Rng;

use crate::{CodecError, data_err, qsgd_code_bits};

const EXP_MASK: u32 = 0x7f80_0000;

/// A word whose top bit is set when `bits` are a NaN's or an infinity's (all exponent bits
/// set): `!bits & EXP_MASK` is then 0, and only 0 wraps below 0 when 1 is taken from it. Three
/// lane operations, so folds of it over many values vectorize even without SSE4.1.
fn non_finite_top_bit(bits: u32) -> u32 {
    (!bits & EXP_MASK).wrapping_sub(1)
}

/// True when any value is a NaN or an infinity (a branch-free fold that vectorizes).
pub fn any_non_finite(values: &[f32]) -> bool {
    values
        .iter()
        .fold(0u32, |acc, v| acc | non_finite_top_bit(v.to_bits()))
        >> 31
        != 0
}

/// True when any of the little-endian f32 values in `bytes` is a NaN or an infinity (a trailing
/// part of a value is not looked at): a branch-free fold that vectorizes. Bytes aligned for
/// f32 (a bulk body is) go to [`any_non_finite`] as values, whose fold of their bits takes
/// fewer lane operations than one of four bytes at a time: 1.2-1.6x as fast over a read's
/// bytes in the core's cache (`ps-bench --only-apply`, `non_finite_scan*`).
pub fn any_non_finite_le(bytes: &[u8]) -> bool {
    let whole = &bytes[..bytes.len() & !3];
    match bytemuck::try_cast_slice::<u8, f32>(whole) {
        // ps-core builds for little-endian targets only: the bytes are the values as they are.
        Ok(values) if cfg!(target_endian = "little") => any_non_finite(values),
        _ => {
            whole
                .chunks_exact(4)
                .fold(0u32, |acc, b| acc | non_finite_top_bit(word_le(b)))
                >> 31
                != 0
        }
    }
}

fn word_le(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

/// Index of the first NaN or infinity among little-endian f32 values. Each block is scanned
/// with [`any_non_finite_le`]; only a block holding one is searched value by value.
pub fn first_non_finite_le(bytes: &[u8]) -> Option<usize> {
    const BLOCK: usize = 4096;
    bytes.chunks(BLOCK).enumerate().find_map(|(i, block)| {
        any_non_finite_le(block).then(|| {
            i * BLOCK / 4
                + block
                    .chunks_exact(4)
                    .position(|b| non_finite_top_bit(word_le(b)) >> 31 != 0)
                    .unwrap_or(0)
        })
    })
}

/// Reads little-endian f32 values from `bytes` into `out` (as many as both hold), with one copy
/// when the bytes are aligned and value by value when they are not.
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

fn push_f32s(out: &mut Vec<u8>, values: impl IntoIterator<Item = f32>) {
    for v in values {
        out.extend_from_slice(&v.to_le_bytes());
    }
}

/// Appends `values` as f16 (round to nearest even; F16C instructions when the CPU has them).
pub fn encode_f16(values: &[f32], out: &mut Vec<u8>) {
    let start = out.len();
    out.resize(start + values.len() * 2, 0);
    let dst = &mut out[start..];
    match bytemuck::try_cast_slice_mut::<u8, f16>(dst) {
        Ok(h) => h.convert_from_f32_slice(values),
        Err(_) => {
            for (d, &v) in dst.chunks_exact_mut(2).zip(values) {
                d.copy_from_slice(&f16::from_f32(v).to_le_bytes());
            }
        }
    }
}

pub fn decode_f16(raw: &[u8], out: &mut [f32]) {
    match bytemuck::try_cast_slice::<u8, f16>(raw) {
        Ok(h) => {
            let n = h.len().min(out.len());
            h[..n].convert_to_f32_slice(&mut out[..n]);
        }
        Err(_) => {
            for (o, b) in out.iter_mut().zip(raw.chunks_exact(2)) {
                *o = f16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
    }
}

/// The bf16 bits of `x`, rounded to nearest even; a NaN stays a (quiet) NaN.
#[inline]
pub fn bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    let rounded = b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16;
    let nan = (b >> 16) | 0x40;
    if x.is_nan() {
        nan as u16
    } else {
        rounded as u16
    }
}

pub fn encode_bf16(values: &[f32], out: &mut Vec<u8>) {
    let start = out.len();
    out.resize(start + values.len() * 2, 0);
    for (d, &v) in out[start..].chunks_exact_mut(2).zip(values) {
        d.copy_from_slice(&bf16_bits(v).to_le_bytes());
    }
}

pub fn decode_bf16(raw: &[u8], out: &mut [f32]) {
    for (o, b) in out.iter_mut().zip(raw.chunks_exact(2)) {
        *o = f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16);
    }
}

/// The largest magnitude of a block, or NaN when it holds a NaN or an infinity. One integer
/// max over the magnitude bits (which order like the magnitudes, with infinity and NaN on top).
fn block_max_abs(block: &[f32]) -> f32 {
    let bits = block
        .iter()
        .fold(0u32, |m, v| m.max(v.to_bits() & 0x7fff_ffff));
    if bits >= EXP_MASK {
        f32::NAN
    } else {
        f32::from_bits(bits)
    }
}

/// Appends `values` as int8 with one scale (max abs / 127) per block of `block` values.
/// Each decoded value is within half a scale step of the input. One pass: each block's scale
/// is found and the block quantized while it is in cache.
pub fn encode_int8(values: &[f32], block: usize, out: &mut Vec<u8>) {
    let block = block.max(1);
    let nb = values.len().div_ceil(block);
    let start = out.len();
    out.resize(start + nb * 4 + values.len(), 0);
    let (scales, q) = out[start..].split_at_mut(nb * 4);
    for ((src, dst), scale_bytes) in values
        .chunks(block)
        .zip(q.chunks_mut(block))
        .zip(scales.chunks_exact_mut(4))
    {
        let scale = block_max_abs(src) / 127.0;
        scale_bytes.copy_from_slice(&scale.to_le_bytes());
        let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
        for (d, &v) in dst.iter_mut().zip(src) {
            *d = round_to_i8(v * inv);
        }
    }
}

/// `x` (within ±127.5) rounded to the nearest integer, ties to even, as i8 bits. Adding
/// 1.5 · 2^23 leaves the integer in the low mantissa bits, two's complement when negative: a
/// branch-free form that vectorizes. A NaN gives 0 (its block's NaN scale carries the NaN).
#[inline]
fn round_to_i8(x: f32) -> u8 {
    const MAGIC: f32 = 12_582_912.0;
    if x.is_nan() {
        return 0;
    }
    (x + MAGIC).to_bits() as u8
}

/// Reads `n` block scales; a negative scale is malformed (a NaN one decodes to NaN values).
fn read_scales(raw: &[u8], n_blocks: usize, what: &str) -> Result<Vec<f32>, CodecError> {
    let bytes = raw
        .get(..n_blocks * 4)
        .ok_or_else(|| data_err(format!("the data is too short for {n_blocks} {what}")))?;
    let mut scales = vec![0.0f32; n_blocks];
    read_f32_le(bytes, &mut scales);
    if let Some(i) = scales.iter().position(|s| *s < 0.0) {
        return Err(data_err(format!(
            "{what}[{i}] is {}; {what} are never negative",
            scales[i]
        )));
    }
    Ok(scales)
}

pub fn decode_int8(raw: &[u8], block: usize, out: &mut [f32]) -> Result<(), CodecError> {
    let block = block.max(1);
    let nb = out.len().div_ceil(block);
    let scales = read_scales(raw, nb, "scales")?;
    let q = &raw[nb * 4..];
    if q.len() != out.len() {
        return Err(data_err(format!(
            "{} int8 values expected, {} found",
            out.len(),
            q.len()
        )));
    }
    for ((dst, src), &scale) in out.chunks_mut(block).zip(q.chunks(block)).zip(&scales) {
        for (d, &b) in dst.iter_mut().zip(src) {
            *d = f32::from(b as i8) * scale;
        }
    }
    Ok(())
}

/// Appends `values` as int4 with one scale (max abs / 7) per block of `block` values: two
/// 4-bit two's-complement codes in -7..=7 a byte, value `i` in the low half of byte `i / 2`
/// when `i` is even, the high half of a last odd byte zero. Each decoded value is within half
/// a scale step of the input. A NaN or infinite value makes its block's scale NaN (and its
/// code 0), as in int8.
pub fn encode_int4(values: &[f32], block: usize, out: &mut Vec<u8>) {
    let block = block.max(1);
    let nb = values.len().div_ceil(block);
    let start = out.len();
    out.resize(start + nb * 4 + values.len().div_ceil(2), 0);
    let (scales, q) = out[start..].split_at_mut(nb * 4);
    let mut codes = Vec::with_capacity(block);
    for (b, (src, scale_bytes)) in values
        .chunks(block)
        .zip(scales.chunks_exact_mut(4))
        .enumerate()
    {
        let scale = block_max_abs(src) / 7.0;
        scale_bytes.copy_from_slice(&scale.to_le_bytes());
        let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
        codes.clear();
        codes.extend(src.iter().map(|&v| round_to_i8(v * inv) & 0x0f));
        let first = b * block;
        if first.is_multiple_of(2) {
            // The block starts on a byte: pairs of codes straight into whole bytes.
            for (d, pair) in q[first / 2..].iter_mut().zip(codes.chunks(2)) {
                *d = pair[0] | pair.get(1).map_or(0, |h| h << 4);
            }
        } else {
            for (j, &c) in codes.iter().enumerate() {
                let i = first + j;
                q[i / 2] |= c << (4 * (i % 2));
            }
        }
    }
}

/// The value of a 4-bit two's-complement code (the low 4 bits of `code`).
#[inline]
fn int4_value(code: u8) -> f32 {
    f32::from(((code << 4) as i8) >> 4)
}

pub fn decode_int4(raw: &[u8], block: usize, out: &mut [f32]) -> Result<(), CodecError> {
    let block = block.max(1);
    let nb = out.len().div_ceil(block);
    let scales = read_scales(raw, nb, "scales")?;
    let q = &raw[nb * 4..];
    if q.len() != out.len().div_ceil(2) {
        return Err(data_err(format!(
            "{} bytes of int4 codes expected for {} values, {} found",
            out.len().div_ceil(2),
            out.len(),
            q.len()
        )));
    }
    check_padding(q, out.len() * 4)?;
    // -8 (0b1000) is never written: a byte holding it is malformed.
    if let Some(i) = q.iter().position(|&b| b & 0x0f == 8 || b >> 4 == 8) {
        return Err(data_err(format!(
            "int4 byte {i} holds the code -8; codes are within -7..=7"
        )));
    }
    for (b, (dst, &scale)) in out.chunks_mut(block).zip(&scales).enumerate() {
        let first = b * block;
        for (j, d) in dst.iter_mut().enumerate() {
            let i = first + j;
            *d = int4_value(q[i / 2] >> (4 * (i % 2))) * scale;
        }
    }
    Ok(())
}

/// Appends `values` as one bit each (set = negative) with one scale per block: the block's mean
/// magnitude. Decodes to `±scale`.
pub fn encode_sign(values: &[f32], block: usize, out: &mut Vec<u8>) {
    let block = block.max(1);
    push_f32s(
        out,
        values.chunks(block).map(|b| {
            if any_non_finite(b) {
                f32::NAN
            } else {
                (b.iter().map(|v| f64::from(v.abs())).sum::<f64>() / b.len() as f64) as f32
            }
        }),
    );
    out.extend(values.chunks(8).map(|c| {
        c.iter().enumerate().fold(0u8, |byte, (i, v)| {
            byte | (u8::from(v.is_sign_negative()) << i)
        })
    }));
}

pub fn decode_sign(raw: &[u8], block: usize, out: &mut [f32]) -> Result<(), CodecError> {
    let block = block.max(1);
    let nb = out.len().div_ceil(block);
    let scales = read_scales(raw, nb, "scales")?;
    let bits = &raw[nb * 4..];
    if bits.len() != out.len().div_ceil(8) {
        return Err(data_err(format!(
            "{} sign bytes expected for {} values, {} found",
            out.len().div_ceil(8),
            out.len(),
            bits.len()
        )));
    }
    check_padding(bits, out.len())?;
    if block.is_multiple_of(8) {
        // Whole bytes per block: eight values per byte, the sign bit set straight in.
        for ((dst, src), &scale) in out
            .chunks_mut(block)
            .zip(bits.chunks(block / 8))
            .zip(&scales)
        {
            let s = scale.to_bits();
            for (d8, &byte) in dst.chunks_mut(8).zip(src) {
                for (j, d) in d8.iter_mut().enumerate() {
                    *d = f32::from_bits(s | u32::from(byte >> j & 1) << 31);
                }
            }
        }
        return Ok(());
    }
    let mut i = 0usize;
    for (dst, &scale) in out.chunks_mut(block).zip(&scales) {
        let s = scale.to_bits();
        for d in dst {
            *d = f32::from_bits(s | u32::from(bits[i >> 3] >> (i & 7) & 1) << 31);
            i += 1;
        }
    }
    Ok(())
}

/// The unused high bits of the last byte of a packed field of `used_bits` bits must be zero.
fn check_padding(bytes: &[u8], used_bits: usize) -> Result<(), CodecError> {
    let rem = used_bits % 8;
    if rem != 0
        && let Some(&last) = bytes.last()
        && last >> rem != 0
    {
        return Err(data_err("the padding bits of the last byte are not zero"));
    }
    Ok(())
}

/// Appends `values` as QSGD with `levels` levels: per block its L2 norm, then per value a sign
/// bit and a level `l ≤ levels` chosen by stochastic rounding so that `E[l] = |v| / norm *
/// levels`: the decoded vector is an unbiased estimate of the input.
pub fn encode_qsgd(
    values: &[f32],
    block: usize,
    levels: u32,
    rng: &mut impl Rng,
    out: &mut Vec<u8>,
) {
    let block = block.max(1);
    let norms: Vec<f32> = values
        .chunks(block)
        .map(|b| {
            if any_non_finite(b) {
                f32::NAN
            } else {
                b.iter()
                    .map(|v| f64::from(*v) * f64::from(*v))
                    .sum::<f64>()
                    .sqrt() as f32
            }
        })
        .collect();
    push_f32s(out, norms.iter().copied());
    out.reserve((values.len() * qsgd_code_bits(levels) as usize).div_ceil(8));
    let level_bits = qsgd_code_bits(levels) - 1;
    let s = levels as f32;
    let mut w = BitWriter::new(out);
    for (src, &norm) in values.chunks(block).zip(&norms) {
        let scale = if norm > 0.0 { s / norm } else { 0.0 };
        for &v in src {
            let r = (v.abs() * scale).min(s);
            let floor = r.floor();
            let up = rng.random::<f32>() < r - floor;
            let level = if r.is_nan() {
                0
            } else {
                floor as u32 + u32::from(up)
            }
            .min(levels);
            let sign = u64::from(level != 0 && v.is_sign_negative());
            w.push(sign << level_bits | u64::from(level), level_bits + 1);
        }
    }
    w.finish();
}

pub fn decode_qsgd(
    raw: &[u8],
    block: usize,
    levels: u32,
    out: &mut [f32],
) -> Result<(), CodecError> {
    let block = block.max(1);
    let nb = out.len().div_ceil(block);
    let norms = read_scales(raw, nb, "norms")?;
    let codes = &raw[nb * 4..];
    let bits = qsgd_code_bits(levels);
    let used = out.len() * bits as usize;
    if codes.len() != used.div_ceil(8) {
        return Err(data_err(format!(
            "{} bytes of {bits}-bit codes expected for {} values, {} found",
            used.div_ceil(8),
            out.len(),
            codes.len()
        )));
    }
    check_padding(codes, used)?;
    let level_bits = bits - 1;
    let level_mask = (1u64 << level_bits) - 1;
    let mut r = BitReader::new(codes);
    for (b, (dst, &norm)) in out.chunks_mut(block).zip(&norms).enumerate() {
        let unit = norm / levels as f32;
        for (j, d) in dst.iter_mut().enumerate() {
            let code = r.read(bits);
            let level = (code & level_mask) as u32;
            if level > levels {
                return Err(data_err(format!(
                    "value {} has level {level}, above the {levels} levels",
                    b * block + j
                )));
            }
            let mag = level as f32 * unit;
            *d = if code >> level_bits & 1 == 1 {
                -mag
            } else {
                mag
            };
        }
    }
    Ok(())
}

/// Packs fields of up to 57 bits, least-significant bit first.
struct BitWriter<'a> {
    out: &'a mut Vec<u8>,
    acc: u64,
    bits: u32,
}

impl<'a> BitWriter<'a> {
    fn new(out: &'a mut Vec<u8>) -> Self {
        Self {
            out,
            acc: 0,
            bits: 0,
        }
    }

    #[inline]
    fn push(&mut self, value: u64, bits: u32) {
        self.acc |= value << self.bits;
        self.bits += bits;
        while self.bits >= 8 {
            self.out.push(self.acc as u8);
            self.acc >>= 8;
            self.bits -= 8;
        }
    }

    fn finish(self) {
        if self.bits > 0 {
            self.out.push(self.acc as u8);
        }
    }
}

/// Reads what [`BitWriter`] wrote; past the end it reads zeros (lengths are checked first).
struct BitReader<'a> {
    bytes: &'a [u8],
    pos: usize,
    acc: u64,
    bits: u32,
}

impl<'a> BitReader<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Self {
            bytes,
            pos: 0,
            acc: 0,
            bits: 0,
        }
    }

    #[inline]
    fn read(&mut self, bits: u32) -> u64 {
        while self.bits < bits {
            let byte = self.bytes.get(self.pos).copied().unwrap_or(0);
            self.pos += 1;
            self.acc |= u64::from(byte) << self.bits;
            self.bits += 8;
        }
        let v = self.acc & ((1u64 << bits) - 1);
        self.acc >>= bits;
        self.bits -= bits;
        v
    }
}
