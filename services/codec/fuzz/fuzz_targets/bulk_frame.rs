#![no_main]
//! The bulk stream's frame parser as the shard runs it: a head, a header within the limit,
//! the header decoded as the call's request and its slices' body length worked out. Any bytes
//! give a frame or a clean error, never a panic, and nothing is allocated for what was not
//! sent.

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use prost::Message;
use ps_proto::bulk;
use ps_proto::v1 as pb;

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime")
    })
}

fuzz_target!(|data: &[u8]| {
    let mut stream = data;
    // The limit the shard uses for headers (4 MiB); the input is far smaller, so a header
    // that claims more than was sent must end in an error, not an allocation of its claim.
    let Ok(Some((head, header))) = runtime().block_on(bulk::read_head(&mut stream, 4 << 20))
    else {
        return;
    };
    assert_eq!(header.len(), head.header_len as usize);
    match head.kind {
        bulk::PUSH_DENSE | bulk::PUSH_PULL_DENSE => {
            if let Ok(req) = pb::PushDenseRequest::decode(&header[..]) {
                if let Ok(len) = bulk::push_body_len(&req.slices) {
                    // What the shard compares with the frame's body length.
                    let _ = len == head.body_len;
                }
                let _ = ps_core::PushDense::try_from(req);
            }
        }
        bulk::PULL_DENSE => {
            if let Ok(req) = pb::PullDenseRequest::decode(&header[..]) {
                let _ = ps_core::PullDense::try_from(req);
            }
        }
        bulk::PULL_SPARSE => {
            if let Ok(req) = pb::PullSparseRequest::decode(&header[..]) {
                let _ = ps_core::PullSparse::try_from(req);
            }
        }
        bulk::PUSH_SPARSE => {
            if let Ok(req) = pb::PushSparseRequest::decode(&header[..]) {
                if let Some(len) = req.values.as_ref().map(bulk::push_payload_len) {
                    let _ = len == Ok(head.body_len);
                }
                let _ = ps_core::PushSparse::try_from(req);
            }
        }
        _ => {}
    }
});
