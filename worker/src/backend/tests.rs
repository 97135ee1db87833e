//! Every backend operation, written once, run on each backend this machine has and compared
//! with the CPU's result. The CUDA runs need a GPU: they are ignored by default (the runner
//! reports them as skipped) and run on a GPU machine with
//! `PS_REQUIRE_GPU=1 cargo nextest run --release -p ps-worker --run-ignored all`, where a
//! missing or unusable GPU fails them (and, with PS_REQUIRE_GPU=1, the device-choice test).

use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

use super::{Backend, Bags, Cpu, Cuda, Trans, cuda};

/// Relative tolerance against the CPU: cuBLAS and the kernels sum in other orders, and the
/// GPU's expf/logf differ from the host's in the last bits.
const TOL: f32 = 1e-4;

/// Why the CUDA runs are ignored unless asked for.
const NEEDS_GPU: &str = "needs a CUDA device: run with --run-ignored all on a GPU machine";

/// The CUDA device for these tests; a test that asked for it fails without one.
fn gpu() -> Cuda {
    match cuda::probe(0) {
        Ok(c) => c,
        Err(e) => panic!("{NEEDS_GPU}; CUDA is unusable here: {e}"),
    }
}

fn random(rng: &mut impl Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-2.0f32..2.0)).collect()
}

fn close(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= TOL * (1.0 + w.abs()),
            "{what}[{i}]: {g} against the CPU's {w}"
        );
    }
}

fn host<B: Backend>(b: &B, buf: &B::Buf) -> Vec<f32> {
    let mut out = vec![0.0; b.len(buf)];
    b.download(buf, &mut out).unwrap();
    out
}

