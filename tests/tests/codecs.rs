//! Gradient codecs end to end through real shards: every encoding is applied as exactly the
//! values it decodes to, malformed payloads change nothing, error feedback in the SDK conserves
//! the gradient, pulls come back in f16 or bf16, and the wire bytes are counted.

use ps_client::{
    ClientConfig, Codec, CompressOptions, Lz4Policy, PsClient, PullCodec, SparseValues, TableCodec,
};
use ps_codec::{Encoded, Encoder};
use ps_core::payload::encoding_to_pb;
use ps_core::{Encoding, Optimizer, Payload, TableSpec};
use ps_proto::v1 as pb;
use ps_proto::v1::parameter_server_client::ParameterServerClient;
use ps_tests::TestCluster;

/// Every codec, small blocks so that a few thousand values span many of them.
fn all_codecs() -> Vec<Codec> {
    vec![
        Codec::F32,
        Codec::F16,
        Codec::Bf16,
        Codec::Int8 { block: 64 },
        Codec::Int4 { block: 48 },
        Codec::Sign { block: 100 },
        Codec::Qsgd {
            levels: 7,
            block: 128,
        },
        Codec::TopK {
            ratio: 0.02,
            values: SparseValues::F32,
        },
        Codec::TopK {
            ratio: 0.02,
            values: SparseValues::F16,
        },
        Codec::RandomK {
            ratio: 0.05,
            values: SparseValues::F16,
        },
    ]
}

fn opts(codec: Codec) -> CompressOptions {
    CompressOptions {
        error_feedback: true,
        codec,
        min_values: 0,
        lz4: Lz4Policy::default(),
    }
}

/// A table's codec: pushes in `codec` with error feedback, pulls in f32.
fn pushes_in(codec: Codec) -> TableCodec {
    TableCodec {
        push: opts(codec),
        ..TableCodec::default()
    }
}

/// The codec without lz4: the bytes are the layout itself.
fn plain(codec: Codec) -> CompressOptions {
    CompressOptions {
        lz4: Lz4Policy {
            enabled: false,
            ..Lz4Policy::default()
        },
        ..opts(codec)
    }
}

/// A dense table of chunks of 1,000 values under SGD.
fn dense_sgd(name: &str, shape: &[u64], lr: f32) -> TableSpec {
    TableSpec::dense(name, shape)
        .unwrap()
        .with_chunk_elems(1000)
        .unwrap()
        .with_optimizer(Optimizer::sgd(lr))
        .unwrap()
}

/// An embedding table of rows of `dim` values under SGD.
fn sparse_sgd(name: &str, dim: u32, lr: f32) -> TableSpec {
    TableSpec::sparse(name, dim)
        .unwrap()
        .with_optimizer(Optimizer::sgd(lr))
        .unwrap()
}

fn gradient(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let x = (i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 8;
            (x as f32 / (1u32 << 24) as f32 - 0.5) * 2.0
        })
        .collect()
}

fn push_id(seq: u64) -> Option<pb::PushId> {
    Some(pb::PushId {
        client_id: 77,
        seq,
        min_unacked_seq: 0,
    })
}

/// A push in each encoding (and with lz4 where it pays) through raw gRPC, as any client would
/// send it: under SGD with learning rate 1 from zeros, the table then holds exactly minus the
/// decoded values, for a dense and a sparse table.
#[tokio::test]
async fn each_encoding_is_applied_as_its_decoded_values() {
    let cluster = TestCluster::start(1).await;
    let ps = cluster.client().await;
    let mut raw = ParameterServerClient::connect(cluster.endpoints[0].clone())
        .await
        .unwrap()
        .max_decoding_message_size(usize::MAX);
    let n = 3000;
    let mut seq = 1;
    for (t, codec) in all_codecs().into_iter().enumerate() {
        for lz4 in [false, true] {
            let name = format!("d{t}{}", if lz4 { "z" } else { "" });
            let spec = dense_sgd(&name, &[n as u64], 1.0);
            ps.create_table(spec).await.unwrap();
            let mut enc = Encoder::new(
                CompressOptions {
                    lz4: Lz4Policy {
                        enabled: lz4,
                        min_saving: 0.0,
                        min_bytes: 0,
                    },
                    ..opts(codec)
                },
                t as u64,
            );
            // One payload per chunk; a sparse-ish gradient so that lz4 has something to do.
            let mut g = gradient(n, t as u32);
            for (i, v) in g.iter_mut().enumerate() {
                if i % 3 != 0 {
                    *v = 0.0;
                }
            }
            let mut expect = Vec::new();
            let mut slices = Vec::new();
            for c in 0..3 {
                let e = enc.encode(&g[c * 1000..(c + 1) * 1000]);
                expect.extend(e.to_vec().unwrap());
                slices.push(pb::DenseSlice {
                    chunk: c as u64,
                    values: Some(Payload::from(e).into()),
                });
            }
            raw.push_dense(pb::PushDenseRequest {
                table: name.clone(),
                push_id: push_id(seq),
                map_epoch: 0,
                slices,
                trace_context: Default::default(),
                authorization: String::new(),
            })
            .await
            .unwrap_or_else(|s| panic!("{codec} lz4={lz4}: {s}"));
            seq += 1;
            let w = ps.pull_dense(&name).await.unwrap();
            for (i, (got, want)) in w.iter().zip(&expect).enumerate() {
                assert_eq!(*got, -want, "{codec} lz4={lz4} value {i}");
            }
            if codec != Codec::F32 {
                assert!(
                    w.iter().zip(&g).any(|(a, b)| *a != -b),
                    "{codec}: a lossy codec should not be exact on this input"
                );
            }
        }
        // The same for embedding rows.
        let name = format!("s{t}");
        let dim = 16;
        let spec = sparse_sgd(&name, dim, 1.0);
        ps.create_table(spec).await.unwrap();
        let ids: Vec<u64> = (0..200).map(|i| i * 7 + 1).collect();
        let g = gradient(ids.len() * dim as usize, 100 + t as u32);
        let e = Encoder::new(opts(codec), 5).encode(&g);
        let expect = e.to_vec().unwrap();
        raw.push_sparse(pb::PushSparseRequest {
            table: name.clone(),
            push_id: push_id(seq),
            map_epoch: 0,
            ids: ids.clone(),
            values: Some(Payload::from(e).into()),
            clock: None,
            ..Default::default()
        })
        .await
        .unwrap_or_else(|s| panic!("sparse {codec}: {s}"));
        seq += 1;
        let w = ps.pull_sparse(&name, &ids).await.unwrap();
        for (got, want) in w.iter().zip(&expect) {
            assert_eq!(*got, -want, "sparse {codec}");
        }
    }
    cluster.stop().await;
}

