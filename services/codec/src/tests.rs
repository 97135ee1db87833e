use proptest::prelude::*;

use super::*;
use crate::codec::{DEFAULT_BLOCK, DEFAULT_LEVELS};

fn encoder(codec: Codec) -> Encoder {
    Encoder::new(
        CompressOptions {
            error_feedback: true,
            codec,
            min_values: 0,
            lz4: Lz4Policy::default(),
        },
        7,
    )
}

fn round_trip(codec: Codec, values: &[f32]) -> (Encoded, Vec<f32>) {
    let e = encoder(codec).encode(values);
    e.header.check(e.data.len()).unwrap();
    let back = e.to_vec().unwrap();
    (e, back)
}

fn values(
    max: f32,
    len: impl Into<proptest::sample::SizeRange>,
) -> impl Strategy<Value = Vec<f32>> {
    proptest::collection::vec(-max..max, len)
}

fn lossy_codecs() -> impl Strategy<Value = Codec> {
    prop_oneof![
        Just(Codec::F16),
        Just(Codec::Bf16),
        (1u32..64).prop_map(|block| Codec::Int8 { block }),
        (1u32..64).prop_map(|block| Codec::Int4 { block }),
        (1u32..64).prop_map(|block| Codec::Sign { block }),
        (1u32..20, 1u32..64).prop_map(|(levels, block)| Codec::Qsgd { levels, block }),
        (0.01f64..1.0).prop_map(|ratio| Codec::TopK {
            ratio,
            values: SparseValues::F32
        }),
        (0.01f64..1.0).prop_map(|ratio| Codec::TopK {
            ratio,
            values: SparseValues::F16
        }),
        (0.01f64..1.0).prop_map(|ratio| Codec::RandomK {
            ratio,
            values: SparseValues::F32
        }),
    ]
}

