//! Shared by the fuzz targets: reads a header's parameters from the first bytes of the input
//! and decodes the rest, which must give a clean error or values, never a panic.

use ps_codec::{Compression, Encoding, Header, decode};

/// Bytes of the input taken for the header's parameters.
pub const PARAMS: usize = 10;

pub fn run(encoding: Encoding, compression: Compression, input: &[u8]) {
    if input.len() < PARAMS {
        return;
    }
    let (p, data) = input.split_at(PARAMS);
    let u16_at = |i: usize| u64::from(u16::from_le_bytes([p[i], p[i + 1]]));
    let header = Header {
        encoding,
        // Up to 65,535 values: big enough for every layout's corner, small enough to be fast.
        num_values: u16_at(0),
        block_size: u16_at(2) as u32,
        levels: u32::from(p[4]),
        num_entries: u16_at(5) % (u16_at(0) + 1),
        compression,
        raw_len: u16_at(7) << (p[9] % 4),
    };
    let mut out = vec![0.0f32; header.num_values as usize];
    if decode(&header, data, &mut out).is_ok() && !encoding.is_sparse() {
        // A payload that decodes was the right size for its header.
        assert!(header.check(data.len()).is_ok());
    }
}