/// Malformed payloads are refused with INVALID_ARGUMENT saying what was wrong, and nothing of
/// the push is applied, not even its valid slices.
#[tokio::test]
async fn malformed_payloads_change_nothing() {
    let cluster = TestCluster::start(1).await;
    let ps = cluster.client().await;
    let spec = dense_sgd("w", &[2000], 1.0);
    ps.create_table(spec).await.unwrap();
    let mut raw = ParameterServerClient::connect(cluster.endpoints[0].clone())
        .await
        .unwrap();
    let good = Payload::from_f32(&[1.0; 1000]);
    let topk = Encoder::new(
        plain(Codec::TopK {
            ratio: 0.01,
            values: SparseValues::F32,
        }),
        0,
    )
    .encode(&gradient(1000, 3));
    const INVALID: &str = "INVALID_FIELD";
    const UNDECODABLE: &str = "UNDECODABLE_PAYLOAD";
    const VALUES: &str = "slices[1].values";
    const DATA: &str = "slices[1].values.data";
    // Corruptions, one row each: the ErrorInfo reason, the field it names, and words of the
    // message. A header that cannot hold its data is refused when the request is read
    // (INVALID_FIELD); data that does not decode as its header says, when it is decoded.
    let mut cases: Vec<(pb::Payload, &str, &str, &str)> = Vec::new();
    let mut p: pb::Payload = Payload::from(topk.clone()).into();
    let mut data = p.data.to_vec();
    // The last gap becomes two bytes of large value: it jumps past the end.
    data.pop();
    data.extend([0xff, 0x7f]);
    p.data = data.into();
    cases.push((p, UNDECODABLE, VALUES, "out of range"));
    let mut p: pb::Payload = Payload::from(topk.clone()).into();
    p.num_entries += 1;
    cases.push((p, INVALID, DATA, "11 sparse_f32 entries need"));
    let int8 = Encoder::new(plain(Codec::Int8 { block: 100 }), 0).encode(&gradient(1000, 4));
    let mut p: pb::Payload = Payload::from(int8.clone()).into();
    let mut data = p.data.to_vec();
    data[..4].copy_from_slice(&(-2.0f32).to_le_bytes());
    p.data = data.into();
    cases.push((p, UNDECODABLE, VALUES, "never negative"));
    let mut p: pb::Payload = Payload::from(int8).into();
    p.block_size = 99;
    cases.push((p, INVALID, DATA, "1000 int8 values need 1044 bytes"));
    // int4: a code of -8, which is never written (after 10 scales, the first codes' byte).
    let int4 = Encoder::new(plain(Codec::Int4 { block: 100 }), 0).encode(&gradient(1000, 6));
    let mut p: pb::Payload = Payload::from(int4).into();
    let mut data = p.data.to_vec();
    data[40] = 0x81;
    p.data = data.into();
    cases.push((p, UNDECODABLE, VALUES, "the code -8"));
    let mut p: pb::Payload = good.clone().into();
    p.compression = pb::Compression::Lz4 as i32;
    p.raw_len = 4000;
    cases.push((p, UNDECODABLE, VALUES, "lz4"));
    let mut p: pb::Payload = good.clone().into();
    p.encoding = 42;
    cases.push((p, INVALID, "slices[1].values.encoding", "unknown encoding"));
    let mut p: pb::Payload = Payload::from(
        Encoder::new(
            plain(Codec::Qsgd {
                levels: 3,
                block: 1000,
            }),
            0,
        )
        .encode(&gradient(1000, 5)),
    )
    .into();
    p.levels = 0;
    cases.push((p, INVALID, DATA, "levels 0"));
    for (i, (bad, reason, field, words)) in cases.into_iter().enumerate() {
        let status = raw
            .push_dense(pb::PushDenseRequest {
                table: "w".into(),
                push_id: push_id(i as u64 + 1),
                map_epoch: 0,
                slices: vec![
                    pb::DenseSlice {
                        chunk: 0,
                        values: Some(good.clone().into()),
                    },
                    pb::DenseSlice {
                        chunk: 1,
                        values: Some(bad),
                    },
                ],
                trace_context: Default::default(),
                authorization: String::new(),
            })
            .await
            .unwrap_err();
        assert_eq!(
            status.code(),
            tonic::Code::InvalidArgument,
            "case {i}: {status:?}"
        );
        let info = tonic_types::StatusExt::get_details_error_info(&status).expect("error details");
        assert_eq!(
            (info.reason.as_str(), info.metadata["field"].as_str()),
            (reason, field),
            "case {i}: {}",
            status.message()
        );
        assert!(
            status.message().contains(words),
            "case {i}: {}",
            status.message()
        );
    }
    assert!(ps.pull_dense("w").await.unwrap().iter().all(|v| *v == 0.0));
    let stats = ps.stats().await.unwrap();
    assert_eq!(stats[0].pushes_applied, 0);
    cluster.stop().await;
}

/// Through the SDK with error feedback: after any number of lossy pushes, what the shards
/// applied plus what the client still owes is the sum of the gradients, for dense tensors over
/// two shards and for embedding rows.
#[tokio::test]
async fn sdk_error_feedback_conserves_the_gradient() {
    let cluster = TestCluster::start(2).await;
    let ps = cluster.client().await;
    let lr = 0.5f32;
    for (t, codec) in all_codecs().into_iter().enumerate().skip(1) {
        let name = format!("w{t}");
        let spec = dense_sgd(&name, &[40, 100], lr);
        ps.create_table(spec).await.unwrap();
        ps.set_table_codec(&name, pushes_in(codec)).unwrap();
        let mut total = vec![0.0f64; 4000];
        for step in 0..6 {
            let g = gradient(4000, step * 31 + t as u32);
            for (a, b) in total.iter_mut().zip(&g) {
                *a += f64::from(*b);
            }
            ps.push_dense(&name, &g).await.unwrap();
        }
        let w = ps.pull_dense(&name).await.unwrap();
        let owed = ps.dense_residual(&name).unwrap();
        assert_eq!(owed.len(), 4000);
        let mut err = 0.0f64;
        for i in 0..4000 {
            let sent = -f64::from(w[i]) / f64::from(lr);
            err = err.max((sent + f64::from(owed[i]) - total[i]).abs());
        }
        assert!(
            err < 1e-4,
            "{codec}: sent + owed is off the gradient sum by {err}"
        );
        if matches!(
            codec,
            Codec::TopK { .. } | Codec::RandomK { .. } | Codec::Sign { .. }
        ) {
            assert!(
                owed.iter().any(|v| *v != 0.0),
                "{codec} should owe something"
            );
        }
    }
    // Embedding rows: per-row residuals.
    let spec = sparse_sgd("emb", 8, lr);
    ps.create_table(spec).await.unwrap();
    ps.set_table_codec(
        "emb",
        pushes_in(Codec::TopK {
            ratio: 0.1,
            values: SparseValues::F32,
        }),
    )
    .unwrap();
    let ids: Vec<u64> = (0..50).collect();
    let mut total = vec![0.0f64; 50 * 8];
    for step in 0..5 {
        // A batch that repeats some ids: the shard sums them, the residual is per row.
        let batch: Vec<u64> = ids.iter().map(|i| (i * (step + 1)) % 50).collect();
        let g = gradient(batch.len() * 8, step as u32);
        for (p, id) in batch.iter().enumerate() {
            for j in 0..8 {
                total[*id as usize * 8 + j] += f64::from(g[p * 8 + j]);
            }
        }
        ps.push_sparse("emb", &batch, &g).await.unwrap();
    }
    let w = ps.pull_sparse("emb", &ids).await.unwrap();
    for id in 0..50u64 {
        let owed = ps.row_residual("emb", id).unwrap().unwrap_or(vec![0.0; 8]);
        for (j, o) in owed.iter().enumerate() {
            let i = id as usize * 8 + j;
            let sent = -f64::from(w[i]) / f64::from(lr);
            assert!(
                (sent + f64::from(*o) - total[i]).abs() < 1e-4,
                "row {id}[{j}]: {sent} + {o} vs {}",
                total[i]
            );
        }
    }
    assert_eq!(ps.row_residuals("emb").unwrap().1, 0, "nothing dropped");
    // Under fp16 and bf16 rows keep no residual (rounding loses at most half a unit in the
    // last place): what lands is the rounded gradient. Under int8 they do.
    for (t, codec) in [Codec::F16, Codec::Bf16, Codec::Int8 { block: 8 }]
        .into_iter()
        .enumerate()
    {
        let name = format!("rows{t}");
        ps.create_table(sparse_sgd(&name, 8, 1.0)).await.unwrap();
        let mut opts = CompressOptions::new(codec);
        opts.min_values = 1;
        ps.set_table_codec(
            &name,
            TableCodec {
                push: opts,
                ..TableCodec::default()
            },
        )
        .unwrap();
        assert_eq!(opts.keeps_row_residual(), t == 2, "{codec}");
        let g = gradient(50 * 8, 7 + t as u32);
        ps.push_sparse(&name, &ids, &g).await.unwrap();
        let (held, _) = ps.row_residuals(&name).unwrap();
        let w = ps.pull_sparse(&name, &ids).await.unwrap();
        let err = w
            .iter()
            .zip(&g)
            .map(|(w, g)| (w + g).abs() / g.abs().max(1e-3))
            .fold(0.0f32, f32::max);
        if t < 2 {
            assert_eq!(held, 0, "{codec}: no row residual");
            assert!(err > 0.0 && err < 1e-2, "{codec}: rounded by {err}");
        } else {
            assert!(held > 0, "{codec}: rows owe what rounding dropped");
        }
    }
    // A client with room for fewer rows than it pushes holds no more than that, counts the
    // rows it dropped, and its pushes still go through.
    let mut cfg = ClientConfig::new(cluster.endpoints.clone());
    cfg.row_residual_mib = 1;
    let small = PsClient::connect(cfg).await.unwrap();
    small
        .set_table_codec(
            "emb",
            pushes_in(Codec::TopK {
                ratio: 0.1,
                values: SparseValues::F32,
            }),
        )
        .unwrap();
    let room = ps_codec::RowErrorFeedback::rows_in(1 << 20, 8);
    let many: Vec<u64> = (1000..1000 + room as u64 + 5000).collect();
    for chunk in many.chunks(4096) {
        let g = gradient(chunk.len() * 8, chunk[0] as u32);
        small.push_sparse("emb", chunk, &g).await.unwrap();
    }
    let (held, dropped) = small.row_residuals("emb").unwrap();
    assert!(held <= room, "{held} rows held, room for {room}");
    assert!(dropped >= 5000, "{dropped} dropped");
    cluster.stop().await;
}

