#![no_main]

use libfuzzer_sys::fuzz_target;
use ps_codec::{Compression, Encoding};

mod common;

fuzz_target!(|data: &[u8]| {
    // Any encoding behind an lz4 frame: the frame is checked before the layout.
    let encoding = data.first().map_or(Encoding::F32, |b| Encoding::ALL[usize::from(*b) % Encoding::ALL.len()]);
    common::run(encoding, Compression::Lz4, data.get(1..).unwrap_or_default());
});