proptest! {
    #[test]
    fn f32_is_exact(v in proptest::collection::vec(any::<f32>(), 0..300)) {
        let (_, back) = round_trip(Codec::F32, &v);
        prop_assert_eq!(bytemuck::cast_slice::<f32, u32>(&back), bytemuck::cast_slice::<f32, u32>(&v));
    }

    /// fp16 keeps 11 significant bits: relative error at most 2^-11 in the normal range, absolute
    /// at most 2^-25 below it.
    #[test]
    fn f16_error_is_bounded(v in values(60000.0, 0..300)) {
        let (e, back) = round_trip(Codec::F16, &v);
        prop_assert_eq!(e.header.raw_len, 2 * v.len() as u64);
        for (x, y) in v.iter().zip(&back) {
            prop_assert!((x - y).abs() <= (x.abs() * 2f32.powi(-11)).max(2f32.powi(-25)), "{x} -> {y}");
        }
    }

    /// bf16 keeps 8 significant bits, rounded to nearest even exactly as `half` does it.
    #[test]
    fn bf16_rounds_to_nearest_even(v in proptest::collection::vec(any::<f32>(), 0..300)) {
        let (_, back) = round_trip(Codec::Bf16, &v);
        for (x, y) in v.iter().zip(&back) {
            let want = half::bf16::from_f32(*x).to_f32();
            if x.is_nan() {
                prop_assert!(y.is_nan());
            } else {
                prop_assert_eq!(y.to_bits(), want.to_bits(), "{}", x);
                if x.abs() >= f32::MIN_POSITIVE && y.is_finite() {
                    prop_assert!((x - y).abs() <= x.abs() * 2f32.powi(-8));
                }
            }
        }
    }

    /// int8: every value within half a step (block max / 127 / 2) of the input.
    #[test]
    fn int8_error_is_half_a_step(v in values(1e3, 0..600), block in 1u32..200) {
        let (_, back) = round_trip(Codec::Int8 { block }, &v);
        for (src, dst) in v.chunks(block as usize).zip(back.chunks(block as usize)) {
            let step = src.iter().fold(0f32, |m, x| m.max(x.abs())) / 127.0;
            for (x, y) in src.iter().zip(dst) {
                // Half a step, plus the f32 rounding of q * scale (one ulp of the value).
                prop_assert!((x - y).abs() <= step * 0.5 * (1.0 + 1e-5) + x.abs() * f32::EPSILON + 1e-30, "{x} -> {y}, step {step}");
            }
        }
    }

    /// int4: every value within half a step (block max / 7 / 2) of the input, two codes a
    /// byte; decoding what the encoder wrote never fails, whatever the block's alignment.
    #[test]
    fn int4_error_is_half_a_step(v in values(1e3, 0..600), block in 1u32..200) {
        let (e, back) = round_trip(Codec::Int4 { block }, &v);
        prop_assert_eq!(e.header.raw_len, (4 * v.len().div_ceil(block as usize) + v.len().div_ceil(2)) as u64);
        for (src, dst) in v.chunks(block as usize).zip(back.chunks(block as usize)) {
            let step = src.iter().fold(0f32, |m, x| m.max(x.abs())) / 7.0;
            for (x, y) in src.iter().zip(dst) {
                prop_assert!((x - y).abs() <= step * 0.5 * (1.0 + 1e-5) + x.abs() * f32::EPSILON + 1e-30, "{x} -> {y}, step {step}");
            }
        }
    }

    /// Scaled sign: each value decodes to its sign times the mean magnitude of its block.
    #[test]
    fn sign_is_sign_times_mean_magnitude(v in values(10.0, 0..600), block in 1u32..200) {
        let (e, back) = round_trip(Codec::Sign { block }, &v);
        prop_assert!(e.header.raw_len <= (4 * v.len().div_ceil(block as usize) + v.len().div_ceil(8)) as u64);
        for (src, dst) in v.chunks(block as usize).zip(back.chunks(block as usize)) {
            let mean = (src.iter().map(|x| f64::from(x.abs())).sum::<f64>() / src.len() as f64) as f32;
            for (x, y) in src.iter().zip(dst) {
                prop_assert_eq!(*y, if x.is_sign_negative() { -mean } else { mean });
            }
        }
    }

    /// QSGD: each value decodes to a level next to its exact position on the norm's grid.
    #[test]
    fn qsgd_rounds_to_a_neighbouring_level(v in values(10.0, 1..600), block in 1u32..200, levels in 1u32..=MAX_LEVELS) {
        let (_, back) = round_trip(Codec::Qsgd { levels, block }, &v);
        for (src, dst) in v.chunks(block as usize).zip(back.chunks(block as usize)) {
            let norm = src.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt() as f32;
            let unit = norm / levels as f32;
            for (x, y) in src.iter().zip(dst) {
                prop_assert!((x - y).abs() <= unit * (1.0 + 1e-4) + 1e-30, "{x} -> {y}, unit {unit}");
                prop_assert!(*y == 0.0 || y.signum() == x.signum());
            }
        }
    }

    /// Top-k keeps exactly the k largest magnitudes, at their own positions, and zeros the rest.
    #[test]
    fn top_k_keeps_the_k_largest(v in values(100.0, 1..2000), ratio in 0.001f64..1.0) {
        let (e, back) = round_trip(Codec::TopK { ratio, values: SparseValues::F32 }, &v);
        let k = Codec::entries(ratio, v.len());
        prop_assert_eq!(e.header.num_entries, k as u64);
        let kept: Vec<usize> = (0..v.len()).filter(|&i| back[i] != 0.0).collect();
        for &i in &kept {
            prop_assert_eq!(back[i], v[i]);
        }
        let mut want: Vec<u32> = v.iter().map(|x| x.abs().to_bits()).collect();
        want.sort_unstable_by(|a, b| b.cmp(a));
        let mut got: Vec<u32> = sparse::top_k(&v, k).iter().map(|&i| v[i as usize].abs().to_bits()).collect();
        got.sort_unstable_by(|a, b| b.cmp(a));
        prop_assert_eq!(&got[..], &want[..k]);
    }

    #[test]
    fn random_k_sends_k_exact_values(v in values(100.0, 1..2000), ratio in 0.001f64..1.0) {
        let (e, back) = round_trip(Codec::RandomK { ratio, values: SparseValues::F32 }, &v);
        let k = Codec::entries(ratio, v.len());
        prop_assert_eq!(e.header.num_entries, k as u64);
        for (x, y) in v.iter().zip(&back) {
            prop_assert!(*y == 0.0 || y == x);
        }
    }

    /// The error-feedback invariant: after any sequence of steps, what was sent plus what is
    /// still owed equals the sum of the gradients.
    #[test]
    fn error_feedback_conserves_the_gradient(
        codec in lossy_codecs(),
        steps in proptest::collection::vec(values(5.0, 40..=40), 1..12),
    ) {
        let mut enc = encoder(codec);
        let mut ef = ErrorFeedback::default();
        let mut sent = vec![0.0f64; 40];
        let mut total = vec![0.0f64; 40];
        for g in &steps {
            let e = ef.compress(&mut enc, g).unwrap();
            for (s, d) in sent.iter_mut().zip(e.to_vec().unwrap()) {
                *s += f64::from(d);
            }
            for (t, x) in total.iter_mut().zip(g) {
                *t += f64::from(*x);
            }
        }
        let scale: f64 = steps.iter().flatten().map(|x| f64::from(x.abs())).sum::<f64>() / 40.0 + 1.0;
        for i in 0..40 {
            let lhs = sent[i] + f64::from(ef.residual()[i]);
            prop_assert!((lhs - total[i]).abs() <= 1e-5 * scale * steps.len() as f64, "{i}: {lhs} vs {}", total[i]);
        }
    }

    /// The same per embedding row, with duplicate ids in a push, and with room for fewer rows
    /// than are pushed: what each row was sent, still owes and had dropped to make room for
    /// another is what it was given, and the residuals never hold more rows than allowed.
    #[test]
    fn row_error_feedback_conserves_each_row(
        codec in lossy_codecs(),
        max_rows in 1usize..8,
        steps in proptest::collection::vec(proptest::collection::vec((0u64..6, values(5.0, 4..=4)), 1..8), 1..8),
    ) {
        let mut enc = encoder(codec);
        let mut ef = RowErrorFeedback::bounded(4, max_rows);
        let mut sent = [[0.0f64; 4]; 6];
        let mut total = [[0.0f64; 4]; 6];
        for step in &steps {
            let ids: Vec<u64> = step.iter().map(|(id, _)| *id).collect();
            let grads: Vec<f32> = step.iter().flat_map(|(_, g)| g.iter().copied()).collect();
            let e = ef.compress(&mut enc, &ids, &grads).unwrap();
            prop_assert!(ef.len() <= max_rows, "{} rows held, {max_rows} allowed", ef.len());
            for (id, row) in ids.iter().zip(e.to_vec().unwrap().chunks(4)) {
                for j in 0..4 {
                    sent[*id as usize][j] += f64::from(row[j]);
                }
            }
            for (id, g) in step {
                for j in 0..4 {
                    total[*id as usize][j] += f64::from(g[j]);
                }
            }
        }
        prop_assert_eq!(ef.dropped.len() as u64, ef.evicted());
        if max_rows >= 6 {
            prop_assert_eq!(ef.evicted(), 0);
        }
        for (id, row) in &ef.dropped {
            for j in 0..4 {
                sent[*id as usize][j] += f64::from(row[j]);
            }
        }
        for id in 0..6u64 {
            for j in 0..4 {
                let owed = ef.residual(id).map_or(0.0, |r| f64::from(r[j]));
                let lhs = sent[id as usize][j] + owed;
                prop_assert!((lhs - total[id as usize][j]).abs() <= 1e-4 * (1.0 + total[id as usize][j].abs()) * steps.len() as f64,
                    "row {id}[{j}]: {lhs} vs {}", total[id as usize][j]);
            }
        }
    }

    /// Any header with any bytes: a clean error or a decode, never a panic.
    #[test]
    fn decoding_arbitrary_bytes_never_panics(
        enc in 0usize..8,
        num_values in 0u64..3000,
        block_size in 0u32..300,
        levels in 0u32..300,
        num_entries in 0u64..200,
        lz in any::<bool>(),
        raw_len in 0u64..12000,
        data in proptest::collection::vec(any::<u8>(), 0..4000),
    ) {
        let header = Header {
            encoding: Encoding::ALL[enc],
            num_values,
            block_size,
            levels,
            num_entries,
            compression: if lz { Compression::Lz4 } else { Compression::None },
            raw_len,
        };
        let mut out = vec![0.0f32; num_values as usize];
        let _ = header.check(data.len());
        let _ = decode(&header, &data, &mut out);
        let _ = Encoded { header, data: data.into() }.decode_add(&mut out, 1.0);
    }

    /// Valid payloads with one byte changed: a clean error or a decode, never a panic.
    #[test]
    fn corrupted_payloads_never_panic(codec in lossy_codecs(), v in values(3.0, 1..500), at in any::<usize>(), byte in any::<u8>()) {
        let e = encoder(codec).encode(&v);
        let mut data = e.data.to_vec();
        let i = at % data.len().max(1);
        if let Some(b) = data.get_mut(i) {
            *b = byte;
        }
        let mut out = vec![0.0f32; v.len()];
        let _ = decode(&e.header, &data, &mut out);
    }

    /// A sparse payload over rows, compacted to the rows it touches, decodes to the same rows;
    /// every row left out decoded to zeros, and no row kept is all zeros. Dense encodings
    /// carry every row and are not compacted.
    #[test]
    fn compacted_rows_decode_to_the_same_rows(
        codec in lossy_codecs(),
        (dim, v) in (1usize..9, 1usize..60)
            .prop_flat_map(|(dim, rows)| (Just(dim), values(10.0, rows * dim))),
    ) {
        let e = encoder(codec).encode(&v);
        let full = e.to_vec().unwrap();
        let Some((kept, compact)) = e.rows_carried(dim).unwrap() else {
            prop_assert!(!e.header.encoding.is_sparse());
            return Ok(());
        };
        prop_assert!(kept.windows(2).all(|w| w[0] < w[1]));
        prop_assert_eq!(compact.header.num_entries, e.header.num_entries);
        compact.header.check(compact.data.len()).unwrap();
        let back = compact.to_vec().unwrap();
        prop_assert_eq!(back.len(), kept.len() * dim);
        for (r, row) in full.chunks_exact(dim).enumerate() {
            match kept.binary_search(&r) {
                Ok(rank) => {
                    prop_assert_eq!(&back[rank * dim..(rank + 1) * dim], row);
                    prop_assert!(compact.indices().unwrap().unwrap().iter().any(|&i| i / dim == rank));
                }
                Err(_) => prop_assert!(row.iter().all(|&x| x == 0.0)),
            }
        }
    }

    #[test]
    fn codec_text_round_trips(codec in lossy_codecs()) {
        let back: Codec = codec.to_string().parse().unwrap();
        prop_assert_eq!(back, codec);
    }
}