/// A top-k push of rows sends only the rows it has an entry for, with their ids: under
/// momentum, a row sent with a zero gradient would still move, and the rows left out do not.
/// What the rows sent carry lands on the right ids, on either shard.
#[tokio::test]
async fn a_top_k_row_push_sends_only_the_rows_it_has_entries_for() {
    let cluster = TestCluster::start(2).await;
    let ps = cluster.client().await;
    let dim = 8;
    let spec = TableSpec::sparse("m", dim as u32)
        .unwrap()
        .with_optimizer(Optimizer::momentum(1.0, 0.9))
        .unwrap();
    ps.create_table(spec).await.unwrap();
    let ids: Vec<u64> = (0..400u64).map(|i| i * 7919 + 3).collect();
    // A first push in f32 gives every row a velocity.
    let first = vec![0.01f32; ids.len() * dim];
    let s = ps.push_sparse("m", &ids, &first).await.unwrap();
    assert_eq!(s.rows, ids.len() as u64);
    let before = ps.pull_sparse("m", &ids).await.unwrap();
    // Top-k 5%: about 80 entries on each shard, nearly all of them taken by the 20 rows of
    // large gradients; the others' gradients wait in the residual.
    ps.set_table_codec(
        "m",
        pushes_in(Codec::TopK {
            ratio: 0.05,
            values: SparseValues::F32,
        }),
    )
    .unwrap();
    let big: Vec<usize> = (0..20).map(|r| r * 19).collect();
    let mut g = vec![1e-4f32; ids.len() * dim];
    for &r in &big {
        for (j, v) in g[r * dim..(r + 1) * dim].iter_mut().enumerate() {
            *v = 1.0 + j as f32;
        }
    }
    let s = ps.push_sparse("m", &ids, &g).await.unwrap();
    assert_eq!(s.raw_bytes, (ids.len() * dim * 4) as u64);
    let after = ps.pull_sparse("m", &ids).await.unwrap();
    let mut sent_rows = 0u64;
    for (r, &id) in ids.iter().enumerate() {
        let at = r * dim..(r + 1) * dim;
        let (b, a, gr) = (&before[at.clone()], &after[at.clone()], &g[at]);
        let owed = ps.row_residual("m", id).unwrap().unwrap_or(vec![0.0; dim]);
        if owed == gr {
            assert_eq!(a, b, "row {r} had no entry: not sent, so it does not move");
            assert!(!big.contains(&r), "row {r} of large gradients was left out");
            continue;
        }
        sent_rows += 1;
        // Sent: the velocity 0.9 * 0.01 plus what was sent moves every value of the row.
        for j in 0..dim {
            let want = b[j] - (0.9 * 0.01 + (gr[j] - owed[j]));
            assert!(
                (a[j] - want).abs() < 1e-5,
                "row {r}[{j}]: {} vs {want}",
                a[j]
            );
        }
    }
    assert_eq!(
        s.rows, sent_rows,
        "the push sent the rows with an entry, no more"
    );
    assert!((20..=30).contains(&sent_rows), "{sent_rows} rows sent");
    assert_eq!(s.applied_values, sent_rows * dim as u64);
    // A push of 1,500 rows of one value is over the codec's 1,024 values, though its part for
    // each shard is under it: every part is compressed as the whole push would be (1% of
    // each part's values, about 8 rows), none sent whole in f32.
    ps.create_table(sparse_sgd("w1", 1, 1.0)).await.unwrap();
    ps.set_table_codec(
        "w1",
        pushes_in(Codec::TopK {
            ratio: 0.01,
            values: SparseValues::F32,
        }),
    )
    .unwrap();
    let wide: Vec<u64> = (0..1500u64).map(|i| i * 7919 + 5).collect();
    let s = ps
        .push_sparse("w1", &wide, &gradient(wide.len(), 11))
        .await
        .unwrap();
    assert!((2..=30).contains(&s.rows), "{} rows of 1500 sent", s.rows);
    cluster.stop().await;
}

/// A sparsity warm-up moves a top-k table's ratio while training: each push then changes as
/// many values as the ratio of the moment says, and no gradient is lost across the change
/// (sent plus owed is still the sum). Codecs without a ratio, and ratios outside (0, 1], are
/// refused and change nothing.
#[tokio::test]
async fn a_push_ratio_moved_while_training_keeps_the_residual() {
    let cluster = TestCluster::start(2).await;
    let ps = cluster.client().await;
    let lr = 0.5f32;
    ps.create_table(dense_sgd("w", &[4, 1000], lr))
        .await
        .unwrap();
    let topk = |ratio| Codec::TopK {
        ratio,
        values: SparseValues::F32,
    };
    ps.set_table_codec(
        "w",
        TableCodec {
            push: plain(topk(0.02)),
            ..TableCodec::default()
        },
    )
    .unwrap();
    let mut total = vec![0.0f64; 4000];
    let mut before = ps.pull_dense("w").await.unwrap();
    for (step, ratio) in [0.25, 0.1, 0.02, 0.02, 0.5].into_iter().enumerate() {
        ps.set_push_ratio("w", ratio).unwrap();
        assert_eq!(ps.table_codec("w").unwrap().push.codec, topk(ratio));
        let g = gradient(4000, step as u32 * 17 + 3);
        for (a, b) in total.iter_mut().zip(&g) {
            *a += f64::from(*b);
        }
        let summary = ps.push_dense("w", &g).await.unwrap();
        let after = ps.pull_dense("w").await.unwrap();
        let changed: Vec<usize> = (0..4000).filter(|&i| before[i] != after[i]).collect();
        // Top-k works per chunk of 1,000 values.
        assert_eq!(
            changed.len(),
            4 * Codec::entries(ratio, 1000),
            "ratio {ratio}"
        );
        // The client says which positions it sent: exactly those the shards changed.
        assert_eq!(summary.sent.as_deref(), Some(changed.as_slice()));
        before = after;
    }
    let owed = ps.dense_residual("w").unwrap();
    for i in 0..4000 {
        let sent = -f64::from(before[i]) / f64::from(lr);
        assert!(
            (sent + f64::from(owed[i]) - total[i]).abs() < 1e-4,
            "[{i}]: sent {sent} + owed {} vs {}",
            owed[i],
            total[i]
        );
    }
    for bad in [0.0, 1.5, f64::NAN] {
        let e = ps.set_push_ratio("w", bad).unwrap_err();
        assert!(e.to_string().contains("ratio"), "{e}");
    }
    assert_eq!(ps.table_codec("w").unwrap().push.codec, topk(0.5));
    ps.create_table(dense_sgd("dense", &[10], lr))
        .await
        .unwrap();
    let summary = ps.push_dense("dense", &[1.0; 10]).await.unwrap();
    assert_eq!(summary.sent, None, "a dense codec sends every position");
    let e = ps.set_push_ratio("dense", 0.1).unwrap_err();
    assert!(e.to_string().contains("no ratio"), "{e}");
    assert_eq!(ps.table_codec("dense").unwrap().push.codec, Codec::F32);
    assert_eq!(ps.dense_residual("w").unwrap(), owed);
    cluster.stop().await;
}

