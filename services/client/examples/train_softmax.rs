//! Trains softmax regression on Fashion-MNIST through a parameter server, from a user's own
//! training loop: pull the weights, compute the gradient of a mini-batch, push it; the shard
//! applies it with its SGD optimizer and makes it durable before acknowledging.
//!
//! ```text
//! ps-server --data-dir /tmp/ps --listen 127.0.0.1:7070 &
//! cargo run --release --example train_softmax -- --endpoints http://127.0.0.1:7070
//! ```
//!
//! The data comes from Debian's `dataset-fashion-mnist` package (or `--data DIR` holding the
//! four IDX files); without it the example says how to get it and trains on a synthetic
//! problem instead.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, bail};
use clap::Parser;
use ps_client::{ClientConfig, Codec, CompressOptions, PsClient, TableCodec};
use ps_core::{Optimizer, TableSpec};
use rand::SeedableRng;
use rand::seq::SliceRandom;

#[derive(Parser)]
struct Args {
    /// Shard endpoints, in shard order.
    #[arg(long, value_delimiter = ',', default_value = "http://127.0.0.1:7070")]
    endpoints: Vec<String>,
    /// Directory of the Fashion-MNIST IDX files.
    #[arg(long, default_value = "/usr/share/datasets/fashion-mnist")]
    data: PathBuf,
    #[arg(long, default_value_t = 5)]
    epochs: usize,
    #[arg(long, default_value_t = 100)]
    batch: usize,
    /// Learning rate of the shard's momentum optimizer.
    #[arg(long, default_value_t = 0.02)]
    lr: f32,
    /// Momentum of the shard's optimizer (0: plain SGD).
    #[arg(long, default_value_t = 0.9)]
    momentum: f32,
    /// Seed of the per-epoch shuffle.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Codec of the gradient pushes (f32, fp16, bf16, int8, sign, qsgd, topk:0.01, ...);
    /// lossy codecs keep error feedback.
    #[arg(long, default_value = "f32")]
    codec: Codec,
    /// Error feedback for the codec: on or off (default: what the codec wants; off for QSGD).
    #[arg(long)]
    error_feedback: Option<bool>,
}

const CLASSES: usize = 10;

struct Split {
    x: Vec<f32>,
    y: Vec<u8>,
    dim: usize,
}

impl Split {
    fn len(&self) -> usize {
        self.y.len()
    }
}

fn read_idx(path: &Path) -> anyhow::Result<(Vec<usize>, Vec<u8>)> {
    let raw = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let mut bytes = Vec::new();
    if raw.starts_with(&[0x1f, 0x8b]) {
        flate2::read::GzDecoder::new(&raw[..]).read_to_end(&mut bytes)?;
    } else {
        bytes = raw;
    }
    if bytes.len() < 4 || bytes[0] != 0 || bytes[1] != 0 || bytes[2] != 8 {
        bail!("{} is not an IDX file of unsigned bytes", path.display());
    }
    let ndims = bytes[3] as usize;
    let header = 4 + 4 * ndims;
    let dims: Vec<usize> = (0..ndims)
        .map(|i| {
            let b = bytes
                .get(4 + 4 * i..8 + 4 * i)
                .context("truncated header")?;
            Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
        })
        .collect::<anyhow::Result<_>>()?;
    let body = bytes.get(header..).context("truncated IDX file")?.to_vec();
    if body.len() != dims.iter().product::<usize>() {
        bail!(
            "{}: header says {:?} but holds {} bytes",
            path.display(),
            dims,
            body.len()
        );
    }
    Ok((dims, body))
}

fn load(dir: &Path, prefix: &str) -> anyhow::Result<Split> {
    let (dims, pixels) = read_idx(&dir.join(format!("{prefix}-images-idx3-ubyte.gz")))?;
    let (_, y) = read_idx(&dir.join(format!("{prefix}-labels-idx1-ubyte.gz")))?;
    let dim = dims[1..].iter().product();
    Ok(Split {
        x: pixels.iter().map(|&p| f32::from(p) / 255.0).collect(),
        y,
        dim,
    })
}

/// A synthetic 10-class problem: Gaussian blobs around random centres.
fn synthetic(n: usize, seed: u64) -> Split {
    let dim = 32;
    let mut s = seed;
    let mut next = move || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((s >> 33) as f32 / (1u64 << 31) as f32) - 0.5
    };
    let centres: Vec<f32> = (0..CLASSES * dim)
        .map(|i| ((i * 7919 % 101) as f32 / 50.0) - 1.0)
        .collect();
    let mut x = Vec::with_capacity(n * dim);
    let mut y = Vec::with_capacity(n);
    for i in 0..n {
        let c = i % CLASSES;
        y.push(c as u8);
        x.extend((0..dim).map(|d| centres[c * dim + d] + 1.5 * next()));
    }
    Split { x, y, dim }
}