/// QSGD is unbiased: the mean of many independently seeded encodings is the input.
#[test]
fn qsgd_is_unbiased() {
    let v: Vec<f32> = (0..64)
        .map(|i| ((i * 37 % 23) as f32 - 11.0) / 7.0)
        .collect();
    let (levels, block) = (4u32, 64u32);
    let trials = 4000u32;
    let mut mean = vec![0.0f64; v.len()];
    for seed in 0..trials {
        let e = Encoder::new(
            CompressOptions {
                error_feedback: true,
                codec: Codec::Qsgd { levels, block },
                min_values: 0,
                lz4: Lz4Policy {
                    enabled: false,
                    ..Lz4Policy::default()
                },
            },
            u64::from(seed),
        )
        .encode(&v);
        for (m, d) in mean.iter_mut().zip(e.to_vec().unwrap()) {
            *m += f64::from(d) / f64::from(trials);
        }
    }
    let norm = v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    // One decode is within one level (norm / levels) of the input: its standard deviation is at
    // most half of that, so the mean of `trials` is within 5 sigma of the input.
    let tol = 5.0 * (norm / f64::from(levels)) * 0.5 / f64::from(trials).sqrt();
    for (x, m) in v.iter().zip(&mean) {
        assert!(
            (f64::from(*x) - m).abs() <= tol,
            "{x} vs mean {m} (tolerance {tol})"
        );
    }
}