/// Pulls asked for in f16 or bf16 come back as the stored values rounded to that format, for
/// dense and sparse tables; the wire bytes of pushes and pulls are counted by encoding.
#[tokio::test]
async fn pulls_in_half_precision_and_wire_metrics() {
    let metrics = ps_runtime::metrics::install("ps-tests").unwrap();
    let cluster = TestCluster::start(2).await;
    let ps = cluster.client().await;
    let spec = dense_sgd("h", &[5000], 1.0);
    ps.create_table(spec).await.unwrap();
    let g = gradient(5000, 9);
    ps.push_dense("h", &g).await.unwrap();
    let exact = ps.pull_dense("h").await.unwrap();
    let emb = sparse_sgd("he", 4, 1.0);
    ps.create_table(emb).await.unwrap();
    let ids: Vec<u64> = (0..100).collect();
    ps.push_sparse("he", &ids, &g[..400]).await.unwrap();
    let exact_rows = ps.pull_sparse("he", &ids).await.unwrap();
    for pull in [Encoding::F16, Encoding::Bf16] {
        for table in ["h", "he"] {
            ps.set_table_codec(
                table,
                TableCodec {
                    pull: if pull == Encoding::F16 {
                        PullCodec::F16
                    } else {
                        PullCodec::Bf16
                    },
                    ..TableCodec::default()
                },
            )
            .unwrap();
        }
        let round = |v: f32| match pull {
            Encoding::F16 => half::f16::from_f32(v).to_f32(),
            _ => half::bf16::from_f32(v).to_f32(),
        };
        let got = ps.pull_dense("h").await.unwrap();
        for (a, b) in got.iter().zip(&exact) {
            assert_eq!(a.to_bits(), round(*b).to_bits(), "{pull}");
        }
        let rows = ps.pull_sparse("he", &ids).await.unwrap();
        for (a, b) in rows.iter().zip(&exact_rows) {
            assert_eq!(a.to_bits(), round(*b).to_bits(), "{pull}");
        }
    }
    // int8 (int4): a byte (half a byte) a value and a scale per block (256 values of a dense
    // table; 8 rows of dim 4 of a sparse one), each value within half its block's step of the
    // shard's: the block's largest magnitude / 127 (/ 7).
    for (pull, levels, codes) in [(PullCodec::Int8, 127.0, 5400), (PullCodec::Int4, 7.0, 2700)] {
        for table in ["h", "he"] {
            ps.set_table_codec(
                table,
                TableCodec {
                    pull,
                    ..TableCodec::default()
                },
            )
            .unwrap();
        }
        let (wire_before, _) = ps.pulled_bytes();
        let got = ps.pull_dense("h").await.unwrap();
        let rows = ps.pull_sparse("he", &ids).await.unwrap();
        let (wire_after, _) = ps.pulled_bytes();
        // A dense block lies within its chunk (1000 values); a sparse one holds 8 rows of one
        // shard's request, any of the 100: bound each value by its chunk's or the rows'
        // largest.
        for (got, exact, span) in [(&got, &exact, 1000), (&rows, &exact_rows, 400)] {
            for (g, e) in got.chunks(span).zip(exact.chunks(span)) {
                let half_step = e.iter().fold(0f32, |m, v| m.max(v.abs())) / levels / 2.0;
                for (a, b) in g.iter().zip(e) {
                    assert!(
                        (a - b).abs() <= half_step * 1.0001,
                        "{pull}: {a} against {b}"
                    );
                }
            }
            assert_ne!(got, exact, "{pull} rounds");
        }
        // 5000 + 400 values' codes and their scales (20 dense blocks: each of the shards'
        // chunks starts its own; 13 sparse ones at most, as the rows split by shard).
        let wire = wire_after - wire_before;
        assert!(
            (codes + 20 * 4..=codes + 40 * 4).contains(&wire),
            "{pull}: {wire} bytes pulled"
        );
    }
    // A pull may not ask for a gradient codec that is not a pull encoding.
    let mut raw = ParameterServerClient::connect(cluster.endpoints[0].clone())
        .await
        .unwrap();
    let status = raw
        .pull_dense(pb::PullDenseRequest {
            table: "h".into(),
            chunks: vec![0],
            accept: encoding_to_pb(Encoding::Sign) as i32,
            map_epoch: 0,
            delta: None,
            trace_context: Default::default(),
            authorization: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    let text = metrics.render();
    for want in [
        "ps_wire_bytes_total{direction=\"push\",table=\"h\",encoding=\"f32\"}",
        "ps_wire_bytes_total{direction=\"pull\",table=\"h\",encoding=\"f16\"}",
        "ps_wire_bytes_total{direction=\"pull\",table=\"he\",encoding=\"bf16\"}",
        "ps_client_wire_bytes_total{direction=\"push\",table=\"h\",codec=\"f32\"}",
    ] {
        assert!(text.contains(want), "{want} missing from:\n{text}");
    }
    // What the pulls asked with, per table: together, what the client says it sent.
    let asked = |table: &str| -> u64 {
        let series = format!("ps_client_pull_request_bytes_total{{table=\"{table}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(series.as_str()))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("{series}missing from:\n{text}"))
    };
    let (dense, rows) = (asked("h"), asked("he"));
    assert!(dense > 0 && rows >= 100, "{dense} and {rows} bytes asked");
    assert_eq!(dense + rows, ps.pull_request_bytes());
    cluster.stop().await;
}

/// The compressed pushes of a job are far smaller on the wire than f32, and training still
/// moves the parameters where dense pushes move them.
#[tokio::test]
async fn top_k_with_feedback_tracks_dense_sgd() {
    let cluster = TestCluster::start(2).await;
    let ps = cluster.client().await;
    let n = 20_000usize;
    for name in ["dense", "topk"] {
        let spec = dense_sgd(name, &[n as u64], 0.005);
        ps.create_table(spec).await.unwrap();
    }
    ps.set_table_codec(
        "topk",
        pushes_in(Codec::TopK {
            ratio: 0.01,
            values: SparseValues::F16,
        }),
    )
    .unwrap();
    // Minimise |w - target|^2 from both tables; the gradient is w - target.
    let target = gradient(n, 1);
    for _ in 0..300 {
        for name in ["dense", "topk"] {
            let w = ps.pull_dense(name).await.unwrap();
            let g: Vec<f32> = w.iter().zip(&target).map(|(a, b)| a - b).collect();
            ps.push_dense(name, &g).await.unwrap();
        }
    }
    let dist = |w: &[f32]| {
        w.iter()
            .zip(&target)
            .map(|(a, b)| f64::from(a - b).powi(2))
            .sum::<f64>()
            .sqrt()
    };
    let start = dist(&vec![0.0; n]);
    let dense = dist(&ps.pull_dense("dense").await.unwrap());
    let topk = dist(&ps.pull_dense("topk").await.unwrap());
    eprintln!("distance to target from {start:.2}: dense {dense:.3}, top-k 1% {topk:.3}");
    // Dense: 0.995^300 = 0.22 of the start.
    assert!(
        dense < start * 0.25,
        "dense SGD converges: {dense} of {start}"
    );
    // 1% of the coordinates per step: each is sent about every 100 steps with all that is owed
    // to it (lr x delay = 0.5 < 1 keeps it stable), so it keeps up with dense SGD.
    assert!(
        topk < start * 0.4,
        "top-k with error feedback converges: {topk} of {start}"
    );
    let e: Encoded = Encoder::new(
        opts(Codec::TopK {
            ratio: 0.01,
            values: SparseValues::F16,
        }),
        0,
    )
    .encode(&target);
    assert!(
        e.data.len() * 80 < n * 4,
        "1% top-k is over 80x smaller than f32"
    );
    cluster.stop().await;
}

/// Compressed pushes (top-k and fp16 dense, fp16 rows) go by the shards' bulk streams, their
/// values in the calls' headers, one bulk call per request: the tables end as the same
/// pushes through gRPC leave them, bit for bit; fp16 dense pulls and sparse pulls come that
/// way too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compressed_pushes_go_by_the_bulk_stream_as_grpc_would_apply_them() {
    let cluster = TestCluster::start(2).await;
    let by_bulk = cluster.client().await;
    let mut cfg = ClientConfig::new(cluster.endpoints.clone());
    cfg.bulk = false;
    let by_grpc = PsClient::connect(cfg).await.unwrap();
    let n = 3_000usize;
    let dim = 8u32;
    let ids: Vec<u64> = (0..200).map(|i| i * 7919).collect();
    let topk = Codec::TopK {
        ratio: 0.05,
        values: SparseValues::F16,
    };
    for (ps, suffix) in [(&by_bulk, "b"), (&by_grpc, "g")] {
        for (name, codec) in [("topk", topk), ("fp16", Codec::F16)] {
            let table = format!("{name}_{suffix}");
            ps.create_table(dense_sgd(&table, &[n as u64], 0.5))
                .await
                .unwrap();
            ps.set_table_codec(&table, pushes_in(codec)).unwrap();
        }
        // Rows in fp16: top-k picks its rows per shard's request, and the two tables' names
        // spread the ids over the shards differently.
        let rows = format!("rows_{suffix}");
        ps.create_table(sparse_sgd(&rows, dim, 0.5)).await.unwrap();
        ps.set_table_codec(&rows, pushes_in(Codec::F16)).unwrap();
    }
    let bulk_calls = async || -> u64 {
        by_bulk
            .stats()
            .await
            .unwrap()
            .iter()
            .map(|s| s.bulk_calls)
            .sum()
    };
    let before = bulk_calls().await;
    let mut requests = 0;
    for step in 0..5 {
        let g = gradient(n, 10 + step);
        let rows = gradient(ids.len() * dim as usize, 20 + step);
        for (ps, suffix) in [(&by_bulk, "b"), (&by_grpc, "g")] {
            let mut sent = Vec::new();
            for name in ["topk", "fp16"] {
                sent.push(
                    ps.push_dense(&format!("{name}_{suffix}"), &g)
                        .await
                        .unwrap(),
                );
            }
            sent.push(
                ps.push_sparse(&format!("rows_{suffix}"), &ids, &rows)
                    .await
                    .unwrap(),
            );
            if suffix == "b" {
                requests += sent.iter().map(|s| s.requests).sum::<u64>();
            }
        }
    }
    // Every request by the bulk stream: each shard's chunks of a dense table, each shard's rows.
    assert!(requests >= 5 * 3, "{requests} requests");
    assert_eq!(bulk_calls().await - before, requests);
    for name in ["topk", "fp16"] {
        let b = by_bulk.pull_dense(&format!("{name}_b")).await.unwrap();
        let g = by_grpc.pull_dense(&format!("{name}_g")).await.unwrap();
        assert!(b == g, "{name}: the bulk stream's pushes applied otherwise");
        assert!(b.iter().any(|v| *v != 0.0));
    }
    // Sparse pulls come by the bulk stream: one call to each shard, answered as gRPC answers.
    let before = bulk_calls().await;
    let b = by_bulk.pull_sparse_f32("rows_b", &ids).await.unwrap();
    assert_eq!(bulk_calls().await - before, 2);
    let g = by_grpc.pull_sparse_f32("rows_g", &ids).await.unwrap();
    assert!(b == g, "rows: the bulk stream's pushes applied otherwise");
    // Pulls in fp16 come by the bulk stream too (three chunks of 1,000 values over two
    // shards: one call to each), answered as gRPC answers them.
    for (ps, table) in [(&by_bulk, "topk_b"), (&by_grpc, "topk_g")] {
        let codec = TableCodec {
            pull: PullCodec::F16,
            ..pushes_in(topk)
        };
        ps.set_table_codec(table, codec).unwrap();
    }
    let before = bulk_calls().await;
    let b = by_bulk.pull_dense("topk_b").await.unwrap();
    assert_eq!(bulk_calls().await - before, 2);
    assert!(b == by_grpc.pull_dense("topk_g").await.unwrap());
    let exact = by_bulk.pull_dense_f32("topk_b").await.unwrap();
    assert!(b != exact, "fp16 rounds the values");
    assert!(
        b.iter()
            .zip(&exact)
            .all(|(h, f)| (h - f).abs() <= f.abs() / 1000.0)
    );
    cluster.stop().await;
}

/// Delta pulls: the first pull of a chunk comes whole, later ones bring the top-k of the change
/// since the last pull (each by the bulk stream), and a client's copy converges to the table's
/// values; a client that
/// lost its copy (same id, fresh state) gets whole chunks again, never a change against a
/// replica it does not hold.
#[tokio::test]
async fn delta_pulls_converge_and_resync() {
    let cluster = TestCluster::start(2).await;
    let writer = cluster.client().await;
    // Chunks above 2,048 values: smaller ones come as their whole change (the next test).
    let spec = dense_sgd("m", &[6000], 1.0).with_chunk_elems(3000).unwrap();
    writer.create_table(spec).await.unwrap();
    let reader_cfg = || {
        let mut cfg = ClientConfig::new(cluster.endpoints.clone());
        cfg.client_id = Some(4242);
        cfg.codec = TableCodec {
            pull: PullCodec::DeltaTopK { ratio: 0.1 },
            ..TableCodec::default()
        };
        cfg
    };
    let reader = PsClient::connect(reader_cfg()).await.unwrap();
    let bulk_calls = async || -> u64 {
        let stats = writer.stats().await.unwrap();
        stats.iter().map(|s| s.bulk_calls).sum()
    };
    writer.push_dense("m", &gradient(6000, 1)).await.unwrap();
    let exact = writer.pull_dense("m").await.unwrap();
    assert_eq!(
        reader.pull_dense("m").await.unwrap(),
        exact,
        "first pull: whole chunks"
    );
    let mut last_gap = f32::MAX;
    for round in 0..3 {
        writer
            .push_dense("m", &gradient(6000, 10 + round))
            .await
            .unwrap();
        let exact = writer.pull_dense("m").await.unwrap();
        let gap = |got: &[f32]| {
            got.iter()
                .zip(&exact)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max)
        };
        // Delta pulls go by the bulk stream: each one bulk call per shard it asks.
        let calls = bulk_calls().await;
        let first = reader.pull_dense("m").await.unwrap();
        let per_pull = bulk_calls().await - calls;
        assert!(per_pull >= 1, "a delta pull by the bulk stream");
        assert!(gap(&first) > 0.0, "10% of a change is not all of it");
        let mut got = first;
        let calls = bulk_calls().await;
        for _ in 0..40 {
            got = reader.pull_dense("m").await.unwrap();
        }
        assert_eq!(bulk_calls().await - calls, 40 * per_pull);
        last_gap = gap(&got);
        assert!(
            last_gap < 1e-5,
            "round {round}: the copy converges, gap {last_gap}"
        );
    }
    assert!(last_gap < 1e-5);
    // The same client id with no copy: whole chunks, exact.
    let fresh = PsClient::connect(reader_cfg()).await.unwrap();
    assert_eq!(
        fresh.pull_dense("m").await.unwrap(),
        writer.pull_dense("m").await.unwrap()
    );
    cluster.stop().await;
}

/// A delta pull of a small chunk (at most 2,048 values) brings all of its change in fp16
/// rather than its top-k: every value moves at once, to within fp16's rounding of the change,
/// and the rounding owed comes with the next pull.
#[tokio::test]
async fn a_small_chunk_comes_as_its_whole_change() {
    let cluster = TestCluster::start(1).await;
    let writer = cluster.client().await;
    let n = 512;
    writer
        .create_table(dense_sgd("b", &[n], 1.0))
        .await
        .unwrap();
    let mut cfg = ClientConfig::new(cluster.endpoints.clone());
    cfg.codec = TableCodec {
        pull: PullCodec::DeltaTopK { ratio: 0.02 },
        ..TableCodec::default()
    };
    let reader = PsClient::connect(cfg).await.unwrap();
    writer
        .push_dense("b", &gradient(n as usize, 1))
        .await
        .unwrap();
    let before = reader.pull_dense("b").await.unwrap();
    assert_eq!(
        before,
        writer.pull_dense("b").await.unwrap(),
        "first pull: whole"
    );
    let g = gradient(n as usize, 2);
    writer.push_dense("b", &g).await.unwrap();
    let exact = writer.pull_dense("b").await.unwrap();
    let got = reader.pull_dense("b").await.unwrap();
    let moved = got.iter().zip(&before).filter(|(a, b)| a != b).count();
    assert!(
        moved > n as usize * 9 / 10,
        "{moved} of {n} values moved (2% top-k would move about 10)"
    );
    for ((got, exact), g) in got.iter().zip(&exact).zip(&g) {
        assert!(
            (got - exact).abs() <= g.abs() / 1000.0 + 1e-7,
            "{got} against {exact}: more than fp16's rounding of the change {g}"
        );
    }
    let again = reader.pull_dense("b").await.unwrap();
    let gap = again
        .iter()
        .zip(&exact)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(
        gap < 1e-6,
        "the rounding owed came with the next pull: gap {gap}"
    );
    cluster.stop().await;
}

/// The link emulator sits in the client's transport: a push and a pull of 400 KB through a
/// 1 MB/s link each take at least 0.4 s (the bucket sleeps for the bytes of the request and of
/// the answer), and what arrives is unchanged.
#[tokio::test]
async fn an_emulated_link_paces_the_transfers() {
    let cluster = TestCluster::start(1).await;
    let mut cfg = ClientConfig::new(cluster.endpoints.clone());
    cfg.link_mbps = Some(8.0);
    let ps = PsClient::connect(cfg).await.unwrap();
    let n = 100_000;
    ps.create_table(
        TableSpec::dense("link/w", &[n as u64])
            .unwrap()
            .with_optimizer(Optimizer::sgd(1.0))
            .unwrap(),
    )
    .await
    .unwrap();
    // Random mantissas: lz4 cannot shrink them, so the wire carries all 400 KB.
    let grad: Vec<f32> = (0..n).map(|i| (i as f32 * 0.618).sin()).collect();
    let t0 = std::time::Instant::now();
    let pushed = ps.push_dense("link/w", &grad).await.unwrap();
    let push_time = t0.elapsed();
    assert!(pushed.wire_bytes >= 400_000);
    let t1 = std::time::Instant::now();
    let w = ps.pull_dense("link/w").await.unwrap();
    let pull_time = t1.elapsed();
    assert!(
        push_time.as_secs_f64() >= 0.4 && pull_time.as_secs_f64() >= 0.4,
        "400 KB each way on a 1 MB/s link took {push_time:?} up and {pull_time:?} down"
    );
    let want: Vec<f32> = grad.iter().map(|g| -g).collect();
    assert_eq!(w, want);
    // Link speeds that are not positive numbers are refused.
    let mut bad = ClientConfig::new(cluster.endpoints.clone());
    bad.link_mbps = Some(0.0);
    assert!(PsClient::connect(bad).await.is_err());
    cluster.stop().await;
}

/// A dense push too small to be worth compressing on the client's link goes as plain f32
/// whatever its table's codec: at 1 Gbit/s (declared or emulated) a 2,048-value tensor
/// crosses in 0.07 ms and goes whole, a 20,000-value one is compressed; at 100 Mbit/s the
/// 2,048 values are compressed too. Without a known link only the codec's own floor counts.
/// Sparse pushes keep their codec.
#[tokio::test]
async fn a_push_under_the_links_floor_goes_as_f32() {
    assert_eq!(ps_client::push_floor(Some(1000.0)), 15_625);
    assert_eq!(ps_client::push_floor(Some(100.0)), 1_562);
    assert_eq!(ps_client::push_floor(None), 0);
    let cluster = TestCluster::start(1).await;
    let topk = Codec::TopK {
        ratio: 0.01,
        values: SparseValues::F32,
    };
    let client = |declared: Option<f64>, emulated: Option<f64>| {
        let mut cfg = ClientConfig::new(cluster.endpoints.clone());
        cfg.link_speed_mbps = declared;
        cfg.link_mbps = emulated;
        async move {
            let ps = PsClient::connect(cfg).await.unwrap();
            for t in ["floor/small", "floor/big", "floor/rows"] {
                ps.set_table_codec(t, pushes_in(topk)).unwrap();
            }
            ps
        }
    };
    let fast = client(Some(1000.0), None).await;
    let emulated = client(None, Some(1000.0)).await;
    let slow = client(Some(100.0), None).await;
    let unknown = client(None, None).await;
    fast.create_table(dense_sgd("floor/small", &[2048], 1.0))
        .await
        .unwrap();
    fast.create_table(dense_sgd("floor/big", &[20_000], 1.0))
        .await
        .unwrap();
    let small = gradient(2048, 1);
    let big = gradient(20_000, 2);
    // Whole at 1 Gbit/s, declared or emulated: the table holds all of minus each gradient,
    // and nothing is owed.
    let mut want = vec![0.0f32; 2048];
    for ps in [&fast, &emulated] {
        let pushed = ps.push_dense("floor/small", &small).await.unwrap();
        assert!(pushed.wire_bytes >= 2048 * 4, "{}", pushed.wire_bytes);
        assert!(
            ps.dense_residual("floor/small")
                .unwrap()
                .iter()
                .all(|r| *r == 0.0)
        );
        for (w, g) in want.iter_mut().zip(&small) {
            *w -= g;
        }
        assert_eq!(fast.pull_dense("floor/small").await.unwrap(), want);
    }
    // Compressed at 1 Gbit/s when big enough, and at 100 Mbit/s or with no link known when
    // over the codec's own floor: about 1% of the values go, the rest is owed.
    let pushed = fast.push_dense("floor/big", &big).await.unwrap();
    assert!(pushed.wire_bytes < 20_000, "{}", pushed.wire_bytes);
    for ps in [&slow, &unknown] {
        let pushed = ps.push_dense("floor/small", &small).await.unwrap();
        assert!(pushed.wire_bytes < 2048, "{}", pushed.wire_bytes);
        let owed = ps.dense_residual("floor/small").unwrap();
        assert!(owed.iter().filter(|r| **r != 0.0).count() > 2000);
    }
    // 400 rows of 8 values under the 1 Gbit/s floor: still top-k, the few rows it sends.
    fast.create_table(sparse_sgd("floor/rows", 8, 1.0))
        .await
        .unwrap();
    let ids: Vec<u64> = (0..400).collect();
    let pushed = fast
        .push_sparse("floor/rows", &ids, &gradient(400 * 8, 3))
        .await
        .unwrap();
    assert!(pushed.rows < 100, "{} rows sent", pushed.rows);
    // A declared speed that is not a positive number is refused.
    for bad in [0.0, f64::NAN, f64::INFINITY] {
        let mut cfg = ClientConfig::new(cluster.endpoints.clone());
        cfg.link_speed_mbps = Some(bad);
        assert!(PsClient::connect(cfg).await.is_err(), "{bad}");
    }
    cluster.stop().await;
}

/// A push the shard refused (certainly not applied) gives its part back to the residual; a
/// push whose fate is unknown (the shard went away under it: it may have been applied) does
/// not, so error feedback never sends a gradient twice.
#[tokio::test]
async fn a_refused_push_gives_its_part_back_and_one_of_unknown_fate_does_not() {
    let cluster = TestCluster::start(1).await;
    let mut cfg = ClientConfig::new(cluster.endpoints.clone());
    cfg.max_attempts = 2;
    cfg.initial_backoff = std::time::Duration::from_millis(10);
    let ps = PsClient::connect(cfg).await.unwrap();
    ps.create_table(dense_sgd("w", &[2000], 1.0)).await.unwrap();
    let topk = Codec::TopK {
        ratio: 0.01,
        values: SparseValues::F32,
    };
    ps.set_table_codec("w", pushes_in(topk)).unwrap();
    ps.push_dense("w", &gradient(2000, 1)).await.unwrap();
    let owed = ps.dense_residual("w").unwrap();

    // Refused: the table was dropped behind this client's back (it still has the spec).
    let other = cluster.client().await;
    other.drop_table("w").await.unwrap();
    let g = gradient(2000, 2);
    let e = ps.push_dense("w", &g).await.unwrap_err();
    assert_eq!(
        e.reason(),
        Some(ps_core::wire::reason::TABLE_NOT_FOUND),
        "{e}"
    );
    let want: Vec<f32> = owed.iter().zip(&g).map(|(r, g)| r + g).collect();
    assert_eq!(
        ps.dense_residual("w").unwrap(),
        want,
        "the whole part came back"
    );

    // Unknown fate: the shard is gone; the part that was sent stays out of the residual.
    other
        .create_table(dense_sgd("w", &[2000], 1.0))
        .await
        .unwrap();
    cluster.stop().await;
    let g2 = gradient(2000, 3);
    let e = ps.push_dense("w", &g2).await.unwrap_err();
    assert_eq!(e.code(), Some(tonic::Code::Unavailable), "{e}");
    let acc: Vec<f32> = want.iter().zip(&g2).map(|(r, g)| r + g).collect();
    let after = ps.dense_residual("w").unwrap();
    let sent: Vec<usize> = (0..2000).filter(|&i| after[i] != acc[i]).collect();
    // Top 1% of each chunk of 1,000: 10 each, taken out (f32 values: exactly to zero).
    assert_eq!(sent.len(), 2 * Codec::entries(0.01, 1000), "{sent:?}");
    assert!(sent.iter().all(|&i| after[i] == 0.0));
    for chunk in [0..1000, 1000..2000] {
        let (taken, kept): (Vec<usize>, Vec<usize>) =
            chunk.partition(|i| sent.binary_search(i).is_ok());
        let smallest = taken
            .iter()
            .map(|&i| acc[i].abs())
            .fold(f32::INFINITY, f32::min);
        assert!(
            kept.iter().all(|&i| acc[i].abs() <= smallest),
            "the positions taken out are their chunk's largest"
        );
    }
}

/// `push_pull_dense` pulls each request's chunks once their push is acknowledged: over two
/// shards and many small requests, every chunk it pulls holds the push itself, exactly as a
/// push then a pull would read, plain f32 in one bulk exchange per request; concurrent clients each see their own pushes; a buffer of the
/// wrong length is refused before anything is pushed; fp16 pulls come back as `pull_dense`
/// reads them, and a delta pull codec's pull follows the whole push.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_pull_dense_pulls_each_chunk_after_its_own_push() {
    let cluster = TestCluster::start(2).await;
    // Requests of at most 8 chunks of 1,000 values: each shard's 25 chunks make 4 requests,
    // 8 in all, in flight at once, so pulls of the first overlap pushes of the last.
    let mut cfg = ClientConfig::new(cluster.endpoints.clone());
    cfg.max_request_bytes = 32_000;
    let ps = PsClient::connect(cfg.clone()).await.unwrap();
    let n = 49_500; // the last chunk is short
    ps.create_table(dense_sgd("pp", &[n as u64], 1.0))
        .await
        .unwrap();
    let g1 = gradient(n, 3);
    let g2 = gradient(n, 4);
    ps.push_dense("pp", &g1).await.unwrap();
    let bulk_calls =
        async || -> u64 { ps.stats().await.unwrap().iter().map(|s| s.bulk_calls).sum() };
    let (calls, asked) = (bulk_calls().await, ps.pull_request_bytes());
    let mut out = vec![9.0f32; n];
    let summary = ps.push_pull_dense("pp", &g2, &mut out).await.unwrap();
    assert_eq!(summary.applied_values, n as u64);
    assert_eq!(summary.duplicates, 0);
    // SGD with lr 1 from zeros, bit for bit: w = (0 - g1) - g2.
    let want: Vec<f32> = g1.iter().zip(&g2).map(|(a, b)| (0.0 - a) - b).collect();
    assert!(out == want, "the pulled tensor is not the pushed one");
    // Plain f32 both ways: each request's push and pull made one bulk exchange (a
    // push-and-pull), 8 in all, and no pull request was sent.
    assert_eq!(bulk_calls().await - calls, 8);
    assert_eq!(ps.pull_request_bytes(), asked);
    assert_eq!(ps.pulled_bytes().1, n as u64 * 4);
    assert_eq!(ps.pull_dense("pp").await.unwrap(), want);

    // A buffer of another length: refused, nothing pushed, the buffer untouched.
    let mut short = vec![7.0f32; n - 1];
    let err = ps.push_pull_dense("pp", &g2, &mut short).await.unwrap_err();
    assert!(
        matches!(err, ps_client::ClientError::InvalidInput(_)),
        "{err}"
    );
    assert!(short.iter().all(|v| *v == 7.0));
    let err = ps
        .push_pull_dense("pp", &g2[1..], &mut out)
        .await
        .unwrap_err();
    assert!(
        matches!(err, ps_client::ClientError::InvalidInput(_)),
        "{err}"
    );
    assert_eq!(ps.pull_dense("pp").await.unwrap(), want);

    // Two clients at once, pushing 1 and 2 everywhere (exact in f32): after a client's k-th
    // step every value it pulled holds its own k pushes, whatever the other's did.
    ps.create_table(dense_sgd("pp2", &[n as u64], 1.0))
        .await
        .unwrap();
    let steps = 20u32;
    let clients = [1.0f32, 2.0].map(|v| {
        let cfg = cfg.clone();
        tokio::spawn(async move {
            let ps = PsClient::connect(cfg).await.unwrap();
            let grad = vec![v; n];
            let mut out = vec![0.0f32; n];
            for k in 1..=steps {
                ps.push_pull_dense("pp2", &grad, &mut out).await.unwrap();
                let own = -(k as f32) * v;
                let (lo, hi) = out
                    .iter()
                    .fold((f32::MAX, f32::MIN), |(lo, hi), &x| (lo.min(x), hi.max(x)));
                assert!(
                    hi <= own,
                    "step {k} of client {v}: a value {hi} lacks its own push"
                );
                assert!(lo >= -(steps as f32) * 3.0, "step {k}: {lo}");
            }
        })
    });
    for c in clients {
        c.await.unwrap();
    }
    assert!(
        ps.pull_dense("pp2")
            .await
            .unwrap()
            .iter()
            .all(|v| *v == -(steps as f32) * 3.0)
    );

    // Pulled in fp16: as `pull_dense` reads the tensor under the same codec.
    ps.set_table_codec(
        "pp",
        TableCodec {
            pull: PullCodec::F16,
            ..TableCodec::default()
        },
    )
    .unwrap();
    let asked = ps.pull_request_bytes();
    ps.push_pull_dense("pp", &g1, &mut out).await.unwrap();
    assert!(
        ps.pull_request_bytes() > asked,
        "fp16 pulls are asked for by themselves"
    );
    assert_eq!(out, ps.pull_dense("pp").await.unwrap());
    let exact = ps.pull_dense_f32("pp").await.unwrap();
    assert!(
        out.iter()
            .zip(&exact)
            .all(|(a, b)| *a == half::f16::from_f32(*b).to_f32())
    );

    // A delta pull codec (all of each chunk's change): the pull follows the whole push and
    // brings this client's replica to what the shards hold.
    ps.set_table_codec(
        "pp",
        TableCodec {
            pull: PullCodec::DeltaTopK { ratio: 1.0 },
            ..TableCodec::default()
        },
    )
    .unwrap();
    ps.push_pull_dense("pp", &g2, &mut out).await.unwrap();
    assert_eq!(out, ps.pull_dense_f32("pp").await.unwrap());
    cluster.stop().await;
}

