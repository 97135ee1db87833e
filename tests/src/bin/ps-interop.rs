//! The Rust side of the Python SDK's tests (`sdk/python/tests`): what the Python client must
//! agree with, computed by the Rust code itself at test time, so the two can never drift.
//!
//! - `ps-interop vectors`: JSON on stdout with the stable hashes, the partitioner's owners of
//!   ids and chunks, and payloads encoded by the Rust encoder (inputs included).
//! - `ps-interop push-dense|pull-dense|push-sparse|pull-sparse --endpoints A,B --table T ...`:
//!   the Rust SDK on the same tables as a Python client, values as little-endian files.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use ps_client::{ClientConfig, Codec, CompressOptions, Lz4Policy, PsClient, PullCodec, TableCodec};
use ps_codec::Encoder;
use ps_core::hash::{combine, fnv1a, mix64};
use ps_core::{Partitioner, TableName};
use serde_json::{Value, json};

#[derive(Parser)]
#[command(about = "The Rust side of the Python SDK's tests")]
struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(clap::Args)]
struct Conn {
    /// Shard endpoints in index order, comma-separated.
    #[arg(long, value_delimiter = ',')]
    endpoints: Vec<String>,
    #[arg(long)]
    table: String,
    /// Push codec (text form).
    #[arg(long, default_value = "f32")]
    codec: String,
    /// Pull codec (text form).
    #[arg(long, default_value = "f32")]
    pull_codec: String,
    /// Send plain-f32 dense calls through gRPC, not the shards' bulk streams.
    #[arg(long)]
    no_bulk: bool,
}

#[derive(Subcommand)]
enum Cmd {
    /// Hashes, owners and encoded payloads as JSON.
    Vectors,
    /// Pushes the f32 values of each file of `values` to dense table `table`, in order, from
    /// one client (so a lossy codec's residual carries from one push to the next).
    PushDense {
        #[command(flatten)]
        conn: Conn,
        #[arg(required = true)]
        values: Vec<PathBuf>,
    },
    /// Pulls dense table `table` into `out` (f32).
    PullDense {
        #[command(flatten)]
        conn: Conn,
        out: PathBuf,
    },
    /// Pushes rows `ids` (u64 file) with the gradients of each file of `values` (f32), in
    /// order, from one client.
    PushSparse {
        #[command(flatten)]
        conn: Conn,
        ids: PathBuf,
        #[arg(required = true)]
        values: Vec<PathBuf>,
    },
    /// Times `rounds` push+pull round trips of dense table `table` (a random gradient) and
    /// prints each round's push and pull seconds as a JSON array of pairs (the Python SDK's
    /// goodput benchmark). `--fused`: each round trip is one `push_pull_dense`, its time
    /// given as the push's and the pull's as 0.
    Bench {
        #[command(flatten)]
        conn: Conn,
        #[arg(long, default_value_t = 5)]
        rounds: u32,
        #[arg(long)]
        fused: bool,
    },
    /// Pulls rows `ids` (u64 file) into `out` (f32).
    PullSparse {
        #[command(flatten)]
        conn: Conn,
        ids: PathBuf,
        out: PathBuf,
    },
}

fn main() -> Result<()> {
    let args = Args::parse();
    match args.cmd {
        Cmd::Vectors => {
            println!("{}", serde_json::to_string(&vectors()?)?);
            Ok(())
        }
        cmd => tokio::runtime::Runtime::new()?.block_on(sdk(cmd)),
    }
}

async fn sdk(cmd: Cmd) -> Result<()> {
    let conn = match &cmd {
        Cmd::PushDense { conn, .. }
        | Cmd::PullDense { conn, .. }
        | Cmd::PushSparse { conn, .. }
        | Cmd::PullSparse { conn, .. }
        | Cmd::Bench { conn, .. } => conn,
        Cmd::Vectors => unreachable!("handled by main"),
    };
    let mut cfg = ClientConfig::new(conn.endpoints.clone());
    cfg.bulk = !conn.no_bulk;
    cfg.codec = TableCodec {
        push: CompressOptions::new(conn.codec.parse::<Codec>()?),
        pull: conn.pull_codec.parse::<PullCodec>()?,
    };
    let ps = PsClient::connect(cfg).await?;
    let t = conn.table.as_str();
    match &cmd {
        Cmd::PushDense { values, .. } => {
            for v in values {
                ps.push_dense(t, &read_f32(v)?).await?;
            }
        }
        Cmd::PullDense { out, .. } => write_f32(out, &ps.pull_dense(t).await?)?,
        Cmd::PushSparse { ids, values, .. } => {
            let ids = read_u64(ids)?;
            for v in values {
                ps.push_sparse(t, &ids, &read_f32(v)?).await?;
            }
        }
        Cmd::PullSparse { ids, out, .. } => {
            write_f32(out, &ps.pull_sparse(t, &read_u64(ids)?).await?)?;
        }
        Cmd::Bench { rounds, fused, .. } => {
            let mut w = ps.pull_dense(t).await?;
            let n = w.len();
            // Values lz4 cannot shrink, as a real gradient's: the push stays plain f32.
            let grad: Vec<f32> = (0..n as u64)
                .map(|i| (mix64(i) >> 40) as f32 / (1u64 << 24) as f32 - 0.5)
                .collect();
            let mut secs = Vec::new();
            for _ in 0..*rounds {
                let start = std::time::Instant::now();
                if *fused {
                    ps.push_pull_dense(t, &grad, &mut w).await?;
                    secs.push([start.elapsed().as_secs_f64(), 0.0]);
                    std::hint::black_box(&w);
                    continue;
                }
                ps.push_dense(t, &grad).await?;
                let pushed = start.elapsed().as_secs_f64();
                // Into one buffer, as a training loop keeps its parameters.
                ps.pull_dense_into(t, &mut w).await?;
                secs.push([pushed, start.elapsed().as_secs_f64() - pushed]);
                std::hint::black_box(&w);
            }
            println!("{}", serde_json::to_string(&secs)?);
        }
        Cmd::Vectors => {}
    }
    Ok(())
}