/// The sampled-threshold path of top-k gives exactly what full selection gives.
#[test]
fn sampled_top_k_is_exact() {
    use rand::Rng;
    let mut rng =
        <rand_xoshiro::Xoshiro256PlusPlus as rand_xoshiro::rand_core::SeedableRng>::seed_from_u64(
            3,
        );
    let n = 600_000;
    let v: Vec<f32> = (0..n)
        .map(|_| rng.random_range(-1.0f32..1.0).powi(3))
        .collect();
    for k in [1, 17, 6000, 60_000] {
        let got = sparse::top_k(&v, k);
        assert_eq!(got.len(), k);
        assert!(
            got.windows(2).all(|w| w[0] < w[1]),
            "ascending and distinct"
        );
        let mut keys: Vec<u32> = v.iter().map(|x| x.abs().to_bits()).collect();
        keys.sort_unstable_by(|a, b| b.cmp(a));
        let threshold = keys[k - 1];
        assert!(
            got.iter()
                .all(|&i| v[i as usize].abs().to_bits() >= threshold)
        );
    }
    // A vector of equal magnitudes: any k of them, still exactly k.
    let flat = vec![0.5f32; n];
    assert_eq!(sparse::top_k(&flat, 5000).len(), 5000);
}

/// lz4 goes on where it pays (a sparse payload's small gaps, int8 of a vector with many zeros)
/// and stays off random mantissas.
#[test]
fn lz4_is_adaptive() {
    use rand::Rng;
    let mut rng =
        <rand_xoshiro::Xoshiro256PlusPlus as rand_xoshiro::rand_core::SeedableRng>::seed_from_u64(
            1,
        );
    let noise: Vec<f32> = (0..100_000).map(|_| rng.random::<f32>() - 0.5).collect();
    let e = encoder(Codec::F32).encode(&noise);
    assert_eq!(e.header.compression, Compression::None);
    let mut mostly_zero = vec![0.0f32; 100_000];
    for i in (0..100_000).step_by(97) {
        mostly_zero[i] = noise[i];
    }
    for codec in [
        Codec::F32,
        Codec::Int8 {
            block: DEFAULT_BLOCK,
        },
    ] {
        let e = encoder(codec).encode(&mostly_zero);
        assert_eq!(e.header.compression, Compression::Lz4, "{codec}");
        assert!(
            e.data.len() < mostly_zero.len(),
            "{codec}: {} bytes",
            e.data.len()
        );
        let back = e.to_vec().unwrap();
        if codec == Codec::F32 {
            assert_eq!(back, mostly_zero);
        }
    }
    // Off when the policy says so.
    let mut off = Encoder::new(
        CompressOptions {
            error_feedback: true,
            codec: Codec::F32,
            min_values: 0,
            lz4: Lz4Policy {
                enabled: false,
                ..Lz4Policy::default()
            },
        },
        0,
    );
    assert_eq!(
        off.encode(&mostly_zero).header.compression,
        Compression::None
    );
}