/// Pulls `ids` of `table` through a client that holds rows and one that holds none, checks
/// that both got the same values bit for bit, and returns the holding client's wire bytes and
/// the rows its shards answered as unchanged.
async fn pull_beside(holding: &PsClient, plain: &PsClient, table: &str, ids: &[u64]) -> (u64, u64) {
    let (wire, _) = holding.pulled_bytes();
    let unchanged = holding.rows_unchanged();
    let got = holding.pull_sparse(table, ids).await.unwrap();
    let want = plain.pull_sparse(table, ids).await.unwrap();
    assert_eq!(
        got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        "{table}"
    );
    (
        holding.pulled_bytes().0 - wire,
        holding.rows_unchanged() - unchanged,
    )
}

/// Rows pulled in int4 (16 bytes of codes and a scale a row of 32) are held as int8's are:
/// a second pull of unchanged rows sends none of them, a changed row comes again, and every
/// value is what a client holding nothing gets.
#[tokio::test]
async fn held_rows_in_int4_come_again_only_when_changed() {
    let cluster = TestCluster::start(2).await;
    let plain = cluster.client().await;
    let mut cfg = ClientConfig::new(cluster.endpoints.clone());
    cfg.held_rows_mib = 1;
    let holding = PsClient::connect(cfg).await.unwrap();
    plain.create_table(sparse_sgd("h4", 32, 1.0)).await.unwrap();
    for c in [&plain, &holding] {
        c.set_table_codec(
            "h4",
            TableCodec {
                pull: PullCodec::Int4,
                ..TableCodec::default()
            },
        )
        .unwrap();
    }
    let ids: Vec<u64> = (0..200).map(|i| i * 6271 + 5).collect();
    plain
        .push_sparse("h4", &ids, &gradient(200 * 32, 6))
        .await
        .unwrap();
    let pull = async |ids: &[u64]| pull_beside(&holding, &plain, "h4", ids).await;
    let (first, kept) = pull(&ids).await;
    assert_eq!(kept, 0);
    assert!(
        (200 * 20..200 * 20 + 200).contains(&first),
        "{first} bytes for 200 rows"
    );
    let (again, kept) = pull(&ids).await;
    assert_eq!(kept, 200);
    assert!(again < 150, "{again} bytes for 200 unchanged rows");
    plain
        .push_sparse("h4", &ids[..30], &gradient(30 * 32, 7))
        .await
        .unwrap();
    let (after, kept) = pull(&ids).await;
    assert_eq!(kept, 170);
    assert!(
        (30 * 20..30 * 20 + 200).contains(&after),
        "{after} bytes for 30 changed rows"
    );
    cluster.stop().await;
}

