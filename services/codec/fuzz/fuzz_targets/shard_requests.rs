#![no_main]
//! The shard's request validators: any bytes, decoded as one of its requests (the first byte
//! picks which), give a validated request or a clean error, never a panic; a push's payloads
//! are decoded, as the shard does, only when what they claim fits its queue's budget.

use libfuzzer_sys::fuzz_target;
use prost::Message;
use ps_core::Payload;
use ps_proto::v1 as pb;

/// The most bytes of f32 a fuzzed push may decode to (the shard's queue budget bounds it).
const DECODE_LIMIT: u64 = 16 << 20;

fn decode_within(p: &Payload) {
    if (p.len() as u64).saturating_mul(4) <= DECODE_LIMIT {
        let _ = p.decoded();
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, bytes)) = data.split_first() else {
        return;
    };
    match pick % 6 {
        0 => {
            if let Ok(r) = pb::PushDenseRequest::decode(bytes)
                && let Ok(push) = ps_core::PushDense::try_from(r)
            {
                push.slices.iter().for_each(|s| decode_within(&s.values));
            }
        }
        1 => {
            if let Ok(r) = pb::PushSparseRequest::decode(bytes)
                && let Ok(push) = ps_core::PushSparse::try_from(r)
            {
                let _ = push.check_dim(8);
                decode_within(&push.values);
            }
        }
        2 => {
            if let Ok(r) = pb::PullDenseRequest::decode(bytes) {
                let _ = ps_core::PullDense::try_from(r);
            }
        }
        3 => {
            if let Ok(r) = pb::PullSparseRequest::decode(bytes) {
                let _ = ps_core::PullSparse::try_from(r);
            }
        }
        4 => {
            if let Ok(r) = pb::TableSpec::decode(bytes)
                && let Ok(spec) = ps_core::TableSpec::try_from(r)
            {
                // A valid spec's shape arithmetic holds for every chunk index.
                if let Some(shape) = spec.dense_shape() {
                    let chunks = shape.num_chunks();
                    let _ = shape.chunk_len(chunks.saturating_sub(1));
                    assert!(shape.chunk_len(chunks).is_none());
                }
            }
        }
        _ => {
            if let Ok(p) = pb::Payload::decode(bytes)
                && let Ok(p) = Payload::try_from(p)
            {
                decode_within(&p);
            }
        }
    }
});