#[test]
fn small_payloads_go_as_f32() {
    let mut enc = Encoder::new(CompressOptions::new(Codec::Sign { block: 8 }), 0);
    assert_eq!(enc.encode(&[1.0; 10]).header.encoding, Encoding::F32);
    assert_eq!(enc.encode(&[1.0; 5000]).header.encoding, Encoding::Sign);
}

/// A NaN in a block is not quantized away: it reaches the receiver as NaN.
#[test]
fn non_finite_values_survive_quantization() {
    let mut v = vec![0.5f32; 100];
    v[42] = f32::NAN;
    v[7] = f32::INFINITY;
    for codec in [
        Codec::F16,
        Codec::Bf16,
        Codec::Int8 { block: 32 },
        Codec::Int4 { block: 32 },
        Codec::Sign { block: 32 },
        Codec::Qsgd {
            levels: DEFAULT_LEVELS,
            block: 32,
        },
        Codec::TopK {
            ratio: 0.05,
            values: SparseValues::F16,
        },
    ] {
        let back = encoder(codec).encode(&v).to_vec().unwrap();
        assert!(back.iter().any(|x| x.is_nan()), "{codec} lost the NaN");
    }
}

fn decode_err(header: Header, data: Vec<u8>) -> String {
    let mut out = vec![0.0; header.num_values as usize];
    decode(&header, &data, &mut out).unwrap_err().to_string()
}

