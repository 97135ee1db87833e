#![no_main]
//! The scheduler's job validator: any bytes decoded as a job spec give a valid job or a clean
//! error, never a panic; the TOML form too.

use libfuzzer_sys::fuzz_target;
use prost::Message;
use ps_proto::v1 as pb;

fuzz_target!(|data: &[u8]| {
    if let Ok(spec) = pb::JobSpec::decode(data)
        && let Ok(job) = ps_core::JobSpec::try_from(spec)
    {
        let _ = job.validated();
    }
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = ps_core::JobSpec::from_toml(text);
    }
});
