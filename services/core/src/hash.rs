//! Stable hashes. The partitioner and the initializers are defined in terms of these functions,
//! so they are part of the wire and storage contract: changing one moves keys between shards and
//! changes initial values. They must never change.

/// FNV-1a over bytes, 64-bit.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The SplitMix64 finalizer: a bijection on u64 with good avalanche.
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Combines two hashes (order matters).
pub fn combine(a: u64, b: u64) -> u64 {
    mix64(a ^ mix64(b).rotate_left(17))
}

/// The digest of a row of values, over their bit patterns: equal rows have equal digests, and
/// two different rows of one length share one with a chance of about 2^-64. Clients and shards
/// compare rows by it (`PullSparseRequest.held_digests`), so it is part of the wire contract.
pub fn row_digest(row: &[f32]) -> u64 {
    let mut h = mix64(row.len() as u64 ^ 0x9e37_79b9_7f4a_7c15);
    let mut pairs = row.chunks_exact(2);
    for p in &mut pairs {
        h = mix64(h ^ (u64::from(p[0].to_bits()) | (u64::from(p[1].to_bits()) << 32)));
    }
    if let [last] = pairs.remainder() {
        h = mix64(h ^ u64::from(last.to_bits()));
    }
    mix64(h)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_pinned() {
        // These constants are part of the storage and routing contract.
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(mix64(0), 0);
        assert_eq!(mix64(1), 0x5692_161d_100b_05e5);
        assert_eq!(row_digest(&[1.0, -2.5, 0.125]), PINNED_ROW_DIGEST);
    }

    /// `row_digest(&[1.0, -2.5, 0.125])`, computed once in Python from the definition in
    /// ps.proto, independently of the code above.
    const PINNED_ROW_DIGEST: u64 = 0x74d0_1e00_37f8_8201;

    #[test]
    fn row_digests_tell_rows_apart() {
        let row = [0.5f32, -1.0, 3.25, 0.0];
        assert_eq!(row_digest(&row), row_digest(&row.clone()));
        // One bit of one value, the sign of a zero, the order, the length: all count.
        let mut bit = row;
        bit[2] = f32::from_bits(bit[2].to_bits() ^ 1);
        let mut sign = row;
        sign[3] = -0.0;
        let swapped = [-1.0f32, 0.5, 3.25, 0.0];
        let digests = [
            row_digest(&row),
            row_digest(&bit),
            row_digest(&sign),
            row_digest(&swapped),
            row_digest(&row[..3]),
            row_digest(&[0.5, -1.0, 3.25, 0.0, 0.0]),
            row_digest(&[]),
        ];
        for (i, a) in digests.iter().enumerate() {
            for b in &digests[i + 1..] {
                assert_ne!(a, b);
            }
        }
    }
}