/// Each kind of malformed payload is refused with what was wrong.
#[test]
fn malformed_payloads_say_what_is_wrong() {
    let sparse = |k: u64, data: Vec<u8>| {
        decode_err(
            Header {
                encoding: Encoding::SparseF32,
                num_values: 10,
                num_entries: k,
                ..Header::default()
            },
            data,
        )
    };
    let mut one = 1.0f32.to_le_bytes().to_vec();
    one.push(10); // index 10 of 10 values
    assert!(
        sparse(1, one.clone()).contains("index 10 is out of range"),
        "{}",
        sparse(1, one)
    );
    let mut trailing = 1.0f32.to_le_bytes().to_vec();
    trailing.extend([3, 0]);
    assert!(sparse(1, trailing).contains("follow the last"));
    let mut long = 1.0f32.to_le_bytes().to_vec();
    long.extend([0x80; 5]);
    assert!(sparse(1, long).contains("malformed"));
    assert!(sparse(11, vec![0; 60]).contains("more than the 10 values"));

    let blocked = |encoding, levels, data: Vec<u8>| {
        decode_err(
            Header {
                encoding,
                num_values: 4,
                block_size: 4,
                levels,
                ..Header::default()
            },
            data,
        )
    };
    let mut neg = (-1.0f32).to_le_bytes().to_vec();
    neg.extend([0; 4]);
    assert!(blocked(Encoding::Int8, 0, neg).contains("never negative"));
    // int4: 4 values in 2 bytes after the scale; -8 is never written.
    let mut m8 = 1.0f32.to_le_bytes().to_vec();
    m8.extend([0x17, 0x80]);
    assert!(blocked(Encoding::Int4, 0, m8).contains("the code -8"));
    let mut short4 = 1.0f32.to_le_bytes().to_vec();
    short4.push(0x11);
    assert!(blocked(Encoding::Int4, 0, short4).contains("need 6 bytes"));
    let odd = |data: Vec<u8>| {
        decode_err(
            Header {
                encoding: Encoding::Int4,
                num_values: 3,
                block_size: 3,
                ..Header::default()
            },
            data,
        )
    };
    let mut pad4 = 1.0f32.to_le_bytes().to_vec();
    pad4.extend([0x11, 0x11]);
    assert!(odd(pad4).contains("padding"));
    let mut pad = 1.0f32.to_le_bytes().to_vec();
    pad.push(0xf0);
    assert!(blocked(Encoding::Sign, 0, pad).contains("padding"));
    // levels 2 needs 3-bit codes; level 3 is above it.
    let mut lvl = 1.0f32.to_le_bytes().to_vec();
    lvl.extend([0b011, 0]);
    assert!(blocked(Encoding::Qsgd, 2, lvl).contains("above the 2 levels"));
    assert!(blocked(Encoding::Qsgd, 0, vec![0; 6]).contains("levels 0"));
    let e = decode_err(
        Header {
            encoding: Encoding::Int8,
            num_values: 4,
            block_size: 0,
            ..Header::default()
        },
        vec![0; 8],
    );
    assert!(e.contains("block_size 0"), "{e}");

    let lz = |raw_len, data| {
        decode_err(
            Header {
                encoding: Encoding::F32,
                num_values: 4,
                compression: Compression::Lz4,
                raw_len,
                ..Header::default()
            },
            data,
        )
    };
    assert!(
        lz(16, vec![0xff; 8]).starts_with("lz4"),
        "{}",
        lz(16, vec![0xff; 8])
    );
    assert!(lz(12, vec![0; 4]).contains("raw_len 12"));
    let short = lz4::compress(&[0u8; 12]);
    assert!(lz(16, short).starts_with("lz4"));
    assert!(decode_err(Header::f32(3), vec![0; 8]).contains("need 12 bytes"));
}

#[test]
fn codec_text_forms() {
    assert_eq!(
        "topk:0.01".parse::<Codec>().unwrap(),
        Codec::TopK {
            ratio: 0.01,
            values: SparseValues::F16
        }
    );
    assert_eq!(
        "qsgd".parse::<Codec>().unwrap(),
        Codec::Qsgd {
            levels: DEFAULT_LEVELS,
            block: DEFAULT_BLOCK
        }
    );
    assert_eq!(
        "int8:64".parse::<Codec>().unwrap(),
        Codec::Int8 { block: 64 }
    );
    assert!(
        "topk"
            .parse::<Codec>()
            .unwrap_err()
            .to_string()
            .contains("needs a ratio")
    );
    assert!("topk:2".parse::<Codec>().is_err());
    assert!("int8:0".parse::<Codec>().is_err());
    assert!(
        "zstd"
            .parse::<Codec>()
            .unwrap_err()
            .to_string()
            .contains("unknown codec")
    );
    assert!("fp16:3".parse::<Codec>().is_err());
    let json = serde_json::to_string(&Codec::Int8 { block: 64 }).unwrap();
    assert_eq!(
        serde_json::from_str::<Codec>(&json).unwrap(),
        Codec::Int8 { block: 64 }
    );
}

