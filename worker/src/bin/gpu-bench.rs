//! `gpu-bench`: the CUDA backend's figures, on a machine with a GPU (BENCHMARKS.md says how to
//! run it next to `scripts/torch_baseline.py`, which times the same work in PyTorch).
//!
//! - `gpu-bench step --batch 256`: one training step of the MLP (784-256-10, ReLU, softmax
//!   cross-entropy): upload the batch, forward, backward, and compress every dense gradient on
//!   the device with top-k 1% and error feedback, the payload downloaded. Prints samples/s.
//! - `gpu-bench topk --n 16777216 --ratio 0.01`: the device top-k alone (threshold selection,
//!   ordered compaction, residual update, the entries downloaded). Prints milliseconds.
//!
//! Each prints one JSON line. `--device cpu` runs the step on the CPU backend for reference.

use std::time::Instant;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use ps_codec::Codec;
use ps_worker::backend::cuda::compress::DeviceCompressor;
use ps_worker::backend::{Backend, Cpu, DeviceChoice, Selected, cuda};
use ps_worker::data::{Batch, Features, Input};
use ps_worker::model::{ModelSpec, Net};
use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

#[derive(Parser)]
#[command(name = "gpu-bench", about = "Figures of the CUDA backend")]
struct Args {
    #[arg(long, default_value = "cuda:0")]
    device: DeviceChoice,
    #[command(subcommand)]
    what: What,
}

#[derive(Subcommand)]
enum What {
    /// The MLP training step, with device compression.
    Step {
        #[arg(long, default_value_t = 256)]
        batch: usize,
        #[arg(long, default_value_t = 256)]
        hidden: usize,
        #[arg(long, default_value_t = 200)]
        steps: usize,
        /// The codec of the dense gradients (a device codec: f32, fp16, bf16, int8, sign, topk).
        #[arg(long, default_value = "topk:0.01")]
        codec: String,
    },
    /// The device top-k of one vector.
    Topk {
        #[arg(long, default_value_t = 1 << 24)]
        n: usize,
        #[arg(long, default_value_t = 0.01)]
        ratio: f64,
        #[arg(long, default_value_t = 50)]
        reps: usize,
    },
}

fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    let device = cuda::select(a.device).map_err(anyhow::Error::msg)?;
    match (a.what, device) {
        (
            What::Step {
                batch,
                hidden,
                steps,
                codec,
            },
            Selected::Cuda(c),
        ) => {
            let codec: Codec = codec.parse()?;
            let cuda = c.clone();
            step(c, batch, hidden, steps, |net| {
                // One compressor per dense table, kept across steps (the residuals).
                let mut enc: Vec<DeviceCompressor> = net
                    .dense_grad_buffers()
                    .iter()
                    .map(|(_, b)| DeviceCompressor::new(&cuda, b.len(), true))
                    .collect::<Result<_, _>>()?;
                Ok(Box::new(move |net: &Net<cuda::Cuda>| {
                    let mut bytes = 0;
                    for (e, (_, g)) in enc.iter_mut().zip(net.dense_grad_buffers()) {
                        bytes += e.encode(g, &codec)?.data.len();
                    }
                    Ok(bytes)
                }))
            })
        }
        (
            What::Step {
                batch,
                hidden,
                steps,
                codec,
            },
            Selected::Cpu,
        ) => {
            let codec: Codec = codec.parse()?;
            step(Cpu, batch, hidden, steps, |_| {
                let mut enc = ps_codec::Encoder::new(ps_codec::CompressOptions::new(codec), 0);
                Ok(Box::new(move |net: &Net<Cpu>| {
                    let g = net.grads()?;
                    Ok(g.dense.iter().map(|(_, v)| enc.encode(v).data.len()).sum())
                }))
            })
        }
        (What::Topk { n, ratio, reps }, Selected::Cuda(c)) => topk(&c, n, ratio, reps),
        (What::Topk { .. }, Selected::Cpu) => {
            bail!("topk measures the device top-k: use a CUDA device")
        }
    }
}

type Compress<B> = Box<dyn FnMut(&Net<B>) -> anyhow::Result<usize>>;

fn step<B: Backend + Clone>(
    backend: B,
    batch: usize,
    hidden: usize,
    steps: usize,
    make: impl FnOnce(&Net<B>) -> anyhow::Result<Compress<B>>,
) -> anyhow::Result<()> {
    let name = backend.name();
    let spec = ModelSpec::parse(&format!("mlp:{hidden}"))?;
    let mut net = Net::new(backend, spec, "bench", Input::Dense { dim: 784 }, 10)?;
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(1);
    for (t, len) in net.dense_tables().to_vec() {
        let init: Vec<f32> = (0..len).map(|_| rng.random_range(-0.05f32..0.05)).collect();
        net.set_dense(&t, &init)?;
    }
    let batches: Vec<Batch> = (0..4)
        .map(|_| Batch {
            labels: (0..batch).map(|_| rng.random_range(0..10)).collect(),
            features: Features::Dense {
                dim: 784,
                values: (0..batch * 784).map(|_| rng.random::<f32>()).collect(),
            },
            epoch: 0,
        })
        .collect();
    let mut compress = make(&net)?;
    let mut probs = Vec::new();
    let mut bytes = 0;
    let mut run = |net: &mut Net<B>, i: usize| -> anyhow::Result<usize> {
        net.zero_grads()?;
        net.step(
            &batches[i % batches.len()],
            1.0 / batch as f32,
            true,
            &mut probs,
        )
        .context("step")?;
        compress(net)
    };
    for i in 0..10 {
        run(&mut net, i)?;
    }
    let t0 = Instant::now();
    for i in 0..steps {
        bytes = run(&mut net, i)?;
    }
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "{{\"bench\":\"step\",\"backend\":\"{name}\",\"batch\":{batch},\"hidden\":{hidden},\"steps\":{steps},\"ms_per_step\":{:.4},\"samples_per_s\":{:.0},\"payload_bytes\":{bytes}}}",
        secs * 1e3 / steps as f64,
        (steps * batch) as f64 / secs
    );
    Ok(())
}

fn topk(c: &cuda::Cuda, n: usize, ratio: f64, reps: usize) -> anyhow::Result<()> {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(2);
    let host: Vec<f32> = (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    let grad = c.upload(&host)?;
    let codec = Codec::TopK {
        ratio,
        values: ps_codec::SparseValues::F16,
    };
    let mut enc = DeviceCompressor::new(c, n, true)?;
    for _ in 0..3 {
        enc.encode(&grad, &codec)?;
    }
    c.sync()?;
    let mut times = Vec::with_capacity(reps);
    let mut entries = 0;
    for _ in 0..reps {
        let t0 = Instant::now();
        let e = enc.encode(&grad, &codec)?;
        times.push(t0.elapsed().as_secs_f64() * 1e3);
        entries = e.header.num_entries;
    }
    times.sort_by(f64::total_cmp);
    println!(
        "{{\"bench\":\"topk\",\"n\":{n},\"ratio\":{ratio},\"entries\":{entries},\"reps\":{reps},\"ms_median\":{:.4},\"ms_min\":{:.4}}}",
        times[reps / 2],
        times[0]
    );
    Ok(())
}
