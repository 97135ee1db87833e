//! Encode and decode throughput of every codec on one core, against memcpy in the same run.
//!
//! `codec-bench [--sizes 1048576,16777216] [--reps 7] [--only topk]` prints one markdown table
//! per size (`--only` keeps the codecs whose name contains the text):
//! GB/s of f32 input encoded and decoded, the time of one encode, and the compression ratio
//! (f32 bytes / bytes on the wire). The input is gradient-like: normally distributed values.

use std::hint::black_box;
use std::time::{Duration, Instant};

use ps_codec::{Codec, CompressOptions, Encoder, Lz4Policy, SparseValues};
use rand::Rng;
use rand_xoshiro::Xoshiro256PlusPlus;
use rand_xoshiro::rand_core::SeedableRng;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn time(reps: usize, mut f: impl FnMut()) -> Duration {
    f(); // warm up: page in buffers, fill caches
    median(
        (0..reps)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed()
            })
            .collect(),
    )
}

fn gbps(bytes: usize, t: Duration) -> f64 {
    bytes as f64 / t.as_secs_f64() / 1e9
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let sizes: Vec<usize> = flag("--sizes")
        .unwrap_or_else(|| "1048576,16777216".into())
        .split(',')
        .filter_map(|s| s.parse().ok())
        .collect();
    let reps: usize = flag("--reps").and_then(|s| s.parse().ok()).unwrap_or(7);
    let only = flag("--only").unwrap_or_default();
    let codecs = [
        Codec::F32,
        Codec::F16,
        Codec::Bf16,
        Codec::Int8 { block: 256 },
        Codec::Int4 { block: 256 },
        Codec::Sign { block: 256 },
        Codec::Qsgd {
            levels: 15,
            block: 256,
        },
        Codec::Qsgd {
            levels: 1,
            block: 256,
        },
        Codec::TopK {
            ratio: 0.01,
            values: SparseValues::F16,
        },
        Codec::TopK {
            ratio: 0.01,
            values: SparseValues::F32,
        },
        Codec::TopK {
            ratio: 0.001,
            values: SparseValues::F16,
        },
        Codec::RandomK {
            ratio: 0.01,
            values: SparseValues::F16,
        },
    ];
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(42);
    for &n in &sizes {
        // Normal(0, 1) by the sum of four uniforms: cheap, and the right shape for gradients.
        let values: Vec<f32> = (0..n)
            .map(|_| (0..4).map(|_| rng.random::<f32>() - 0.5).sum::<f32>() * 1.732)
            .collect();
        let bytes = n * 4;
        let mut dst = vec![0.0f32; n];
        let memcpy = time(reps, || {
            dst.copy_from_slice(black_box(&values));
            black_box(&dst);
        });
        println!("\n### {n} floats ({} MiB of f32), one core\n", bytes >> 20);
        println!(
            "memcpy: {:.2} GB/s ({:.2} ms)\n",
            gbps(bytes, memcpy),
            memcpy.as_secs_f64() * 1e3
        );
        println!(
            "| codec | encode GB/s | encode ms | decode GB/s | encode / memcpy | ratio | lz4 |"
        );
        println!("| --- | ---: | ---: | ---: | ---: | ---: | --- |");
        for codec in codecs
            .iter()
            .copied()
            .filter(|c| c.to_string().contains(&only))
        {
            for lz4 in [false, true] {
                if lz4
                    && codec != Codec::F32
                    && !matches!(codec, Codec::TopK { .. } | Codec::Int8 { .. })
                {
                    continue;
                }
                let opts = CompressOptions {
                    error_feedback: true,
                    codec,
                    min_values: 0,
                    lz4: Lz4Policy {
                        enabled: lz4,
                        ..Lz4Policy::default()
                    },
                };
                let mut enc = Encoder::new(opts, 1);
                // One output buffer for every rep, as a sender that keeps its buffer has.
                let mut buf = Vec::new();
                let t_enc = time(reps, || {
                    black_box(enc.encode_into(black_box(&values), &mut buf));
                });
                let encoded = enc.encode(&values);
                let t_dec = time(reps, || {
                    encoded.decode_into(&mut dst).expect("decodes");
                    black_box(&dst);
                });
                println!(
                    "| {codec} | {:.2} | {:.2} | {:.2} | {:.2} | {:.1}x | {} |",
                    gbps(bytes, t_enc),
                    t_enc.as_secs_f64() * 1e3,
                    gbps(bytes, t_dec),
                    memcpy.as_secs_f64() / t_enc.as_secs_f64(),
                    bytes as f64 / encoded.data.len() as f64,
                    match (lz4, encoded.header.compression) {
                        (false, _) => "off",
                        (true, ps_codec::Compression::Lz4) => "on, kept",
                        (true, ps_codec::Compression::None) => "on, skipped",
                    }
                );
            }
        }
    }
}