/// Top-k of 1% with delta-varint indices and fp16 values is more than 80 times smaller than f32.
#[test]
fn top_k_one_percent_is_over_80x_smaller() {
    use rand::Rng;
    let mut rng =
        <rand_xoshiro::Xoshiro256PlusPlus as rand_xoshiro::rand_core::SeedableRng>::seed_from_u64(
            5,
        );
    let v: Vec<f32> = (0..1_000_000).map(|_| rng.random::<f32>() - 0.5).collect();
    let e = encoder(Codec::TopK {
        ratio: 0.01,
        values: SparseValues::F16,
    })
    .encode(&v);
    let ratio = (v.len() * 4) as f64 / e.data.len() as f64;
    assert!(ratio > 80.0, "only {ratio:.1}x");
}

/// A sparse payload names exactly the positions it carries: those a decode writes, and they
/// are the largest magnitudes for top-k. A dense encoding carries every position.
#[test]
fn a_sparse_payload_names_the_positions_it_carries() {
    let v: Vec<f32> = (0..200).map(|i| ((i * 37) % 101) as f32 - 50.0).collect();
    let e = encoder(Codec::TopK {
        ratio: 0.05,
        values: SparseValues::F32,
    })
    .encode(&v);
    let idx = e.indices().unwrap().expect("a sparse payload");
    assert_eq!(idx.len(), 10);
    assert!(idx.windows(2).all(|w| w[0] < w[1]));
    let decoded = e.to_vec().unwrap();
    let written: Vec<usize> = (0..v.len()).filter(|&i| decoded[i] != 0.0).collect();
    assert_eq!(idx, written);
    let smallest_sent = idx
        .iter()
        .map(|&i| v[i].abs())
        .fold(f32::INFINITY, f32::min);
    assert!(
        (0..v.len())
            .filter(|i| !idx.contains(i))
            .all(|i| v[i].abs() <= smallest_sent)
    );
    assert_eq!(encoder(Codec::F16).encode(&v).indices().unwrap(), None);
}

/// With room for two rows, a new row takes the slot of the one not used since the CLOCK hand
/// last passed, and the row used in between keeps its residual.
#[test]
fn a_bounded_row_feedback_drops_the_idle_row() {
    let mut enc = encoder(Codec::TopK {
        ratio: 0.25,
        values: SparseValues::F32,
    });
    let mut ef = RowErrorFeedback::bounded(4, 2);
    let row = [1.0, 2.0, 3.0, 4.0];
    ef.compress(&mut enc, &[10], &row).unwrap();
    ef.compress(&mut enc, &[11], &row).unwrap();
    // Row 10 pushed again: used since the hand passed; row 11 is not.
    ef.compress(&mut enc, &[10], &row).unwrap();
    ef.compress(&mut enc, &[12], &row).unwrap();
    assert_eq!(ef.len(), 2);
    assert_eq!(ef.evicted(), 1);
    assert!(ef.residual(11).is_none());
    assert!(ef.residual(10).is_some() && ef.residual(12).is_some());
    // A push of more rows than there is room for keeps what fits and drops no row of its own
    // for another of its own.
    let ids = [20, 21, 22];
    let grads: Vec<f32> = ids.iter().flat_map(|_| row).collect();
    ef.compress(&mut enc, &ids, &grads).unwrap();
    assert_eq!(ef.len(), 2);
    assert!(ef.residual(20).is_some() && ef.residual(21).is_some());
    assert!(ef.residual(22).is_none());
    assert_eq!(RowErrorFeedback::rows_in(1 << 20, 32), (1 << 20) / 169);
}

