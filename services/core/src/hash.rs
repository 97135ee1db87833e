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
    }
}
