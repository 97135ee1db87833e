//! lz4 framing, applied only where it pays.

use crate::CodecError;

/// The most bytes lz4 can make of `raw` bytes (its worst case on incompressible input).
pub fn max_compressed_len(raw: u64) -> u64 {
    raw.saturating_add(raw / 255).saturating_add(16)
}

/// Compresses `raw` into one lz4 block.
pub fn compress(raw: &[u8]) -> Vec<u8> {
    lz4_flex::block::compress(raw)
}

/// Decompresses one lz4 block that must hold exactly `raw_len` bytes.
pub fn decompress(data: &[u8], raw_len: usize) -> Result<Vec<u8>, CodecError> {
    let mut out = vec![0u8; raw_len];
    let n = lz4_flex::block::decompress_into(data, &mut out)
        .map_err(|e| CodecError::Lz4(e.to_string()))?;
    if n != raw_len {
        return Err(CodecError::Lz4(format!(
            "the block holds {n} bytes, but raw_len says {raw_len}"
        )));
    }
    Ok(out)
}

/// Whether lz4 is worth trying on `raw`: a few spread-out samples must shrink by at least
/// `min_saving`. Random mantissas fail this at once, for the price of compressing a few KiB.
pub fn worth_trying(raw: &[u8], min_saving: f64) -> bool {
    const SAMPLE: usize = 4096;
    const SAMPLES: usize = 4;
    if raw.len() <= SAMPLE * SAMPLES {
        return true; // small enough to just try
    }
    let step = (raw.len() - SAMPLE) / (SAMPLES - 1);
    let (mut total, mut packed) = (0usize, 0usize);
    for s in 0..SAMPLES {
        let part = &raw[s * step..s * step + SAMPLE];
        total += part.len();
        packed += lz4_flex::block::compress(part).len();
    }
    (packed as f64) <= total as f64 * (1.0 - min_saving)
}
