//! Trains softmax regression on Fashion-MNIST through a parameter server, from a user's own
//! training loop: pull the weights, compute the gradient of a mini-batch, push it; the shard
//! applies it with its SGD optimizer and makes it durable before acknowledging.
//!
//! ```text
//! ps-server --data-dir /tmp/ps --listen 127.0.0.1:7070 &
//! cargo run --release -p ps-worker --example train_softmax -- --endpoints http://127.0.0.1:7070
//! ```
//!
//! The data comes from Debian's `dataset-fashion-mnist` package (or `--data DIR` holding the
//! four IDX files), read by the worker crate's loader; without it the example says how to get
//! it and trains on a synthetic problem instead. The model, its gradient and the loop are the
//! user's own: only the parameter server and the loader are the project's.

use std::path::PathBuf;
use std::time::Instant;

use clap::Parser;
use ps_client::{ClientConfig, Codec, CompressOptions, PsClient, TableCodec};
use ps_core::{Optimizer, TableSpec};
use ps_worker::data::{Batch, Dataset, DatasetSpec, Features};
use rand::SeedableRng;
use rand::seq::SliceRandom;

#[derive(Parser)]
struct Args {
    /// Shard endpoints, in shard order.
    #[arg(long, value_delimiter = ',', default_value = "http://127.0.0.1:7070")]
    endpoints: Vec<String>,
    /// Directory of the Fashion-MNIST IDX files (default: where Debian's package puts them).
    #[arg(long)]
    data: Option<PathBuf>,
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

/// A split's examples as one row-major matrix and its labels.
struct Examples {
    x: Vec<f32>,
    y: Vec<u32>,
    dim: usize,
}

impl Examples {
    fn of(set: &dyn Dataset) -> Self {
        let mut batch = Batch::empty(set.input());
        set.gather(&(0..set.len()).collect::<Vec<_>>(), &mut batch);
        let (x, dim) = match batch.features {
            Features::Dense { values, dim } => (values, dim),
            Features::Sparse { .. } => (Vec::new(), 0),
        };
        Self {
            x,
            y: batch.labels,
            dim,
        }
    }

    fn len(&self) -> usize {
        self.y.len()
    }
}

/// Softmax cross-entropy: returns (mean loss, gradient of the mean loss w.r.t. `w`).
/// `w` is (dim + 1) x CLASSES, the last row the bias.
fn loss_and_grad(w: &[f32], x: &[f32], y: &[u32], dim: usize) -> (f32, Vec<f32>) {
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

fn accuracy(w: &[f32], data: &Examples) -> f32 {
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
    let spec = match &args.data {
        Some(dir) => format!("idx:{}", dir.display()),
        None => "fashion-mnist".to_owned(),
    };
    let (split, what) = match DatasetSpec::parse(&spec)?.load(None, args.seed) {
        Ok(split) => (split, "Fashion-MNIST"),
        Err(e) => {
            eprintln!("{e:#}\n  Training on a synthetic problem instead.");
            let synthetic = DatasetSpec::parse("synthetic-dense:25000:32:10")?;
            (synthetic.load(None, args.seed)?, "synthetic blobs")
        }
    };
    let (train, test) = (
        Examples::of(split.train.as_ref()),
        Examples::of(split.test.as_ref()),
    );
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