/// Runs every operation on `b` and on the CPU with the same inputs and compares the results.
fn matches_cpu<B: Backend>(b: &B) {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(7);
    let (m, n, k) = (33, 17, 65);
    // GEMM in every layout, with alpha and beta.
    for ta in [Trans::N, Trans::T] {
        for tb in [Trans::N, Trans::T] {
            let (a, bm, c) = (
                random(&mut rng, m * k),
                random(&mut rng, k * n),
                random(&mut rng, m * n),
            );
            let mut want = c.clone();
            Cpu.gemm(ta, tb, m, n, k, 0.7, &a, &bm, 0.3, &mut want)
                .unwrap();
            let mut got = b.upload(&c).unwrap();
            b.gemm(
                ta,
                tb,
                m,
                n,
                k,
                0.7,
                &b.upload(&a).unwrap(),
                &b.upload(&bm).unwrap(),
                0.3,
                &mut got,
            )
            .unwrap();
            close(&format!("gemm {ta:?}{tb:?}"), &host(b, &got), &want);
        }
    }
    // Bias, column sums, ReLU and its gradient, add, scale.
    let (rows, cols) = (37, 19);
    let x = random(&mut rng, rows * cols);
    let bias = random(&mut rng, cols);
    let mut want = x.clone();
    Cpu.add_row_bias(&mut want, &bias, cols).unwrap();
    let mut got = b.upload(&x).unwrap();
    b.add_row_bias(&mut got, &b.upload(&bias).unwrap(), cols)
        .unwrap();
    close("add_row_bias", &host(b, &got), &want);

    let mut want_sum = bias.clone();
    Cpu.sum_rows_into(&x, cols, &mut want_sum).unwrap();
    let mut got_sum = b.upload(&bias).unwrap();
    b.sum_rows_into(&b.upload(&x).unwrap(), cols, &mut got_sum)
        .unwrap();
    close("sum_rows_into", &host(b, &got_sum), &want_sum);

    let mut want_relu = x.clone();
    Cpu.relu(&mut want_relu).unwrap();
    let mut got_relu = b.upload(&x).unwrap();
    b.relu(&mut got_relu).unwrap();
    close("relu", &host(b, &got_relu), &want_relu);

    let dy = random(&mut rng, x.len());
    let mut want_dy = dy.clone();
    Cpu.relu_backward(&want_relu, &mut want_dy).unwrap();
    let mut got_dy = b.upload(&dy).unwrap();
    b.relu_backward(&got_relu, &mut got_dy).unwrap();
    close("relu_backward", &host(b, &got_dy), &want_dy);

    let mut want_add = x.clone();
    Cpu.add(&mut want_add, &dy).unwrap();
    Cpu.scale(&mut want_add, -0.25).unwrap();
    let mut got_add = b.upload(&x).unwrap();
    b.add(&mut got_add, &b.upload(&dy).unwrap()).unwrap();
    b.scale(&mut got_add, -0.25).unwrap();
    close("add, scale", &host(b, &got_add), &want_add);

    // Losses, with and without gradients.
    let classes = 10;
    let logits = random(&mut rng, rows * classes);
    let labels: Vec<u32> = (0..rows)
        .map(|_| rng.random_range(0..classes as u32))
        .collect();
    let mut want_g = vec![0.0; logits.len()];
    let want_l = Cpu
        .softmax_xent(&logits, &labels, classes, 0.5, Some(&mut want_g))
        .unwrap();
    let mut got_g = b.zeros(logits.len()).unwrap();
    let d_logits = b.upload(&logits).unwrap();
    let got_l = b
        .softmax_xent(&d_logits, &labels, classes, 0.5, Some(&mut got_g))
        .unwrap();
    assert!((got_l.loss - want_l.loss).abs() <= 1e-4 * (1.0 + want_l.loss.abs()));
    assert_eq!(got_l.correct, want_l.correct);
    close("softmax_xent grad", &host(b, &got_g), &want_g);
    assert!(
        b.softmax_xent(&d_logits, &[99; 37], classes, 1.0, None)
            .is_err()
    );

    let z = random(&mut rng, rows);
    let y: Vec<u32> = (0..rows).map(|_| rng.random_range(0..2)).collect();
    let (mut want_p, mut got_p) = (Vec::new(), Vec::new());
    let mut want_g = vec![0.0; rows];
    let want_l = Cpu
        .sigmoid_xent(&z, &y, 2.0, Some(&mut want_g), &mut want_p)
        .unwrap();
    let mut got_g = b.zeros(rows).unwrap();
    let got_l = b
        .sigmoid_xent(
            &b.upload(&z).unwrap(),
            &y,
            2.0,
            Some(&mut got_g),
            &mut got_p,
        )
        .unwrap();
    assert!((got_l.loss - want_l.loss).abs() <= 1e-4 * (1.0 + want_l.loss.abs()));
    assert_eq!(got_l.correct, want_l.correct);
    close("sigmoid_xent grad", &host(b, &got_g), &want_g);
    close("sigmoid_xent probs", &got_p, &want_p);

    // The embedding bag and its scatter-add, with rows repeated across bags.
    let (table_rows, dim) = (11, 8);
    let table = random(&mut rng, table_rows * dim);
    let mut bags = Bags {
        offsets: vec![0],
        ..Bags::default()
    };
    for _ in 0..23 {
        for _ in 0..rng.random_range(0..5) {
            bags.rows.push(rng.random_range(0..table_rows as u32));
            bags.weights.push(rng.random_range(0.0f32..1.0));
        }
        bags.offsets.push(bags.rows.len() as u32);
    }
    let mut want_out = vec![0.0; bags.len() * dim];
    Cpu.bag_forward(&table, dim, &bags, &mut want_out).unwrap();
    let mut got_out = b.zeros(bags.len() * dim).unwrap();
    b.bag_forward(&b.upload(&table).unwrap(), dim, &bags, &mut got_out)
        .unwrap();
    close("bag_forward", &host(b, &got_out), &want_out);
    let dout = random(&mut rng, bags.len() * dim);
    let mut want_dt = vec![0.0; table.len()];
    Cpu.bag_backward(&dout, dim, &bags, &mut want_dt).unwrap();
    let mut got_dt = b.zeros(table.len()).unwrap();
    b.bag_backward(&b.upload(&dout).unwrap(), dim, &bags, &mut got_dt)
        .unwrap();
    close("bag_backward", &host(b, &got_dt), &want_dt);

    // Shapes are checked before anything runs.
    let mut small = b.zeros(3).unwrap();
    assert!(b.add(&mut small, &b.zeros(4).unwrap()).is_err());
}

/// The comparison itself on the CPU twin (which must agree with itself, and refuse bad shapes
/// before running anything), so the harness is exercised on every machine.
#[test]
fn the_cpu_twin_runs_every_operation() {
    matches_cpu(&Cpu);
}

#[test]
#[ignore = "needs a CUDA device: run with --run-ignored all on a GPU machine"]
fn cuda_ops_match_the_cpu() {
    matches_cpu(&gpu());
}

