//! Whole clusters on loopback, driven through the client SDK.

use ps_client::{ClientConfig, ClientError, PsClient};
use ps_core::{Initializer, Optimizer, TableSpec};
use ps_tests::TestCluster;
use rand::{Rng, SeedableRng};

fn ramp(n: usize) -> Vec<f32> {
    (0..n).map(|i| (i % 1000) as f32 * 0.001 - 0.5).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dense_round_trip_over_two_shards_with_a_tensor_over_64_mib() {
    let cluster = TestCluster::start(2).await;
    let ps = cluster.client().await;
    // 17 Mi values = 68 MiB: far over gRPC's default 4 MiB message limit.
    let n = 17 * 1024 * 1024;
    let spec = TableSpec::dense("big", &[n as u64 / 1024, 1024])
        .unwrap()
        .with_optimizer(Optimizer::sgd(1.0))
        .unwrap();
    ps.create_table(spec).await.unwrap();
    assert_eq!(ps.pull_dense("big").await.unwrap(), vec![0.0; n]);

    let grad = ramp(n);
    let summary = ps.push_dense("big", &grad).await.unwrap();
    assert_eq!(summary.applied_values, n as u64);
    assert_eq!(summary.duplicates, 0);
    let w = ps.pull_dense("big").await.unwrap();
    // SGD with lr 1 from zeros: w = -g, bit for bit.
    assert!(w.iter().zip(&grad).all(|(w, g)| *w == -g));

    // Both shards hold part of it.
    let stats = ps.stats().await.unwrap();
    assert!(stats.iter().all(|s| s.tables[0].rows > 0), "{stats:?}");

    // A chunk range reads the same values as the whole tensor.
    let part = ps.pull_dense_chunks("big", 3..5).await.unwrap();
    let c = 256 * 1024;
    assert_eq!(part, w[3 * c..5 * c]);

    // Into the caller's buffer: the same values; a buffer of another length is refused and
    // left as it was.
    let mut buf = vec![7.0f32; n];
    ps.pull_dense_into("big", &mut buf).await.unwrap();
    assert!(buf == w);
    let mut short = vec![7.0f32; n - 1];
    let err = ps.pull_dense_into("big", &mut short).await.unwrap_err();
    assert!(
        matches!(err, ps_client::ClientError::InvalidInput(_)),
        "{err}"
    );
    assert!(short.iter().all(|v| *v == 7.0));
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sparse_round_trip_routes_and_combines_duplicates() {
    let cluster = TestCluster::start(3).await;
    let ps = cluster.client().await;
    let spec = TableSpec::sparse("emb", 4)
        .unwrap()
        .with_optimizer(Optimizer::sgd(0.5))
        .unwrap()
        .with_initializer(Initializer::uniform(-1.0, 1.0, 11))
        .unwrap();
    ps.create_table(spec).await.unwrap();

    let ids: Vec<u64> = (0..500).map(|i| i * 7919).collect();
    let before = ps.pull_sparse("emb", &ids).await.unwrap();
    // Seeded initializer: values in range, not all equal, the same on a second read.
    assert!(before.iter().all(|v| (-1.0..1.0).contains(v)));
    assert_ne!(before[0], before[4]);
    assert_eq!(ps.pull_sparse("emb", &ids).await.unwrap(), before);

    // Every id once with gradient 1, and id[0] twice more with 2: combined to 5 for it.
    let mut push_ids = ids.clone();
    push_ids.extend([ids[0], ids[0]]);
    let mut grads = vec![1.0; ids.len() * 4];
    grads.extend([2.0; 8]);
    let summary = ps.push_sparse("emb", &push_ids, &grads).await.unwrap();
    assert_eq!(summary.applied_values, ids.len() as u64 * 4);

    let after = ps.pull_sparse("emb", &ids).await.unwrap();
    for (i, (a, b)) in after.iter().zip(&before).enumerate() {
        let g = if i < 4 { 5.0 } else { 1.0 };
        assert!((a - (b - 0.5 * g)).abs() < 1e-6, "value {i}: {a} vs {b}");
    }
    // Rows spread over all three shards.
    let stats = ps.stats().await.unwrap();
    let rows: Vec<u64> = stats.iter().map(|s| s.tables[0].rows).collect();
    assert_eq!(rows.iter().sum::<u64>(), 500);
    assert!(rows.iter().all(|&r| r > 100), "{rows:?}");
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_clients_are_all_applied_exactly_once() {
    let cluster = TestCluster::start(2).await;
    let ps = cluster.client().await;
    ps.create_table(
        TableSpec::sparse("counts", 1)
            .unwrap()
            .with_optimizer(Optimizer::sgd(1.0))
            .unwrap(),
    )
    .await
    .unwrap();
    let ids: Vec<u64> = (0..64).collect();
    let mut tasks = Vec::new();
    for c in 0..4u64 {
        let endpoints = cluster.endpoints.clone();
        let ids = ids.clone();
        tasks.push(tokio::spawn(async move {
            let ps = PsClient::connect(ClientConfig::new(endpoints))
                .await
                .unwrap();
            let mut rng = rand::rngs::StdRng::seed_from_u64(c);
            for _ in 0..50 {
                let k = rng.random_range(1..ids.len());
                ps.push_sparse("counts", &ids[..k], &vec![-1.0; k])
                    .await
                    .unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    // Each id counts how many pushes included it; recompute the expected counts.
    let mut expected = vec![0.0f32; ids.len()];
    for c in 0..4u64 {
        let mut rng = rand::rngs::StdRng::seed_from_u64(c);
        for _ in 0..50 {
            let k = rng.random_range(1..ids.len());
            for e in &mut expected[..k] {
                *e += 1.0;
            }
        }
    }
    assert_eq!(ps.pull_sparse("counts", &ids).await.unwrap(), expected);
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_shard_list_is_refused_with_the_reason() {
    let cluster = TestCluster::start(2).await;
    let swapped = vec![cluster.endpoints[1].clone(), cluster.endpoints[0].clone()];
    let e = PsClient::connect(ClientConfig::new(swapped))
        .await
        .unwrap_err();
    assert!(
        matches!(e, ClientError::Topology(ref m) if m.contains("is shard 1 of 2")),
        "{e}"
    );
    let e = PsClient::connect(ClientConfig::new(vec![cluster.endpoints[0].clone()]))
        .await
        .unwrap_err();
    assert!(matches!(e, ClientError::Topology(_)), "{e}");
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tables_are_created_idempotently_listed_and_dropped() {
    let cluster = TestCluster::start(2).await;
    let ps = cluster.client().await;
    let spec = TableSpec::dense("w", &[10, 10])
        .unwrap()
        .with_optimizer(Optimizer::adam(0.01))
        .unwrap();
    let stored = ps.create_table(spec.clone()).await.unwrap();
    assert_eq!(stored, spec);
    // The same spec again is fine.
    ps.create_table(spec.clone()).await.unwrap();
    // A different one under the same name is not.
    let other = spec.clone().with_optimizer(Optimizer::sgd(0.1)).unwrap();
    let e = ps.create_table(other).await.unwrap_err();
    assert_eq!(e.code(), Some(tonic::Code::AlreadyExists), "{e}");
    assert!(e.to_string().contains("different spec"), "{e}");

    assert_eq!(ps.list_tables().await.unwrap(), vec![spec]);
    ps.drop_table("w").await.unwrap();
    assert!(ps.list_tables().await.unwrap().is_empty());
    let e = ps.pull_dense("w").await.unwrap_err();
    assert_eq!(e.code(), Some(tonic::Code::NotFound), "{e}");
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoint_writes_a_verifiable_manifest_on_every_shard() {
    let cluster = TestCluster::start(2).await;
    let ps = cluster.client().await;
    ps.create_table(
        TableSpec::dense("w", &[1000])
            .unwrap()
            .with_chunk_elems(100)
            .unwrap(),
    )
    .await
    .unwrap();
    ps.push_dense("w", &ramp(1000)).await.unwrap();
    let cps = ps.checkpoint("first").await.unwrap();
    assert_eq!(cps.len(), 2);
    for cp in &cps {
        assert!(cp.files > 0 && cp.bytes > 0, "{cp:?}");
        let manifest = ps_server::checkpoint::verify(std::path::Path::new(&cp.path)).unwrap();
        assert_eq!(manifest.tables, vec!["w".to_owned()]);
    }
    // The same name twice is refused.
    let e = ps.checkpoint("first").await.unwrap_err();
    assert_eq!(e.code(), Some(tonic::Code::AlreadyExists), "{e}");
    // A corrupted file is caught by verification.
    let dir = std::path::Path::new(&cps[0].path);
    let manifest = ps_server::checkpoint::verify(dir).unwrap();
    let victim = dir
        .join("db")
        .join(&manifest.files.iter().find(|f| f.bytes > 0).unwrap().name);
    let mut bytes = std::fs::read(&victim).unwrap();
    bytes[0] ^= 0xff;
    std::fs::remove_file(&victim).unwrap(); // a hard link: write a new file, not the shard's
    std::fs::write(&victim, bytes).unwrap();
    let e = ps_server::checkpoint::verify(dir).unwrap_err();
    assert!(e.to_string().contains("does not match the manifest"), "{e}");
    cluster.stop().await;
}

/// Deleting a checkpoint: refused while an export reads it, then gone from every shard (nothing
/// left that reads as a checkpoint), idempotent, bad names refused; the checkpoint taken after it
/// shares its files (hard links) and still verifies and restores.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_checkpoint_is_gone_from_every_shard_and_the_next_one_still_restores() {
    let cluster = TestCluster::start(2).await;
    let ps = cluster.client().await;
    // 64 MiB: more than an export stream's window and queue hold, so an export nobody reads
    // stays in progress.
    const N: usize = 16 << 20;
    ps.create_table(TableSpec::dense("w", &[N as u64]).unwrap())
        .await
        .unwrap();
    ps.push_dense("w", &ramp(N)).await.unwrap();
    ps.checkpoint("a").await.unwrap();
    let mut grad = vec![0.0; N];
    grad[7] = 1.0;
    ps.push_dense("w", &grad).await.unwrap();
    let b = ps.checkpoint("b").await.unwrap();
    let at_b = ps.pull_dense("w").await.unwrap();

    let mut export = ps
        .export_checkpoint(0, "a", None, &["w".to_owned()])
        .await
        .unwrap();
    assert!(export.next().await.unwrap().is_some());
    let e = ps.delete_checkpoint("a").await.unwrap_err();
    assert_eq!(e.code(), Some(tonic::Code::FailedPrecondition), "{e}");
    assert_eq!(e.reason(), Some("CHECKPOINT_IN_USE"), "{e}");
    assert!(
        cluster.data_dirs[0]
            .join("checkpoints/a/MANIFEST.json")
            .exists()
    );
    drop(export);
    // The export notices its reader left at its next part, and lets the checkpoint go.
    let mut done = None;
    for _ in 0..100 {
        match ps.delete_checkpoint("a").await {
            Ok(d) => {
                done = Some(d);
                break;
            }
            Err(e) if e.reason() == Some("CHECKPOINT_IN_USE") => {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            Err(e) => panic!("{e}"),
        }
    }
    let done = done.expect("the checkpoint was let go once its export ended");
    // Shard 1, which no export held, deleted it at the first call.
    assert!(!done[1].deleted, "{done:?}");
    // At least its manifests (RocksDB's and ours) were its own; its table files are shared
    // with `b` and the live store.
    assert!(done[0].deleted && done[0].freed_bytes > 0, "{done:?}");
    for data in &cluster.data_dirs {
        let left: Vec<String> = std::fs::read_dir(data.join("checkpoints"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(left, ["b"], "{}", data.display());
    }
    // Idempotent; bad names are refused; the deleted checkpoint is not found.
    for d in ps.delete_checkpoint("a").await.unwrap() {
        assert_eq!(
            d,
            ps_client::Deleted {
                deleted: false,
                freed_bytes: 0
            }
        );
    }
    for bad in ["", "../b", ".hidden", "a/b"] {
        let e = ps.delete_checkpoint(bad).await.unwrap_err();
        assert_eq!(e.code(), Some(tonic::Code::InvalidArgument), "{bad:?}: {e}");
    }
    let mut gone = ps
        .export_checkpoint(1, "a", None, &["w".to_owned()])
        .await
        .unwrap();
    let e = gone.next().await.unwrap_err();
    assert_eq!(e.code(), Some(tonic::Code::NotFound), "{e}");
    // `b` kept every file it links with `a`: it verifies and restores.
    for cp in &b {
        ps_server::checkpoint::verify(std::path::Path::new(&cp.path)).unwrap();
    }
    ps.push_dense("w", &grad).await.unwrap();
    ps.restore_checkpoint(&["b".to_owned(), "b".to_owned()])
        .await
        .unwrap();
    assert!(ps.pull_dense("w").await.unwrap() == at_b);
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_dense_calls_take_the_bulk_stream_and_a_shard_without_one_is_served_by_grpc() {
    // Shard 1 offers no bulk stream: the client must reach it through gRPC.
    let cluster = TestCluster::start_with(2, |cfg| {
        if cfg.shard_index == 1 {
            cfg.bulk_listen = None;
        }
    })
    .await;
    // Without lz4, which would compress these regular values and send them through gRPC.
    let mut cfg = ClientConfig::new(cluster.endpoints.clone());
    cfg.codec.push.lz4.enabled = false;
    let bulk = PsClient::connect(cfg.clone()).await.unwrap();
    assert_ne!(bulk.shards()[0].bulk_port, 0);
    assert_eq!(bulk.shards()[1].bulk_port, 0);
    cfg.bulk = false;
    let grpc = PsClient::connect(cfg).await.unwrap();

    // 5 chunks of 64 Ki values over two shards; values exact in f32 so sums are bit-exact.
    let n = 5 * 65536 - 100;
    let spec = TableSpec::dense("t", &[n as u64])
        .and_then(|s| s.with_chunk_elems(65536))
        .unwrap()
        .with_optimizer(Optimizer::sgd(1.0))
        .unwrap();
    bulk.create_table(spec).await.unwrap();
    let g1: Vec<f32> = (0..n).map(|i| (i % 97) as f32).collect();
    let g2: Vec<f32> = (0..n).map(|i| (i % 13) as f32 * 0.5).collect();
    let before = bulk.stats().await.unwrap();
    assert_eq!(
        bulk.push_dense("t", &g1).await.unwrap().applied_values,
        n as u64
    );
    let after_push = bulk.stats().await.unwrap();
    assert!(after_push[0].bulk_calls > before[0].bulk_calls);
    assert_eq!(after_push[1].bulk_calls, 0);
    grpc.push_dense("t", &g2).await.unwrap();
    let want: Vec<f32> = g1.iter().zip(&g2).map(|(a, b)| -(a + b)).collect();
    let by_bulk = bulk.pull_dense("t").await.unwrap();
    let after_pull = bulk.stats().await.unwrap();
    assert_eq!(by_bulk, want);
    assert_eq!(grpc.pull_dense("t").await.unwrap(), want);
    assert_eq!(
        bulk.pull_dense_chunks("t", 1..4).await.unwrap(),
        want[65536..4 * 65536]
    );
    // The gRPC client never touched the bulk stream; the bulk client pulled through it.
    let end = bulk.stats().await.unwrap();
    assert!(after_pull[0].bulk_calls > after_push[0].bulk_calls);
    assert!(end[0].bulk_calls > after_pull[0].bulk_calls);
    assert_eq!(end[1].bulk_calls, 0);
    // A lossy codec's pushes take it too, their values in the call's header, to the shard
    // that has one; the other shard gets its share through gRPC.
    let int8 = ps_client::TableCodec {
        push: ps_client::CompressOptions {
            codec: ps_client::Codec::Int8 { block: 256 },
            ..Default::default()
        },
        ..Default::default()
    };
    bulk.set_table_codec("t", int8).unwrap();
    let sent = bulk.push_dense("t", &g1).await.unwrap();
    assert_eq!(sent.applied_values, n as u64);
    let after_int8 = bulk.stats().await.unwrap();
    assert!(after_int8[0].bulk_calls > end[0].bulk_calls);
    assert_eq!(after_int8[1].bulk_calls, 0);

    // Sparse pushes of plain f32 rows take it too, to the shard that has one; the rows come
    // out as the gRPC client's pushes leave them.
    let rows = TableSpec::sparse("e", 4)
        .unwrap()
        .with_optimizer(Optimizer::sgd(1.0))
        .unwrap();
    bulk.create_table(rows).await.unwrap();
    let ids: Vec<u64> = (0..300).chain(0..50).collect();
    let g: Vec<f32> = (0..ids.len() * 4).map(|i| (i % 31) as f32).collect();
    let before = bulk.stats().await.unwrap();
    bulk.push_sparse("e", &ids, &g).await.unwrap();
    let after = bulk.stats().await.unwrap();
    assert_eq!(after[0].bulk_calls, before[0].bulk_calls + 1);
    assert_eq!(after[1].bulk_calls, 0);
    assert_eq!(
        after.iter().map(|s| s.pushes_applied).sum::<u64>(),
        before.iter().map(|s| s.pushes_applied).sum::<u64>() + 2,
        "both shards applied their rows"
    );
    grpc.push_sparse("e", &ids, &g).await.unwrap();
    assert_eq!(
        bulk.stats().await.unwrap()[0].bulk_calls,
        after[0].bulk_calls
    );
    let mut want = vec![0.0f32; 300 * 4];
    for (k, &id) in ids.iter().enumerate() {
        for j in 0..4 {
            want[id as usize * 4 + j] -= 2.0 * g[k * 4 + j];
        }
    }
    let distinct: Vec<u64> = (0..300).collect();
    assert_eq!(grpc.pull_sparse("e", &distinct).await.unwrap(), want);
    cluster.stop().await;
}
