//! Compiles `ps/v1/*.proto` with protox (no `protoc` needed) and exports the descriptor set
//! that the services serve through gRPC reflection.

use std::{env, fs, path::PathBuf};

use protox::prost::Message as _;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["ps/v1/ps.proto", "ps/v1/scheduler.proto"];
    let fds = protox::compile(protos, ["."])?;
    let out = PathBuf::from(env::var("OUT_DIR")?);
    fs::write(out.join("ps_descriptor.bin"), fds.encode_to_vec())?;

    tonic_prost_build::configure()
        .bytes(".ps.v1.Payload.data")
        .codec_path("crate::codec::PsCodec")
        .type_attribute(".", "#[allow(clippy::all, clippy::pedantic)]")
        .compile_fds(fds)?;

    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    Ok(())
}
