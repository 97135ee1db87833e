#![no_main]

use libfuzzer_sys::fuzz_target;
use ps_codec::{Compression, Encoding};

mod common;

fuzz_target!(|data: &[u8]| {
    common::run(Encoding::F16, Compression::None, data);
    common::run(Encoding::Bf16, Compression::None, data);
    common::run(Encoding::F32, Compression::None, data);
});