#[test]
#[ignore = "needs a CUDA device: run with --run-ignored all on a GPU machine"]
fn device_codecs_match_the_host_codecs() {
    use ps_codec::{Codec, CompressOptions, Encoder};

    let c = gpu();
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(3);
    let n = 100_003;
    let grad = random(&mut rng, n);
    let d_grad = c.upload(&grad).unwrap();
    for text in [
        "f32",
        "fp16",
        "bf16",
        "int8",
        "sign:64",
        "topk:0.01",
        "topk:0.01:f32",
    ] {
        let codec: Codec = text.parse().unwrap();
        let mut dev = cuda::compress::DeviceCompressor::new(&c, n, true).unwrap();
        let sent = dev.encode(&d_grad, &codec).unwrap();
        let decoded = sent.to_vec().unwrap();
        if text.starts_with("topk") {
            // Each entry carries its own value (to f16's rounding), in index order.
            ps_codec::sparse::for_each_entry(&sent.header, &sent.data, |i, v| {
                assert!(
                    (grad[i] - v).abs() <= 1e-3 * grad[i].abs(),
                    "{text}: entry {i} carries {v} for {}",
                    grad[i]
                );
            })
            .unwrap();
        }
        // What was sent plus what was kept is the gradient (error feedback loses nothing).
        let residual = dev.residual().unwrap().unwrap();
        for i in 0..n {
            let sum = decoded[i] + residual[i];
            assert!(
                (sum - grad[i]).abs() <= 1e-5 * (1.0 + grad[i].abs()),
                "{text}: sent {} + kept {} != {}",
                decoded[i],
                residual[i],
                grad[i]
            );
        }
        // The host encoder gives the same payload, up to a block mean's rounding and top-k's
        // ties.
        let host = Encoder::new(
            CompressOptions {
                min_values: 0,
                lz4: ps_codec::Lz4Policy {
                    enabled: false,
                    ..Default::default()
                },
                ..CompressOptions::new(codec)
            },
            0,
        )
        .encode(&grad)
        .to_vec()
        .unwrap();
        // A second step on the same compressor (its buffers and residual carried over):
        // both payloads plus what is kept are twice the gradient.
        let again = dev.encode(&d_grad, &codec).unwrap().to_vec().unwrap();
        let residual = dev.residual().unwrap().unwrap();
        for i in 0..n {
            let sum = decoded[i] + again[i] + residual[i];
            assert!(
                (sum - 2.0 * grad[i]).abs() <= 2e-5 * (1.0 + grad[i].abs()),
                "{text}, second step: sent {} + {} + kept {} != 2 x {}",
                decoded[i],
                again[i],
                residual[i],
                grad[i]
            );
        }
        if text.starts_with("topk") {
            let k = Codec::entries(0.01, n);
            let dev_nz = decoded.iter().filter(|v| **v != 0.0).count();
            let both = decoded
                .iter()
                .zip(&host)
                .filter(|(d, h)| **d != 0.0 && **h != 0.0)
                .count();
            assert!(
                dev_nz >= k && dev_nz <= k + k / 10,
                "{text}: {dev_nz} entries for k={k}"
            );
            assert_eq!(both, k, "{text}: the host's top k are all in the device's");
        } else {
            close(text, &decoded, &host);
        }
    }
}

/// Top-k over 4 M values keeping 41 planted spikes: index gaps of three-byte varints (and a
/// first index of one or two bytes), a thousand tiles, no ties; the device's payload decodes to exactly
/// the host's.
#[test]
#[ignore = "needs a CUDA device: run with --run-ignored all on a GPU machine"]
fn device_top_k_of_a_long_vector_is_the_hosts() {
    use ps_codec::{Codec, CompressOptions, Encoder};

    let c = gpu();
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(4);
    let n = 1 << 22;
    let mut grad: Vec<f32> = random(&mut rng, n).iter().map(|v| v / 4.0).collect();
    let k = Codec::entries(0.00001, n);
    for j in 0..k {
        let at = 5 + j * (n / k) + rng.random_range(0..1000);
        grad[at] = if j % 2 == 0 { 10.0 } else { -10.0 } * (1.0 + j as f32);
    }
    let codec: Codec = "topk:0.00001:f32".parse().unwrap();
    let mut dev = cuda::compress::DeviceCompressor::new(&c, n, false).unwrap();
    let sent = dev.encode(&c.upload(&grad).unwrap(), &codec).unwrap();
    assert_eq!(sent.header.num_entries, k as u64);
    let host = Encoder::new(
        CompressOptions {
            min_values: 0,
            ..CompressOptions::new(codec)
        },
        0,
    )
    .encode(&grad)
    .to_vec()
    .unwrap();
    assert_eq!(sent.to_vec().unwrap(), host);
}