/// A client that holds rows from its pulls gets again only the rows that changed, and what it
/// returns is exactly what a client holding nothing gets; rows past its memory are dropped,
/// a codec that rounds rows together holds none, and a malformed held mask is refused.
#[tokio::test]
async fn held_rows_come_again_only_when_changed() {
    let cluster = TestCluster::start(2).await;
    let plain = cluster.client().await;
    let mut cfg = ClientConfig::new(cluster.endpoints.clone());
    cfg.held_rows_mib = 1;
    let holding = PsClient::connect(cfg).await.unwrap();
    let int8 = TableCodec {
        pull: PullCodec::Int8,
        ..TableCodec::default()
    };
    plain.create_table(sparse_sgd("hr", 32, 1.0)).await.unwrap();
    plain.create_table(sparse_sgd("hw", 1, 1.0)).await.unwrap();
    for c in [&plain, &holding] {
        c.set_table_codec("hr", int8).unwrap();
        c.set_table_codec("hw", int8).unwrap();
    }
    let ids: Vec<u64> = (0..300).map(|i| i * 7919 + 3).collect();
    plain
        .push_sparse("hr", &ids, &gradient(300 * 32, 4))
        .await
        .unwrap();
    let pull = async |ids: &[u64]| pull_beside(&holding, &plain, "hr", ids).await;
    let asked = holding.pull_request_bytes();
    let (first, kept) = pull(&ids).await;
    let asked_first = holding.pull_request_bytes() - asked;
    assert_eq!(kept, 0);
    assert!(first >= 300 * 36, "{first} bytes for 300 rows");
    // Nothing changed: no row comes again. Asking for them cost a digest (8 bytes) a row
    // more, and a bit of mask.
    let asked = holding.pull_request_bytes();
    let (again, kept) = pull(&ids).await;
    let asked_again = holding.pull_request_bytes() - asked;
    assert_eq!(kept, 300);
    assert!(again < 200, "{again} bytes for 300 unchanged rows");
    assert!(
        asked_first >= 300 * 2 && (300 * 8..300 * 8 + 100).contains(&(asked_again - asked_first)),
        "pull requests of {asked_first} then {asked_again} bytes"
    );
    // 50 rows pushed: those come again, with their new values.
    plain
        .push_sparse("hr", &ids[..50], &gradient(50 * 32, 5))
        .await
        .unwrap();
    let (after, kept) = pull(&ids).await;
    assert_eq!(kept, 250);
    assert!(
        (50 * 36..50 * 36 + 200).contains(&after),
        "{after} bytes for 50 changed rows"
    );
    // Duplicates, held and new rows in one pull.
    let (_, kept) = pull(&[ids[60], ids[60], 1, ids[70]]).await;
    assert_eq!(kept, 3);
    // 1 MiB holds about 6,000 rows of 32: of 10,000 pulled twice, at most that many are kept,
    // and every value is still exact.
    let many: Vec<u64> = (0..10_000).map(|i| i * 104_729 + 11).collect();
    pull(&many).await;
    let (_, kept) = pull(&many).await;
    assert!((1000..=6500).contains(&kept), "{kept} rows kept of 10000");
    // Rows of one value share an int8 scale with their neighbours: none is held.
    holding.pull_sparse("hw", &ids).await.unwrap();
    let before = holding.rows_unchanged();
    holding.pull_sparse("hw", &ids).await.unwrap();
    assert_eq!(holding.rows_unchanged(), before);
    cluster.stop().await;
    // A mask that is not a bit per id, or digests that are not one per held row, are refused
    // (by a shard that owns every id).
    let cluster = TestCluster::start(1).await;
    cluster
        .client()
        .await
        .create_table(sparse_sgd("hr", 32, 1.0))
        .await
        .unwrap();
    let mut raw = ParameterServerClient::connect(cluster.endpoints[0].clone())
        .await
        .unwrap();
    let req = |held: Vec<u8>, digests: Vec<u64>| pb::PullSparseRequest {
        table: "hr".into(),
        ids: (0..10).collect(),
        accept: encoding_to_pb(Encoding::Int8) as i32,
        map_epoch: 0,
        held,
        held_digests: digests,
        ..Default::default()
    };
    for (held, digests, field) in [
        (vec![1], vec![7], "held"),
        (vec![1, 0], vec![], "held_digests"),
        (vec![0, 4], vec![9], "held"),
    ] {
        let status = raw
            .pull_sparse(req(held.clone(), digests))
            .await
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{held:?}");
        assert!(status.message().contains(field), "{}", status.message());
    }
    // A digest that matches nothing gets the row.
    let answer = raw
        .pull_sparse(req(vec![0b11, 0], vec![1, 2]))
        .await
        .unwrap()
        .into_inner();
    assert!(answer.unchanged.is_empty());
    assert_eq!(answer.values.unwrap().num_values, 10 * 32);
    cluster.stop().await;
}