#[test]
fn non_finite_checks_tell_every_kind_of_value_apart() {
    let finite = [
        0.0,
        -0.0,
        f32::MIN_POSITIVE,
        f32::from_bits(1), // the smallest subnormal
        -f32::from_bits(0x007f_ffff),
        f32::MAX,
        f32::MIN,
        1.0,
        -3.5e-20,
    ];
    let non_finite = [
        f32::NAN,
        -f32::NAN,
        f32::from_bits(0x7f80_0001), // a signalling NaN
        f32::from_bits(0xffff_ffff),
        f32::INFINITY,
        f32::NEG_INFINITY,
    ];
    assert!(!quant::any_non_finite(&finite));
    let bytes = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
    assert_eq!(quant::first_non_finite_le(&bytes(&finite)), None);
    assert!(!quant::any_non_finite_le(&bytes(&finite)));
    // A value cut short is not looked at: only whole values count.
    assert!(!quant::any_non_finite_le(&bytes(&[1.0, f32::NAN])[..7]));
    // Aligned bytes are checked as f32 values, others four bytes at a time: both find every
    // value.
    let mut shifted = vec![0u8; 3 + 4 * (finite.len() + 1)];
    for bad in non_finite {
        for at in 0..=finite.len() {
            let mut v = finite.to_vec();
            v.insert(at, bad);
            let b = bytes(&v);
            for start in 0..4 {
                let s = &mut shifted[start..start + b.len()];
                s.copy_from_slice(&b);
                assert!(quant::any_non_finite_le(s), "{bad} at {at}, offset {start}");
                assert!(
                    !quant::any_non_finite_le(&s[..4 * at]),
                    "{at}, offset {start}"
                );
            }
        }
    }
    for bad in non_finite {
        for at in [0, 4, finite.len()] {
            let mut v = finite.to_vec();
            v.insert(at, bad);
            assert!(quant::any_non_finite(&v), "{bad} at {at}");
            assert_eq!(quant::first_non_finite_le(&bytes(&v)), Some(at), "{bad}");
            assert!(quant::any_non_finite_le(&bytes(&v)), "{bad} at {at}");
        }
    }
}

/// int4's layout, byte for byte: the scale (max abs / 7), then two's-complement codes, the
/// first value of each pair in the low half; a block may start in the middle of a byte.
#[test]
fn int4_layout_is_as_documented() {
    let e = encoder(Codec::Int4 { block: 3 }).encode(&[7.0, -7.0, 3.0, 1.5, -2.0]);
    let mut want = 1.0f32.to_le_bytes().to_vec();
    want.extend((2.0f32 / 7.0).to_le_bytes());
    // 7, -7 (0x9); 3, then block two's 1.5 -> 5 at scale 2/7; -7 (0x9), padding.
    want.extend([0x97, 0x53, 0x09]);
    assert_eq!(e.header.encoding, Encoding::Int4);
    assert_eq!(&e.data[..], &want[..]);
    let back = e.to_vec().unwrap();
    let scale = 2.0f32 / 7.0;
    assert_eq!(back, vec![7.0, -7.0, 3.0, 5.0 * scale, -7.0 * scale]);
}

/// The parts of one payload take the codec the whole would: compressed when the whole is at
/// least `min_values`, each part however small; plain f32 when the whole is under it.
#[test]
fn parts_take_the_codec_of_their_whole() {
    let mut enc = Encoder::new(
        CompressOptions {
            codec: Codec::Int8 { block: 64 },
            min_values: 1000,
            ..CompressOptions::default()
        },
        1,
    );
    let part = vec![0.25f32; 600];
    assert_eq!(enc.encode(&part).header.encoding, Encoding::F32);
    let big = enc.for_parts_of(1200, 0, |e| e.encode(&part).header.encoding);
    assert_eq!(big, Encoding::Int8);
    let small = enc.for_parts_of(900, 0, |e| e.encode(&vec![0.25f32; 1100]).header.encoding);
    assert_eq!(small, Encoding::F32);
    // Outside, the encoder decides by each call's own length again.
    assert_eq!(enc.encode(&part).header.encoding, Encoding::F32);
    assert_eq!(
        enc.encode(&vec![0.25f32; 1100]).header.encoding,
        Encoding::Int8
    );
}