/// The kernels compile with NVRTC alone, for every architecture from Turing to Hopper: no GPU
/// needed, only libnvrtc on the loader's path. The test command installs one
/// (scripts/nvrtc.sh) and sets PS_REQUIRE_NVRTC=1, which makes a missing NVRTC a failure;
/// elsewhere the test says it was skipped.
#[test]
fn kernels_compile_with_nvrtc() {
    for cc in [(7, 5), (8, 0), (8, 6), (8, 9), (9, 0)] {
        match cuda::compile_kernels(cc) {
            Ok(ptx) => {
                let src = ptx.to_src();
                for name in [
                    "softmax_xent",
                    "compact_above",
                    "write_sparse",
                    "select_bin",
                ] {
                    assert!(
                        src.contains(&format!(".entry {name}(")),
                        "sm_{}{}: no kernel {name} in the PTX",
                        cc.0,
                        cc.1
                    );
                }
            }
            Err(e)
                if e.contains("was not found")
                    && std::env::var("PS_REQUIRE_NVRTC").as_deref() != Ok("1") =>
            {
                eprintln!("skipped: {e} (set PS_REQUIRE_NVRTC=1 to require it)");
                return;
            }
            Err(e) => panic!("sm_{}{}: {e}", cc.0, cc.1),
        }
    }
}

/// A loader's panic becomes its message (the probe's "why"); a panic of another thread meanwhile
/// is still a panic there.
#[test]
fn a_loader_panic_becomes_its_message() {
    let r: Result<(), String> = cuda::catch_quietly(|| panic!("symbol cuFoo not found"));
    assert_eq!(r.unwrap_err(), "symbol cuFoo not found");
    let r: Result<(), String> = cuda::catch_quietly(|| std::panic::panic_any(3u8));
    assert_eq!(r.unwrap_err(), "unknown");
    assert_eq!(cuda::catch_quietly(|| 7), Ok(7));
    let other = cuda::catch_quietly(|| std::thread::spawn(|| panic!("elsewhere")).join());
    assert!(
        matches!(other, Ok(Err(_))),
        "the other thread's panic is its own"
    );
}

#[test]
fn device_choice_parses_and_selects_or_says_why() {
    use cuda::{DeviceChoice, Selected, select};

    assert_eq!("auto".parse(), Ok(DeviceChoice::Auto));
    assert_eq!("cpu".parse(), Ok(DeviceChoice::Cpu));
    assert_eq!("cuda".parse(), Ok(DeviceChoice::Cuda(0)));
    assert_eq!("cuda:3".parse(), Ok(DeviceChoice::Cuda(3)));
    assert!("gpu".parse::<DeviceChoice>().is_err());
    for d in [DeviceChoice::Auto, DeviceChoice::Cpu, DeviceChoice::Cuda(2)] {
        assert_eq!(d.to_string().parse(), Ok(d));
    }
    assert!(matches!(select(DeviceChoice::Cpu), Ok(Selected::Cpu)));
    match cuda::probe(0) {
        // No GPU: auto falls back to the CPU, asking for CUDA is an error naming the device
        // (unless the run asked for a GPU: then its absence fails the run).
        Err(e) => {
            assert!(
                std::env::var("PS_REQUIRE_GPU").as_deref() != Ok("1"),
                "PS_REQUIRE_GPU=1 but CUDA is unusable here: {e}"
            );
            assert!(matches!(select(DeviceChoice::Auto), Ok(Selected::Cpu)));
            let e = select(DeviceChoice::Cuda(0)).unwrap_err();
            assert!(e.starts_with("--device cuda:0: "), "{e}");
        }
        Ok(_) => {
            assert!(matches!(select(DeviceChoice::Auto), Ok(Selected::Cuda(_))));
            let e = select(DeviceChoice::Cuda(4096)).unwrap_err();
            assert!(e.contains("no CUDA device 4096"), "{e}");
        }
    }
}