/// Sparse tables placed alike (`TableSpec::placed_with`) are read by one request per shard
/// that sends the ids once, each table under its own pull codec and held rows, and what comes
/// back is bit for bit what pulling each on its own gets; a table placed apart is pulled on
/// its own beside them. A request that names a table placed apart, a dense table or an
/// unknown one beside its own reads nothing and says why.
#[tokio::test]
async fn tables_placed_alike_come_in_one_pull() {
    let cluster = TestCluster::start(2).await;
    let plain = cluster.client().await;
    let mut cfg = ClientConfig::new(cluster.endpoints.clone());
    cfg.held_rows_mib = 1;
    let holding = PsClient::connect(cfg).await.unwrap();
    plain.create_table(sparse_sgd("pe", 32, 1.0)).await.unwrap();
    plain
        .create_table(sparse_sgd("pw", 1, 1.0).placed_with("pe").unwrap())
        .await
        .unwrap();
    plain.create_table(sparse_sgd("px", 4, 1.0)).await.unwrap();
    plain
        .create_table(dense_sgd("pd", &[10], 1.0))
        .await
        .unwrap();
    let described = plain.describe_table("pw").await.unwrap();
    assert_eq!(
        described.placed_with.as_ref().map(|n| n.as_str()),
        Some("pe")
    );
    for c in [&plain, &holding] {
        for (t, pull) in [("pe", PullCodec::Int4), ("pw", PullCodec::Int8)] {
            c.set_table_codec(
                t,
                TableCodec {
                    pull,
                    ..TableCodec::default()
                },
            )
            .unwrap();
        }
    }
    let ids: Vec<u64> = (0..400).map(|i| i * 104_729 + 17).collect();
    plain
        .push_sparse("pe", &ids, &gradient(400 * 32, 8))
        .await
        .unwrap();
    plain
        .push_sparse("pw", &ids, &gradient(400, 9))
        .await
        .unwrap();
    plain
        .push_sparse("px", &ids, &gradient(400 * 4, 10))
        .await
        .unwrap();
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    // One pull of the three, twice (the second finds the held rows of `pe` unchanged),
    // against each table pulled on its own.
    for round in 0..2 {
        let asked = holding.pull_request_bytes();
        let unchanged = holding.rows_unchanged();
        let got = holding
            .pull_sparse_tables(&["pe", "pw", "px"], &ids)
            .await
            .unwrap();
        let asked = holding.pull_request_bytes() - asked;
        for (t, rows) in ["pe", "pw", "px"].iter().zip(&got) {
            let want = plain.pull_sparse(t, &ids).await.unwrap();
            assert_eq!(bits(rows), bits(&want), "{t}, round {round}");
        }
        // The ids go once for `pe` and `pw` together and once for `px` (a third time if `pw`
        // went on its own); the second round adds the digests (8 bytes a held row) of `pe`
        // and `px` (`pw`'s int8 rows of one value share their scales: none is held), and the
        // rest is names, masks and framing.
        let ids_bytes: u64 = ids
            .iter()
            .map(|&i| prost::encoding::encoded_len_varint(i) as u64)
            .sum();
        let digests = if round == 0 { 0 } else { 2 * 400 * 8 };
        assert!(
            (2 * ids_bytes + digests..2 * ids_bytes + digests + 300).contains(&asked),
            "round {round}: {asked} bytes asked, the ids {ids_bytes} bytes"
        );
        let kept = holding.rows_unchanged() - unchanged;
        assert_eq!(kept, if round == 0 { 0 } else { 800 }, "round {round}");
    }
    // The same request by hand: the tables' answers come in `also`, in order.
    let cluster_one = TestCluster::start(1).await;
    let one = cluster_one.client().await;
    one.create_table(sparse_sgd("pe", 32, 1.0)).await.unwrap();
    one.create_table(sparse_sgd("pw", 1, 1.0).placed_with("pe").unwrap())
        .await
        .unwrap();
    one.create_table(sparse_sgd("px", 4, 1.0)).await.unwrap();
    one.create_table(dense_sgd("pd", &[10], 1.0)).await.unwrap();
    let mut raw = ParameterServerClient::connect(cluster_one.endpoints[0].clone())
        .await
        .unwrap();
    let req = |also: &[&str]| pb::PullSparseRequest {
        table: "pe".into(),
        ids: (0..10).collect(),
        accept: encoding_to_pb(Encoding::F32) as i32,
        also: also
            .iter()
            .map(|t| pb::PullSparseAlso {
                table: (*t).into(),
                accept: encoding_to_pb(Encoding::F16) as i32,
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    };
    let answer = raw.pull_sparse(req(&["pw"])).await.unwrap().into_inner();
    assert_eq!(answer.values.unwrap().num_values, 10 * 32);
    assert_eq!(answer.also.len(), 1);
    let wide = answer.also[0].values.clone().unwrap();
    assert_eq!(
        (wide.num_values, wide.encoding),
        (10, pb::Encoding::F16 as i32)
    );
    for (also, code, says) in [
        (
            &["pw", "px"][..],
            tonic::Code::InvalidArgument,
            "not placed as",
        ),
        (&["pd"][..], tonic::Code::FailedPrecondition, "dense"),
        (&["nope"][..], tonic::Code::NotFound, "nope"),
    ] {
        let status = raw.pull_sparse(req(also)).await.unwrap_err();
        assert_eq!(status.code(), code, "{also:?}: {status:?}");
        assert!(
            status.message().contains(says),
            "{also:?}: {}",
            status.message()
        );
    }
    let stats = one.stats().await.unwrap();
    let pulls = |t: &str| {
        stats[0]
            .tables
            .iter()
            .find(|s| s.name.as_str() == t)
            .map_or(0, |s| s.pulls)
    };
    // Only the one good request read anything.
    assert_eq!((pulls("pe"), pulls("pw"), pulls("px")), (1, 1, 0));
    cluster_one.stop().await;
    cluster.stop().await;
}