/// Softmax cross-entropy: returns (mean loss, gradient of the mean loss w.r.t. `w`).
/// `w` is (dim + 1) x CLASSES, the last row the bias.
fn loss_and_grad(w: &[f32], x: &[f32], y: &[u8], dim: usize) -> (f32, Vec<f32>) {
    let n = y.len();
    let mut grad = vec![0.0f32; w.len()];
    let mut loss = 0.0;
    for (xi, &yi) in x.chunks_exact(dim).zip(y) {
        let mut logits = [0.0f32; CLASSES];
        for (k, l) in logits.iter_mut().enumerate() {
            *l = w[dim * CLASSES + k]
                + xi.iter()
                    .enumerate()
                    .map(|(d, v)| v * w[d * CLASSES + k])
                    .sum::<f32>();
        }
        let max = logits.iter().cloned().fold(f32::MIN, f32::max);
        let z: f32 = logits.iter().map(|l| (l - max).exp()).sum();
        loss += z.ln() + max - logits[yi as usize];
        for k in 0..CLASSES {
            let p = (logits[k] - max).exp() / z - if k == yi as usize { 1.0 } else { 0.0 };
            let p = p / n as f32;
            for (d, v) in xi.iter().enumerate() {
                grad[d * CLASSES + k] += p * v;
            }
            grad[dim * CLASSES + k] += p;
        }
    }
    (loss / n as f32, grad)
}

fn accuracy(w: &[f32], data: &Split) -> f32 {
    let dim = data.dim;
    let correct = data
        .x
        .chunks_exact(dim)
        .zip(&data.y)
        .filter(|(xi, yi)| {
            let score = |k: usize| {
                w[dim * CLASSES + k]
                    + xi.iter()
                        .enumerate()
                        .map(|(d, v)| v * w[d * CLASSES + k])
                        .sum::<f32>()
            };
            let best = (0..CLASSES)
                .max_by(|&a, &b| score(a).total_cmp(&score(b)))
                .unwrap_or(0);
            best == **yi as usize
        })
        .count();
    correct as f32 / data.len() as f32
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let (train, test, what) = match (load(&args.data, "train"), load(&args.data, "t10k")) {
        (Ok(a), Ok(b)) => (a, b, "Fashion-MNIST"),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!(
                "Fashion-MNIST not found under {} ({e:#}).\n  Install it with: sudo apt-get install dataset-fashion-mnist\n  \
                 or pass --data DIR with train/t10k-{{images-idx3,labels-idx1}}-ubyte.gz.\n  Training on a synthetic problem instead.",
                args.data.display()
            );
            (synthetic(20_000, 1), synthetic(5_000, 2), "synthetic blobs")
        }
    };
    let dim = train.dim;
    println!(
        "{what}: {} train, {} test examples of {dim} features",
        train.len(),
        test.len()
    );

    let mut cfg = ClientConfig::new(args.endpoints.clone());
    let mut push = CompressOptions::new(args.codec);
    push.error_feedback = args.error_feedback.unwrap_or(push.error_feedback);
    cfg.codec = TableCodec {
        push,
        ..TableCodec::default()
    };
    let ps = PsClient::connect(cfg).await?;
    let spec = TableSpec::dense("softmax/w", &[(dim + 1) as u64, CLASSES as u64])?.with_optimizer(
        if args.momentum > 0.0 {
            Optimizer::momentum(args.lr, args.momentum)
        } else {
            Optimizer::sgd(args.lr)
        },
    )?;
    ps.create_table(spec).await?;
    println!(
        "connected to {} shard(s) as client {:016x}",
        ps.shards().len(),
        ps.client_id()
    );

    let started = Instant::now();
    let steps = train.len() / args.batch;
    let mut order: Vec<usize> = (0..train.len()).collect();
    let mut rng = rand::rngs::StdRng::seed_from_u64(args.seed);
    let (mut bx, mut by) = (
        Vec::with_capacity(args.batch * dim),
        Vec::with_capacity(args.batch),
    );
    for epoch in 1..=args.epochs {
        order.shuffle(&mut rng);
        let mut loss_sum = 0.0;
        let (mut wire, mut raw) = (0u64, 0u64);
        for step in 0..steps {
            bx.clear();
            by.clear();
            for &i in &order[step * args.batch..(step + 1) * args.batch] {
                bx.extend_from_slice(&train.x[i * dim..(i + 1) * dim]);
                by.push(train.y[i]);
            }
            let w = ps.pull_dense("softmax/w").await?;
            let (loss, grad) = loss_and_grad(&w, &bx, &by, dim);
            let pushed = ps.push_dense("softmax/w", &grad).await?;
            wire += pushed.wire_bytes;
            raw += pushed.raw_bytes;
            loss_sum += loss;
        }
        let w = ps.pull_dense("softmax/w").await?;
        println!(
            "epoch {epoch}/{}: train loss {:.4}, test accuracy {:.2}%, {:.1}s, pushed {:.2} MiB \
             ({}, {:.1}x smaller than f32)",
            args.epochs,
            loss_sum / steps as f32,
            100.0 * accuracy(&w, &test),
            started.elapsed().as_secs_f32(),
            wire as f64 / f64::from(1 << 20),
            args.codec,
            raw as f64 / wire.max(1) as f64
        );
    }
    let w = ps.pull_dense("softmax/w").await?;
    println!(
        "final test accuracy: {:.2}% ({what}, softmax regression, pushes in {})",
        100.0 * accuracy(&w, &test),
        args.codec
    );
    let stats = ps.stats().await?;
    for s in stats {
        println!(
            "shard {}: {} pushes applied in {} durable writes ({} bytes)",
            s.shard_index, s.pushes_applied, s.write_batches, s.bytes_written
        );
    }
    Ok(())
}