fn read_f32(path: &PathBuf) -> Result<Vec<f32>> {
    let b = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    if b.len() % 4 != 0 {
        bail!("{} is not a whole number of f32", path.display());
    }
    Ok(b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

fn read_u64(path: &PathBuf) -> Result<Vec<u64>> {
    let b = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    if b.len() % 8 != 0 {
        bail!("{} is not a whole number of u64", path.display());
    }
    Ok(b.chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()))
        .collect())
}

fn write_f32(path: &PathBuf, v: &[f32]) -> Result<()> {
    let b: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    std::fs::write(path, b).with_context(|| format!("writing {}", path.display()))
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Inputs for the codec vectors: seeded Gaussian-ish values with the cases that matter for
/// byte-exact agreement mixed in (ties, signed zeros, values past f16's range, rounding edges).
fn codec_input(n: usize, seed: u64) -> Vec<f32> {
    let mut state = seed;
    let mut v: Vec<f32> = (0..n)
        .map(|_| {
            state = mix64(state.wrapping_add(0x9e37_79b9_7f4a_7c15));
            // A value in about (-4, 4) with a spread of magnitudes.
            let u = (state >> 11) as f64 / (1u64 << 53) as f64;
            let e = ((state & 0xff) as f64 / 255.0) * 8.0 - 6.0;
            ((u - 0.5) * 2f64.powf(e)) as f32
        })
        .collect();
    let specials = [
        0.0,
        -0.0,
        1.0,
        -1.0,
        65504.0,
        70000.0,
        -1e-8,
        3.0,
        -3.0,
        3.0,
        f32::from_bits(0x3f80_8000),
        f32::from_bits(0x3f81_8000),
    ];
    for (i, s) in specials.iter().enumerate() {
        if i * 7 < n {
            v[i * 7] = *s;
        }
    }
    v
}

fn vectors() -> Result<Value> {
    let names = ["", "a", "w", "emb/user", "layer.0.weight", "ünï"];
    let hashes: Vec<Value> = names
        .iter()
        .map(|n| json!({"name": n, "fnv1a": fnv1a(n.as_bytes()).to_string()}))
        .collect();
    let ints: Vec<u64> = vec![0, 1, 2, 42, 1 << 32, u64::MAX, 0x0123_4567_89ab_cdef];
    let mixes: Vec<Value> = ints
        .iter()
        .map(|&x| {
            json!({"x": x.to_string(), "mix64": mix64(x).to_string(),
                   "combine_x_7": combine(x, 7).to_string()})
        })
        .collect();
    let ids: Vec<u64> = (0..200u64)
        .map(|i| mix64(i ^ 0xabcd))
        .chain(0..50)
        .chain([u64::MAX, u64::MAX - 1])
        .collect();
    let mut partitions = Vec::new();
    for (n, vnodes) in [(1u32, 128u32), (2, 128), (3, 16), (5, 128), (7, 1)] {
        let p = Partitioner::new(n, vnodes);
        for name in ["w", "emb/user"] {
            let h = TableName::try_from(name.to_owned())?.hash64();
            partitions.push(json!({
                "num_shards": n, "virtual_nodes": vnodes, "table": name,
                "ids": ids.iter().map(u64::to_string).collect::<Vec<_>>(),
                "id_owners": ids.iter().map(|&i| p.shard_for_id(h, i)).collect::<Vec<_>>(),
                "chunk_owners": (0..40u64).map(|c| p.shard_for_chunk(h, c)).collect::<Vec<_>>(),
            }));
        }
    }
    let codecs = [
        "f32",
        "fp16",
        "bf16",
        "int8",
        "int8:64",
        "int4",
        "int4:63",
        "sign",
        "sign:100",
        "topk:0.01",
        "topk:0.05:f32",
        "topk:0.3",
    ];
    let mut payloads = Vec::new();
    for (n, seed) in [(1000usize, 1u64), (3001, 2), (70_000, 3)] {
        let input = codec_input(n, seed);
        let input_bytes: Vec<u8> = input.iter().flat_map(|x| x.to_le_bytes()).collect();
        for c in codecs {
            let codec: Codec = c.parse()?;
            let mut enc = Encoder::new(
                CompressOptions {
                    codec,
                    min_values: 0,
                    lz4: Lz4Policy {
                        enabled: false,
                        ..Lz4Policy::default()
                    },
                    error_feedback: true,
                },
                0,
            );
            let e = enc.encode(&input);
            let h = &e.header;
            payloads.push(json!({
                "codec": c, "input": hex(&input_bytes),
                "encoding": ps_core::payload::encoding_to_pb(h.encoding) as i32,
                "num_values": h.num_values, "block_size": h.block_size,
                "num_entries": h.num_entries, "data": hex(&e.data),
                "decoded": hex(&e.to_vec()?.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>()),
            }));
        }
    }
    Ok(json!({"hashes": hashes, "mixes": mixes, "partitions": partitions, "payloads": payloads}))
}
