#![no_main]

use libfuzzer_sys::fuzz_target;
use ps_codec::{Compression, Encoding};

mod common;

fuzz_target!(|data: &[u8]| {
    common::run(Encoding::Int4, Compression::None, data);
});
