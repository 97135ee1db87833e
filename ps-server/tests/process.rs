//! The `ps-server` binary as a real child process: kill -9 after acknowledged pushes loses
//! nothing and applies nothing twice; SIGTERM drains cleanly and exits 0.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use ps_client::{ClientConfig, PsClient};
use ps_core::{Optimizer, TableSpec};
use ps_launch::Service;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

struct Server {
    svc: Service,
    addr: String,
    metrics: Option<std::net::SocketAddr>,
}

/// Starts `ps-server` on `listen` with its data in `data_dir` (its log in `logs/` beside it)
/// and waits until it serves.
async fn spawn(data_dir: &Path, listen: &str, extra: &[&str]) -> Server {
    let mut args: Vec<String> = [
        "--data-dir",
        data_dir.to_str().unwrap(),
        "--listen",
        listen,
        "--metrics-listen",
        "127.0.0.1:0",
    ]
    .map(str::to_owned)
    .into();
    args.extend(extra.iter().map(|a| a.to_string()));
    let logs = data_dir.parent().unwrap().join("logs");
    let bin = Path::new(env!("CARGO_BIN_EXE_ps-server"));
    let mut svc = Service::spawn(bin, "ps-server", &args, &logs, true).unwrap();
    let ready = svc.ready(Duration::from_secs(60)).await.unwrap();
    Server {
        svc,
        addr: ready.url(),
        metrics: ready.metrics,
    }
}

/// Metric `name` once it reads `want`, or what it reads after two seconds.
async fn settled(server: &Server, name: &str, want: f64) -> f64 {
    let t0 = Instant::now();
    loop {
        let v = metric(server, name).await;
        if v == want || t0.elapsed() > Duration::from_secs(2) {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The value of metric `name` (a series without labels) on `server`'s `/metrics`.
async fn metric(server: &Server, name: &str) -> f64 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(server.metrics.unwrap())
        .await
        .unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).await.unwrap();
    let line = text
        .lines()
        .find(|l| l.split(' ').next() == Some(name))
        .unwrap_or_else(|| panic!("no series {name} in {text}"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

fn client_config(addr: &str) -> ClientConfig {
    let mut cfg = ClientConfig::new([addr.to_owned()]);
    cfg.max_attempts = 40;
    cfg.max_backoff = Duration::from_millis(500);
    cfg
}

/// A raw gRPC client, for pushes with a push id of the test's choosing.
async fn raw_client(
    addr: &str,
) -> ps_proto::v1::parameter_server_client::ParameterServerClient<tonic::transport::Channel> {
    ps_proto::v1::parameter_server_client::ParameterServerClient::connect(addr.to_owned())
        .await
        .unwrap()
}

/// The push id of a client's only push: nothing below `seq` is outstanding.
fn only_push(client_id: u64, seq: u64) -> Option<ps_proto::v1::PushId> {
    Some(ps_proto::v1::PushId {
        client_id,
        seq,
        min_unacked_seq: seq,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_loses_no_acknowledged_push_and_applies_none_twice() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = spawn(&dir.path().join("data"), "127.0.0.1:0", &[]).await;
    let addr = server.addr.clone();
    let ps = PsClient::connect(client_config(&addr)).await.unwrap();
    ps.create_table(
        TableSpec::sparse("counts", 1)
            .unwrap()
            .with_optimizer(Optimizer::sgd(1.0))
            .unwrap(),
    )
    .await
    .unwrap();
    ps.create_table(
        TableSpec::dense("w", &[300_000])
            .unwrap()
            .with_optimizer(Optimizer::sgd(1.0))
            .unwrap(),
    )
    .await
    .unwrap();
    let ids: Vec<u64> = (0..100).collect();

    // A burst of acknowledged pushes, then kill -9 at once.
    for _ in 0..30 {
        ps.push_sparse("counts", &ids, &vec![-1.0; ids.len()])
            .await
            .unwrap();
    }
    ps.push_dense("w", &vec![-0.5; 300_000]).await.unwrap();
    server.svc.kill(); // SIGKILL

    // Restart on the same data dir and port.
    let port = addr.rsplit(':').next().unwrap().to_owned();
    let mut server = spawn(&dir.path().join("data"), &format!("127.0.0.1:{port}"), &[]).await;
    // Without lz4, which would shrink the constant gradients below and send them by gRPC.
    let mut cfg = client_config(&server.addr);
    cfg.codec.push.lz4.enabled = false;
    let ps2 = PsClient::connect(cfg).await.unwrap();
    assert_eq!(
        ps2.pull_sparse("counts", &ids).await.unwrap(),
        vec![30.0; ids.len()]
    );
    assert_eq!(ps2.pull_dense("w").await.unwrap(), vec![0.5; 300_000]);

    // Now kill it while pushes are in flight: the client retries each under its own sequence
    // number through the restart, and in the end every push is applied exactly once.
    const TOTAL: usize = 400;
    let acked = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let pusher = {
        let (ps, ids, acked) = (ps2.clone(), ids.clone(), acked.clone());
        tokio::spawn(async move {
            let mut duplicates = 0;
            for _ in 0..TOTAL {
                duplicates += ps
                    .push_sparse("counts", &ids, &vec![-1.0; ids.len()])
                    .await
                    .unwrap()
                    .duplicates;
                acked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            duplicates
        })
    };
    // Dense pushes go by the bulk stream, and keep going until told to stop after the restart.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let dense_pusher = {
        let (ps, stop) = (ps2.clone(), stop.clone());
        tokio::spawn(async move {
            let mut acked = 0u32;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                ps.push_dense("w", &vec![-0.5; 300_000]).await.unwrap();
                acked += 1;
            }
            acked
        })
    };
    let bulk_calls = ps2.stats().await.unwrap()[0].bulk_calls;
    ps2.push_dense("w", &vec![0.0; 300_000]).await.unwrap();
    assert!(
        ps2.stats().await.unwrap()[0].bulk_calls > bulk_calls,
        "dense pushes take the bulk stream"
    );
    while acked.load(std::sync::atomic::Ordering::SeqCst) < 20 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    server.svc.kill();
    let acked_at_kill = acked.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        acked_at_kill < TOTAL,
        "the kill must land while pushes remain"
    );
    let mut server = spawn(&dir.path().join("data"), &format!("127.0.0.1:{port}"), &[]).await;
    let duplicates = pusher.await.unwrap();
    let expected = (30 + TOTAL) as f32;
    assert_eq!(
        ps2.pull_sparse("counts", &ids).await.unwrap(),
        vec![expected; ids.len()]
    );
    eprintln!(
        "killed after {acked_at_kill} of {TOTAL} pushes; retries recognised as applied: {duplicates}"
    );
    // The restarted shard listens for the bulk stream on a new port: the client asks for it
    // after its first failed connect and goes back to the bulk stream.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while ps2.stats().await.unwrap()[0].bulk_calls < 3 {
        assert!(
            std::time::Instant::now() < deadline,
            "the client never went back to the restarted shard's bulk stream"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let dense_acked = dense_pusher.await.unwrap();
    // Every acknowledged dense push applied once, none lost in the kill: w = 0.5 + 0.5 n.
    let w = ps2.pull_dense("w").await.unwrap();
    assert_eq!(w, vec![0.5 + 0.5 * dense_acked as f32; 300_000]);
    server.svc.kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_turns_not_serving_finishes_in_flight_calls_and_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = spawn(
        &dir.path().join("data"),
        "127.0.0.1:0",
        &["--drain-ms", "1500"],
    )
    .await;
    let ps = PsClient::connect(client_config(&server.addr))
        .await
        .unwrap();
    let n = 16 * 1024 * 1024;
    ps.create_table(
        TableSpec::dense("w", &[n as u64])
            .unwrap()
            .with_optimizer(Optimizer::sgd(1.0))
            .unwrap(),
    )
    .await
    .unwrap();

    // A 64 MiB push around SIGTERM: in flight when it arrives, or sent during the 1.5 s drain
    // (the listener still accepts then); either way it must finish and be applied.
    let push = {
        let ps = ps.clone();
        tokio::spawn(async move { ps.push_dense("w", &vec![1.0; n]).await })
    };
    server.svc.terminate();

    // During the drain, health says NOT_SERVING.
    let mut health = HealthClient::new(
        tonic::transport::Channel::from_shared(server.addr.clone())
            .unwrap()
            .connect()
            .await
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(1);
    let mut status = ServingStatus::Serving;
    while Instant::now() < deadline {
        let r = health
            .check(HealthCheckRequest {
                service: "ps.v1.ParameterServer".into(),
            })
            .await
            .unwrap()
            .into_inner();
        status = r.status();
        if status == ServingStatus::NotServing {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(status, ServingStatus::NotServing);

    // The in-flight push completes and was applied.
    let summary = push.await.unwrap().unwrap();
    assert_eq!(summary.applied_values, n as u64);
    let code = server.svc.wait(Duration::from_secs(60)).await.unwrap();
    assert_eq!(
        code.and_then(|c| c.code()),
        Some(0),
        "ps-server should exit 0 on SIGTERM"
    );

    // And it is durable: a restart sees it.
    let mut server = spawn(&dir.path().join("data"), "127.0.0.1:0", &[]).await;
    let ps = PsClient::connect(client_config(&server.addr))
        .await
        .unwrap();
    let w = ps.pull_dense("w").await.unwrap();
    assert!(w.iter().all(|&v| v == -1.0));
    server.svc.kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_dir_refuses_the_wrong_shard_identity() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = spawn(
        &dir.path().join("data"),
        "127.0.0.1:0",
        &["--num-shards", "2"],
    )
    .await;
    server.svc.kill();
    let out = Command::new(env!("CARGO_BIN_EXE_ps-server"))
        .args([
            "--data-dir",
            dir.path().join("data").to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
        ])
        .args(["--num-shards", "2", "--shard-index", "1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("belongs to shard 0 of 2"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_retried_after_kill_9_and_restart_is_not_applied_again() {
    use ps_proto::v1 as pb;
    let dir = tempfile::tempdir().unwrap();
    let mut server = spawn(&dir.path().join("data"), "127.0.0.1:0", &[]).await;
    let ps = PsClient::connect(client_config(&server.addr))
        .await
        .unwrap();
    ps.create_table(
        TableSpec::sparse("t", 2)
            .unwrap()
            .with_optimizer(Optimizer::sgd(1.0))
            .unwrap(),
    )
    .await
    .unwrap();
    let push = pb::PushSparseRequest {
        table: "t".into(),
        push_id: only_push(99, 1234),
        map_epoch: 0,
        ids: vec![1, 1, 2],
        values: Some(ps_core::Payload::from_f32(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).into()),
        clock: None,
        ..Default::default()
    };
    let mut raw = raw_client(&server.addr).await;
    assert!(
        !raw.push_sparse(push.clone())
            .await
            .unwrap()
            .into_inner()
            .duplicate
    );
    server.svc.kill();

    let port = server.addr.rsplit(':').next().unwrap().to_owned();
    let mut server = spawn(&dir.path().join("data"), &format!("127.0.0.1:{port}"), &[]).await;
    let mut raw = raw_client(&server.addr).await;
    let again = raw.push_sparse(push).await.unwrap().into_inner();
    assert!(
        again.duplicate,
        "the restarted shard must recognise the retry"
    );
    let ps = PsClient::connect(client_config(&server.addr))
        .await
        .unwrap();
    // Id 1 appeared twice in the push: combined to (4, 6), applied once; id 2 got (5, 6).
    assert_eq!(
        ps.pull_sparse("t", &[1, 2]).await.unwrap(),
        [-4.0, -6.0, -5.0, -6.0]
    );
    server.svc.kill();
}

/// A 1 MiB dense log holds four pushes of the 60 000-float table: a burst of pushes wraps it
/// several times, each wrap snapshotting the cells into RocksDB (an image of the cells, about
/// 1 MB, is more than the log takes), and kill -9 then leaves a mix of snapshot and log
/// records that the restart must replay exactly once, through Adam's state too. A dense push
/// retried after the restart is recognised from the log alone; one pushed before the burst,
/// whose record the log has overwritten, from the store, where its id went with the write
/// that moved the log's tail past it. The burst's pushes write nothing to the store but
/// those writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_replays_a_wrapped_dense_log_exactly_once() {
    replay_a_wrapped_dense_log_after_kill_9(1, false).await;
}

/// The same burst through an 8 MiB log, which takes images of the cells: the log wraps past
/// an image, and the restart starts from the image instead of from the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_replays_a_dense_log_from_its_image_exactly_once() {
    replay_a_wrapped_dense_log_after_kill_9(8, true).await;
}

async fn replay_a_wrapped_dense_log_after_kill_9(log_mib: u64, images: bool) {
    use ps_proto::v1 as pb;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("ps.toml");
    std::fs::write(&config, format!("[rocksdb]\ndense_log_mib = {log_mib}\n")).unwrap();
    let data = dir.path().join("data");
    let args = ["--config", config.to_str().unwrap()];
    let mut server = spawn(&data, "127.0.0.1:0", &args).await;
    let ps = PsClient::connect(client_config(&server.addr))
        .await
        .unwrap();
    let n = 60_000;
    for (name, opt) in [
        ("count", Optimizer::sgd(1.0)),
        ("adam", Optimizer::adam(0.01)),
        ("raw", Optimizer::sgd(1.0)),
    ] {
        let len = if name == "raw" { 1000 } else { n as u64 };
        ps.create_table(
            TableSpec::dense(name, &[len])
                .unwrap()
                .with_optimizer(opt)
                .unwrap(),
        )
        .await
        .unwrap();
    }
    let raw_push = |push_id| pb::PushDenseRequest {
        table: "raw".into(),
        push_id,
        map_epoch: 0,
        slices: vec![pb::DenseSlice {
            chunk: 0,
            values: Some(ps_core::Payload::from_f32(&[-2.0; 1000]).into()),
        }],
        trace_context: Default::default(),
        authorization: String::new(),
    };
    let mut raw = raw_client(&server.addr).await;
    // Pushed before the burst, by a client of its own (no later floor covers it).
    let early = raw_push(only_push(78, 1));
    assert!(
        !raw.push_dense(early.clone())
            .await
            .unwrap()
            .into_inner()
            .duplicate
    );
    let batches = || async { ps.stats().await.unwrap()[0].write_batches };
    let before = batches().await;
    let pushes = 23;
    for k in 0..pushes {
        ps.push_dense("count", &vec![-1.0; n]).await.unwrap();
        let g: Vec<f32> = (0..n).map(|i| ((i * 7 + k) % 13) as f32 - 6.0).collect();
        ps.push_dense("adam", &g).await.unwrap();
    }
    let written = batches().await - before;
    let push = raw_push(only_push(77, 5));
    assert!(
        !raw.push_dense(push.clone())
            .await
            .unwrap()
            .into_inner()
            .duplicate
    );
    let adam_acked = ps.pull_dense("adam").await.unwrap();
    // 46 pushes of 240 KB (11 MB) went through the log: it wrapped.
    let log = std::fs::read(data.join("db.dense-log")).unwrap();
    assert_eq!(log.len() as u64, log_mib << 20);
    // An image record starts with its magic, "PSDI" (the pushed values never spell it).
    assert_eq!(
        log.windows(4).any(|w| w == b"PSDI"),
        images,
        "whether the log holds an image of the cells"
    );
    assert!(
        // Snapshots, images and the rows' tail (about one per push through the 1 MiB log),
        // not a write per push besides.
        (1..2 * pushes as u64).contains(&written),
        "{written} store writes for the burst's {} pushes",
        2 * pushes
    );
    server.svc.kill();

    let port = server.addr.rsplit(':').next().unwrap().to_owned();
    let mut server = spawn(&data, &format!("127.0.0.1:{port}"), &args).await;
    let ps = PsClient::connect(client_config(&server.addr))
        .await
        .unwrap();
    assert_eq!(
        ps.pull_dense("count").await.unwrap(),
        vec![pushes as f32; n]
    );
    let adam = ps.pull_dense("adam").await.unwrap();
    assert!(
        adam.iter()
            .zip(&adam_acked)
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "Adam's parameters after replay differ from the acknowledged ones"
    );
    let mut raw = raw_client(&server.addr).await;
    assert!(
        raw.push_dense(push).await.unwrap().into_inner().duplicate,
        "the restarted shard must recognise the retried dense push"
    );
    assert!(
        raw.push_dense(early).await.unwrap().into_inner().duplicate,
        "the restarted shard must recognise a retried push whose record the log overwrote"
    );
    assert_eq!(ps.pull_dense("raw").await.unwrap(), vec![4.0; 1000]);
    // One more acknowledged push after the replay, then kill -9 again.
    ps.push_dense("count", &vec![-1.0; n]).await.unwrap();
    server.svc.kill();
    let mut server = spawn(&data, &format!("127.0.0.1:{port}"), &args).await;
    let ps = PsClient::connect(client_config(&server.addr))
        .await
        .unwrap();
    assert_eq!(
        ps.pull_dense("count").await.unwrap(),
        vec![(pushes + 1) as f32; n]
    );
    server.svc.kill();
}

/// Dense pushes of random values (which lz4 cannot shrink, so they take the bulk stream) are
/// received into the push log's body ring and logged where they are: after kill -9 the shard
/// replays them from the ring bit for bit, through a ring that wrapped and images that freed
/// it, and still knows their push ids; a push refused for a NaN changes nothing and frees its
/// place in the ring.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_replays_pushes_received_into_the_body_ring_exactly_once() {
    ring_pushes_survive_kill_9(false).await;
}

/// The same with `--sync`: the ring's bodies are made durable before the records that point
/// at them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_replays_ring_pushes_in_sync_mode() {
    ring_pushes_survive_kill_9(true).await;
}

async fn ring_pushes_survive_kill_9(sync: bool) {
    use rand::{Rng, SeedableRng};
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("ps.toml");
    // An 8 MiB ring beside an 8 MiB log: 40 bodies of 400 KB wrap it twice.
    std::fs::write(&config, "[rocksdb]\ndense_log_mib = 8\n").unwrap();
    let data = dir.path().join("data");
    let mut args = vec!["--config", config.to_str().unwrap()];
    if sync {
        args.push("--sync");
    }
    let mut server = spawn(&data, "127.0.0.1:0", &args).await;
    let ps = PsClient::connect(client_config(&server.addr))
        .await
        .unwrap();
    let n = 100_000;
    ps.create_table(
        TableSpec::dense("w", &[n as u64])
            .unwrap()
            .with_optimizer(Optimizer::adam(0.01))
            .unwrap(),
    )
    .await
    .unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let mut grad = || -> Vec<f32> { (0..n).map(|_| rng.random_range(-1.0..1.0)).collect() };
    let pushes = if sync { 12 } else { 40 };
    for _ in 0..pushes {
        ps.push_dense("w", &grad()).await.unwrap();
    }
    let into_ring = "ps_bulk_push_bodies_total{into=\"ring\"}";
    assert_eq!(metric(&server, into_ring).await, pushes as f64);
    let acked = ps.pull_dense("w").await.unwrap();
    // A NaN is refused (by the shard, its body read into the ring first) and changes nothing.
    let mut bad = grad();
    bad[n / 2] = f32::NAN;
    assert!(ps.push_dense("w", &bad).await.is_err());
    assert_eq!(ps.pull_dense("w").await.unwrap(), acked);
    if !sync {
        let log = std::fs::read(data.join("db.dense-log")).unwrap();
        assert!(
            log.windows(4).any(|w| w == b"PSDI"),
            "the ring's pressure wrote an image of the cells"
        );
    }
    server.svc.kill();
    // Restarted twice: the second time after 3 more pushes, which go into the ring after the
    // bodies the replay holds there.
    let port = server.addr.rsplit(':').next().unwrap().to_owned();
    let mut acked = acked;
    for round in 0..2 {
        let mut server = spawn(&data, &format!("127.0.0.1:{port}"), &args).await;
        let ps = PsClient::connect(client_config(&server.addr))
            .await
            .unwrap();
        let replayed = ps.pull_dense("w").await.unwrap();
        assert!(
            replayed
                .iter()
                .zip(&acked)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "replay {round}: the parameters differ from the acknowledged ones"
        );
        if round == 0 {
            for _ in 0..3 {
                ps.push_dense("w", &grad()).await.unwrap();
            }
            assert_eq!(metric(&server, into_ring).await, 3.0);
            acked = ps.pull_dense("w").await.unwrap();
        }
        server.svc.kill();
    }
}

/// Optimizer state of sparse rows (Adagrad's accumulators, Adam's moments and step, FTRL's
/// z and n, momentum's velocity) survives kill -9: the pushes after the restart continue from
/// it exactly as one uninterrupted run would, computed here with the shards' own update rule.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sparse_optimizer_state_survives_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut server = spawn(&data, "127.0.0.1:0", &[]).await;
    let ps = PsClient::connect(client_config(&server.addr))
        .await
        .unwrap();
    let optimizers = [
        ("momentum", Optimizer::momentum(0.1, 0.9)),
        ("adagrad", Optimizer::adagrad(0.1)),
        ("adam", Optimizer::adam(0.01)),
        ("ftrl", Optimizer::ftrl(0.1, 1.0, 0.01, 0.1)),
    ];
    let ids = [5u64, 9];
    let dim = 3;
    let grads: [Vec<f32>; 3] = [
        vec![0.5, -1.0, 2.0, 0.25, 0.0, -3.0],
        vec![-0.5, 0.75, 1.0, 1.5, -2.0, 0.5],
        vec![1.0, 1.0, -1.0, -0.25, 0.5, 2.0],
    ];
    // The reference: each row's parameters (as first pulled), state and step.
    let mut reference = Vec::new();
    for (name, opt) in &optimizers {
        ps.create_table(
            TableSpec::sparse(name, dim as u32)
                .unwrap()
                .with_optimizer(*opt)
                .unwrap(),
        )
        .await
        .unwrap();
        let w = ps.pull_sparse(name, &ids).await.unwrap();
        let state = ps_core::optim::initial_state(opt, w.len());
        reference.push((w, state, [0u64; 2]));
    }
    let step = |reference: &mut Vec<(Vec<f32>, Vec<f32>, [u64; 2])>, g: &[f32]| {
        for ((_, opt), (w, state, steps)) in optimizers.iter().zip(reference.iter_mut()) {
            let slots = opt.state_slots();
            for (r, step) in steps.iter_mut().enumerate() {
                let row = r * dim..(r + 1) * dim;
                let mut st: Vec<f32> = (0..slots)
                    .flat_map(|s| state[s * w.len() + row.start..s * w.len() + row.end].to_vec())
                    .collect();
                ps_core::optim::apply(opt, &mut w[row.clone()], &mut st, step, &g[row.clone()]);
                for s in 0..slots {
                    state[s * w.len() + row.start..s * w.len() + row.end]
                        .copy_from_slice(&st[s * dim..(s + 1) * dim]);
                }
            }
        }
    };
    for g in &grads[..2] {
        for (name, _) in &optimizers {
            ps.push_sparse(name, &ids, g).await.unwrap();
        }
        step(&mut reference, g);
    }
    server.svc.kill();
    let port = server.addr.rsplit(':').next().unwrap().to_owned();
    let mut server = spawn(&data, &format!("127.0.0.1:{port}"), &[]).await;
    for (name, _) in &optimizers {
        ps.push_sparse(name, &ids, &grads[2]).await.unwrap();
    }
    step(&mut reference, &grads[2]);
    for ((name, _), (want, _, _)) in optimizers.iter().zip(&reference) {
        let got = ps.pull_sparse(name, &ids).await.unwrap();
        for (g, w) in got.iter().zip(want) {
            assert!(
                (g - w).abs() <= 1e-6 * (1.0 + w.abs()),
                "{name}: {got:?} after the restart, {want:?} uninterrupted"
            );
        }
    }
    server.svc.kill();
}

/// A sparse table twelve times larger than the shard's row cache (--cache-mib 1) trains
/// exactly as an uninterrupted run computed here with the shards' own update rule: new rows are
/// not looked up in the store before any row has left memory, rows leave the cache and come
/// back from the store with their Adagrad state, pulls of cold rows are read from the store,
/// kill -9 right after acknowledged pushes loses none of them, and a push retried after the
/// restart is recognised, not applied twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sparse_table_larger_than_the_cache_trains_exactly_through_kill_9() {
    const ROWS: u64 = 100_000;
    const DIM: usize = 8;
    const BATCH: usize = 10_000;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let args = ["--cache-mib", "1"];
    let mut server = spawn(&data, "127.0.0.1:0", &args).await;
    let ps = connect(&server.addr).await;
    let opt = Optimizer::adagrad(0.1);
    ps.create_table(
        TableSpec::sparse("emb", DIM as u32)
            .unwrap()
            .with_optimizer(opt)
            .unwrap(),
    )
    .await
    .unwrap();
    let all: Vec<u64> = (0..ROWS).collect();
    // The reference: each row's parameters (as first pulled: the initializer), state, step.
    let mut w = ps.pull_sparse("emb", &all).await.unwrap();
    // Before any row has left memory, a row missing from it is new: not looked up in the store.
    assert_eq!(metric(&server, "ps_store_row_reads_total").await, 0.0);
    let mut state = vec![ps_core::optim::initial_state(&opt, DIM); ROWS as usize];
    let mut steps = vec![0u64; ROWS as usize];
    let grad = |id: u64, round: u64| -> Vec<f32> {
        (0..DIM as u64)
            .map(|j| ((id * 31 + round * 7 + j) % 13) as f32 * 0.1 - 0.6)
            .collect()
    };
    let mut apply = |ids: &[u64], round: u64| -> Vec<f32> {
        let mut flat = Vec::with_capacity(ids.len() * DIM);
        for &id in ids {
            let g = grad(id, round);
            let i = id as usize;
            ps_core::optim::apply(
                &opt,
                &mut w[i * DIM..(i + 1) * DIM],
                &mut state[i],
                &mut steps[i],
                &g,
            );
            flat.extend(g);
        }
        flat
    };
    // Rounds over every row in a different order each time, with pulls of a cold range between
    // (rows read from the store, put in the cache while it has room).
    let mut pushes = Vec::new();
    for round in 0..3u64 {
        let mut order = all.clone();
        order.rotate_left((round as usize * 37_117) % ROWS as usize);
        for ids in order.chunks(BATCH) {
            pushes.push((ids.to_vec(), apply(ids, round)));
        }
    }
    for (i, (ids, g)) in pushes.iter().enumerate() {
        ps.push_sparse("emb", ids, g).await.unwrap();
        if i % 7 == 3 {
            let cold: Vec<u64> = (0..2_000)
                .map(|k| (k * 49 + i as u64 * 1_000) % ROWS)
                .collect();
            let got = ps.pull_sparse("emb", &cold).await.unwrap();
            assert_eq!(got.len(), cold.len() * DIM);
        }
    }
    // One push with a push id of the test's choosing, retried after the restart.
    let retried: Vec<u64> = (0..5_000).map(|k| k * 17 % ROWS).collect();
    let g = apply(&retried, 9);
    let push = ps_proto::v1::PushSparseRequest {
        table: "emb".into(),
        push_id: only_push(4242, 1),
        map_epoch: 0,
        ids: retried.clone(),
        values: Some(ps_core::Payload::from_f32(&g).into()),
        clock: None,
        ..Default::default()
    };
    let mut raw = raw_client(&server.addr).await;
    assert!(
        !raw.push_sparse(push.clone())
            .await
            .unwrap()
            .into_inner()
            .duplicate
    );
    let stats = ps.stats().await.unwrap().remove(0);
    let table = stats.tables.iter().find(|t| t.name == "emb").unwrap();
    assert_eq!(table.rows, ROWS);
    assert!(stats.cache_evictions > 0, "{stats:?}");
    assert!(stats.cache_misses > 0, "{stats:?}");
    // Once rows have been evicted, misses are read from the store.
    assert!(metric(&server, "ps_store_row_reads_total").await > 0.0);
    assert_eq!(stats.cache_budget_bytes, 1 << 20);
    // The cache may pass its budget by what one group commit brought in before it evicts.
    assert!(
        stats.cache_bytes <= (1 << 20) + BATCH as u64 * 200,
        "{} bytes cached",
        stats.cache_bytes
    );
    assert!(table.cached_rows < ROWS / 8, "{table:?}");
    server.svc.kill();

    let port = server.addr.rsplit(':').next().unwrap().to_owned();
    let mut server = spawn(&data, &format!("127.0.0.1:{port}"), &args).await;
    let ps = connect(&server.addr).await;
    let mut raw = raw_client(&server.addr).await;
    assert!(
        raw.push_sparse(push).await.unwrap().into_inner().duplicate,
        "the restarted shard must recognise the retry"
    );
    let stats = ps.stats().await.unwrap().remove(0);
    assert_eq!(stats.tables[0].rows, ROWS, "the row count survives kill -9");
    assert_eq!(stats.tables[0].cached_rows, 0, "rows page in on first use");
    for ids in all.chunks(BATCH).step_by(2) {
        let g = apply(ids, 3);
        ps.push_sparse("emb", ids, &g).await.unwrap();
    }
    let got = ps.pull_sparse("emb", &all).await.unwrap();
    let wrong = got
        .iter()
        .zip(&w)
        .filter(|(g, w)| (*g - *w).abs() > 1e-6 * (1.0 + w.abs()))
        .count();
    assert_eq!(wrong, 0, "values differing from the uninterrupted run");
    server.svc.kill();
}

/// Sparse rows are written back: a push's rows reach the log, and the store only later (when
/// the log needs their room, here a 2 MiB log that wraps many times, or at eviction), each
/// stamped with the last logged update it holds; rows still being updated then are relogged
/// (an image of each in the log) instead. Hot rows updated in every round and cold rows
/// seen once, beside dense pushes in the same log, train exactly as an uninterrupted run
/// computed here through kill -9; after the restart the rows the log touched are pending:
/// pulled before anything else, brought up to date by a push, and pending still when the
/// shard is killed a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sparse_rows_written_back_through_a_small_log_train_exactly_through_kill_9() {
    const ROWS: u64 = 20_000;
    const DIM: usize = 8;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("ps.toml");
    std::fs::write(&config, "[rocksdb]\ndense_log_mib = 2\n").unwrap();
    let data = dir.path().join("data");
    let args = ["--config", config.to_str().unwrap()];
    let mut server = spawn(&data, "127.0.0.1:0", &args).await;
    let ps = connect(&server.addr).await;
    let opt = Optimizer::adagrad(0.1);
    ps.create_table(
        TableSpec::sparse("emb", DIM as u32)
            .unwrap()
            .with_optimizer(opt)
            .unwrap(),
    )
    .await
    .unwrap();
    ps.create_table(
        TableSpec::dense("count", &[4096])
            .unwrap()
            .with_optimizer(Optimizer::sgd(1.0))
            .unwrap(),
    )
    .await
    .unwrap();
    let all: Vec<u64> = (0..ROWS).collect();
    let mut reference = Reference {
        w: ps.pull_sparse("emb", &all).await.unwrap(),
        state: vec![ps_core::optim::initial_state(&opt, DIM); ROWS as usize],
        steps: vec![0u64; ROWS as usize],
        opt,
        dim: DIM,
    };
    // Each push: the 50 hot rows, then a window of cold rows that slides by 500 a round (rows
    // new to the table until the window wraps); a hot id twice in a push is summed.
    let push_ids = |round: u64| -> Vec<u64> {
        let mut ids: Vec<u64> = (0..50).collect();
        ids.extend((0..2_000).map(|k| 50 + (round * 500 + k) % (ROWS - 50)));
        ids.push(round % 50);
        ids
    };
    let grad = |id: u64, round: u64| -> Vec<f32> {
        (0..DIM as u64)
            .map(|j| ((id * 31 + round * 7 + j) % 13) as f32 * 0.1 - 0.6)
            .collect()
    };
    let rounds = 60;
    for round in 0..rounds {
        let ids = push_ids(round);
        let g = reference.push(&ids, |id| grad(id, round));
        ps.push_sparse("emb", &ids, &g).await.unwrap();
        ps.push_dense("count", &[-1.0; 4096]).await.unwrap();
    }
    // One push with a push id of the test's choosing, retried after the restarts.
    let ids = push_ids(rounds);
    let g = reference.push(&ids, |id| grad(id, rounds));
    let push = ps_proto::v1::PushSparseRequest {
        table: "emb".into(),
        push_id: only_push(4343, 1),
        map_epoch: 0,
        ids,
        values: Some(ps_core::Payload::from_f32(&g).into()),
        clock: None,
        ..Default::default()
    };
    let mut raw = raw_client(&server.addr).await;
    assert!(
        !raw.push_sparse(push.clone())
            .await
            .unwrap()
            .into_inner()
            .duplicate
    );
    // 61 pushes of about 66 KB through a 2 MiB log: rows were written back to free it.
    let written = metric(&server, "ps_rows_written_back_total").await;
    // Written through, every push would have written its 2,050 rows; here a row pushed in
    // several rounds before its write-back is written once (28,800 when this was written).
    assert!(written > 0.0, "no row was written back");
    assert!(
        written < (rounds as f64 + 1.0) * 2_050.0 / 2.0,
        "{written} rows written back: updates were not combined"
    );
    // Rows still being updated when the log needed their room (the hot rows, and cold rows
    // pushed again since) were relogged: the restart rebuilds them from their images.
    let relogged = metric(&server, "ps_rows_relogged_total").await;
    assert!(relogged >= 50.0, "{relogged} rows relogged");
    server.svc.kill();

    let port = server.addr.rsplit(':').next().unwrap().to_owned();
    let mut server = spawn(&data, &format!("127.0.0.1:{port}"), &args).await;
    let ps = connect(&server.addr).await;
    // The rows the log touched are pending: read before any push, hot rows and cold.
    let probe: Vec<u64> = (0..ROWS).step_by(7).collect();
    let got = ps.pull_sparse("emb", &probe).await.unwrap();
    // A push brings the rows it touches up to date first; then kill -9 again at once.
    let ids = push_ids(rounds + 1);
    let g = reference.push(&ids, |id| grad(id, rounds + 1));
    ps.push_sparse("emb", &ids, &g).await.unwrap();
    server.svc.kill();
    let w = &reference.w;
    for (k, &id) in probe.iter().enumerate() {
        let i = id as usize;
        // The probe was read before the last push; rows it changed are checked below.
        if !ids.contains(&id) {
            assert_eq!(
                got[k * DIM..(k + 1) * DIM],
                w[i * DIM..(i + 1) * DIM],
                "row {id} read while pending"
            );
        }
    }

    let server = spawn(&data, &format!("127.0.0.1:{port}"), &args).await;
    let mut raw = raw_client(&server.addr).await;
    assert!(
        raw.push_sparse(push).await.unwrap().into_inner().duplicate,
        "the restarted shard must recognise the retry"
    );
    let ps = connect(&server.addr).await;
    let got = ps.pull_sparse("emb", &all).await.unwrap();
    let wrong: Vec<u64> = all
        .iter()
        .filter(|&&id| {
            let i = id as usize;
            got[i * DIM..(i + 1) * DIM] != w[i * DIM..(i + 1) * DIM]
        })
        .copied()
        .collect();
    assert!(
        wrong.is_empty(),
        "rows differing from the uninterrupted run: {wrong:?}"
    );
    assert_eq!(
        ps.pull_dense("count").await.unwrap(),
        vec![rounds as f32; 4096]
    );
    let stats = ps.stats().await.unwrap().remove(0);
    let emb = stats.tables.iter().find(|t| t.name == "emb").unwrap();
    assert_eq!(emb.rows, ROWS, "every row pushed is counted once");
    // A clean stop writes every row back: the next start has nothing pending.
    server.svc.stop(Duration::from_secs(30)).await;
    let mut server = spawn(&data, &format!("127.0.0.1:{port}"), &args).await;
    assert_eq!(metric(&server, "ps_sparse_rows_pending").await, 0.0);
    let ps = connect(&server.addr).await;
    assert_eq!(ps.pull_sparse("emb", &all).await.unwrap(), got);
    // A table dropped with dirty rows takes them with it (none is written back later).
    ps.create_table(TableSpec::sparse("tmp", DIM as u32).unwrap())
        .await
        .unwrap();
    ps.push_sparse("tmp", &all[..1000], &vec![0.5; 1000 * DIM])
        .await
        .unwrap();
    // (The gauge is set after the group's answers are sent.)
    assert_eq!(
        settled(&server, "ps_sparse_rows_dirty", 1000.0).await,
        1000.0
    );
    ps.drop_table("tmp").await.unwrap();
    ps.push_sparse("emb", &[7], &[0.5; DIM]).await.unwrap();
    assert_eq!(settled(&server, "ps_sparse_rows_dirty", 1.0).await, 1.0);
    server.svc.kill();
}

/// What an uninterrupted run computes with the shards' own update rule: each row's
/// parameters (as first pulled: the initializer), optimizer state and step.
struct Reference {
    w: Vec<f32>,
    state: Vec<Vec<f32>>,
    steps: Vec<u64>,
    opt: Optimizer,
    dim: usize,
}

impl Reference {
    /// One push of `ids` (a row named twice gets the sum of its gradients, as a shard sums
    /// them) with each id's gradient from `grad`; returns the push's values.
    fn push(&mut self, ids: &[u64], grad: impl Fn(u64) -> Vec<f32>) -> Vec<f32> {
        let dim = self.dim;
        let mut flat = Vec::with_capacity(ids.len() * dim);
        let mut summed: std::collections::BTreeMap<u64, Vec<f32>> = Default::default();
        for &id in ids {
            let g = grad(id);
            match summed.get_mut(&id) {
                Some(s) => s.iter_mut().zip(&g).for_each(|(s, g)| *s += g),
                None => {
                    summed.insert(id, g.clone());
                }
            }
            flat.extend(g);
        }
        for (id, g) in summed {
            let i = id as usize;
            ps_core::optim::apply(
                &self.opt,
                &mut self.w[i * dim..(i + 1) * dim],
                &mut self.state[i],
                &mut self.steps[i],
                &g,
            );
        }
        flat
    }
}

/// With --sync (fsync of the WAL and the dense log at every group commit) acknowledged pushes
/// survive kill -9 too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_mode_keeps_acknowledged_pushes_across_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut server = spawn(&data, "127.0.0.1:0", &["--sync"]).await;
    let ps = PsClient::connect(client_config(&server.addr))
        .await
        .unwrap();
    ps.create_table(TableSpec::dense("w", &[50_000]).unwrap())
        .await
        .unwrap();
    ps.create_table(TableSpec::sparse("s", 4).unwrap())
        .await
        .unwrap();
    for _ in 0..3 {
        ps.push_dense("w", &vec![-1.0; 50_000]).await.unwrap();
        ps.push_sparse("s", &[1, 2], &[-1.0; 8]).await.unwrap();
    }
    let w = ps.pull_dense("w").await.unwrap();
    let s = ps.pull_sparse("s", &[1, 2]).await.unwrap();
    server.svc.kill();
    let port = server.addr.rsplit(':').next().unwrap().to_owned();
    let mut server = spawn(&data, &format!("127.0.0.1:{port}"), &["--sync"]).await;
    assert_eq!(ps.pull_dense("w").await.unwrap(), w);
    assert_eq!(ps.pull_sparse("s", &[1, 2]).await.unwrap(), s);
    assert!(
        w.iter().all(|&v| (v - 0.03).abs() < 1e-6),
        "sgd(0.01) thrice: {}",
        w[0]
    );
    server.svc.kill();
}

/// `--restore-from` starts a shard on a checkpoint copied into an empty data dir: it holds the
/// state at the checkpoint, not what came after; a checkpoint whose file does not match its
/// manifest is refused and the shard does not start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restore_from_starts_a_shard_on_a_verified_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut server = spawn(&data, "127.0.0.1:0", &[]).await;
    let ps = PsClient::connect(client_config(&server.addr))
        .await
        .unwrap();
    ps.create_table(TableSpec::dense("w", &[1000]).unwrap())
        .await
        .unwrap();
    ps.push_dense("w", &vec![-1.0; 1000]).await.unwrap();
    let at_checkpoint = ps.pull_dense("w").await.unwrap();
    let ckpt = ps.checkpoint("c1").await.unwrap().remove(0);
    ps.push_dense("w", &vec![-5.0; 1000]).await.unwrap();
    server.svc.kill();

    let restored = dir.path().join("restored");
    let mut server = spawn(&restored, "127.0.0.1:0", &["--restore-from", &ckpt.path]).await;
    let ps = PsClient::connect(client_config(&server.addr))
        .await
        .unwrap();
    assert_eq!(ps.pull_dense("w").await.unwrap(), at_checkpoint);
    server.svc.kill();

    // A damaged copy of the checkpoint: one file's bytes changed.
    let damaged = dir.path().join("damaged");
    copy_dir(Path::new(&ckpt.path), &damaged);
    let sst = std::fs::read_dir(damaged.join("db"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "sst" || x == "log"))
        .expect("a data file in the checkpoint");
    let mut bytes = std::fs::read(&sst).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&sst, bytes).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ps-server"))
        .args(["--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path().join("other"))
        .arg("--restore-from")
        .arg(&damaged)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("does not match the manifest"), "{err}");
    assert!(
        !dir.path().join("other").join("db").exists(),
        "nothing was installed"
    );
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dest = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), dest).unwrap();
        }
    }
}

/// A stored table the shard cannot hold within its memory budget (started again with a smaller
/// one) is left unloaded instead of failing the start or killing the shard: the other tables
/// are served, the table is reported with why, calls on it are refused, and the pushes it took
/// before kill -9 (still in the dense log) are folded into the store, so that a restart with
/// room loads it whole. Dropping it while unloaded removes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_over_the_memory_budget_is_left_unloaded_and_loses_nothing() {
    use ps_core::wire::reason;
    use ps_runtime::status::reason_of;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut server = spawn(&data, "127.0.0.1:0", &[]).await;
    let ps = connect(&server.addr).await;
    let big = TableSpec::dense("big", &[1 << 20])
        .and_then(|t| t.with_chunk_elems(1 << 16))
        .and_then(|t| t.with_optimizer(Optimizer::adam(0.01)))
        .unwrap();
    let small = TableSpec::dense("small", &[8])
        .and_then(|t| t.with_optimizer(Optimizer::sgd(1.0)))
        .unwrap();
    ps.create_table(big.clone()).await.unwrap();
    ps.create_table(small.clone()).await.unwrap();
    let grad: Vec<f32> = (0..1 << 20).map(|i| (i % 7) as f32 - 3.0).collect();
    for _ in 0..3 {
        ps.push_dense("big", &grad).await.unwrap();
    }
    ps.push_dense("small", &[1.0; 8]).await.unwrap();
    let want_big = ps.pull_dense("big").await.unwrap();
    // The pushes are in the dense log, not yet in the store's cells.
    server.svc.kill();

    // 12 MiB: room for `small`, not for `big` (4 MiB of values and 8 MiB of Adam's state).
    let budget = (12 << 20).to_string();
    let server = spawn(&data, "127.0.0.1:0", &["--memory-budget-bytes", &budget]).await;
    let ps = connect(&server.addr).await;
    assert_eq!(ps.pull_dense("small").await.unwrap(), vec![-1.0; 8]);
    let stats = ps.stats().await.unwrap();
    let row = |name: &str| {
        stats[0]
            .tables
            .iter()
            .find(|t| t.name == name)
            .cloned()
            .unwrap()
    };
    assert!(
        row("big").load_error.contains("memory budget"),
        "{:?}",
        row("big")
    );
    assert_eq!(row("small").load_error, "");
    assert!(stats[0].memory_bytes <= 12 << 20 && stats[0].memory_bytes > 0);
    let mut raw = raw_client(&server.addr).await;
    let refused = raw
        .pull_dense(ps_proto::v1::PullDenseRequest {
            table: "big".into(),
            chunks: vec![0],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition, "{refused}");
    assert_eq!(
        reason_of(&refused).as_deref(),
        Some(reason::TABLE_NOT_LOADED)
    );
    let refused = ps.create_table(big.clone()).await.unwrap_err();
    assert_eq!(
        refused.reason(),
        Some(reason::TABLE_NOT_LOADED),
        "{refused}"
    );
    // A table that cannot be held is refused at create, and nothing of it is committed.
    let too_big = TableSpec::dense("too-big", &[1 << 22]).unwrap();
    let refused = ps.create_table(too_big).await.unwrap_err();
    assert_eq!(refused.reason(), Some(reason::RESOURCE_LIMIT), "{refused}");
    // A clean stop snapshots the loaded cells and moves the log's start past every record:
    // `big`'s records must be in the store by then.
    let stopped = server.svc.stop(Duration::from_secs(30)).await;
    assert!(stopped.is_some_and(|s| s.success()));

    // With room, `big` loads with every push it took.
    let mut server = spawn(&data, "127.0.0.1:0", &[]).await;
    let ps = connect(&server.addr).await;
    assert_eq!(ps.pull_dense("big").await.unwrap(), want_big);
    let names = table_names(&ps).await;
    assert_eq!(names, ["big", "small"]);
    server.svc.kill();

    // Dropped while unloaded, it is gone.
    let mut server = spawn(&data, "127.0.0.1:0", &["--memory-budget-bytes", &budget]).await;
    let ps = connect(&server.addr).await;
    ps.drop_table("big").await.unwrap();
    server.svc.kill();
    let server = spawn(&data, "127.0.0.1:0", &[]).await;
    let ps = connect(&server.addr).await;
    let names = table_names(&ps).await;
    assert_eq!(names, ["small"]);
    assert_eq!(ps.stats().await.unwrap()[0].tables.len(), 1);
}

/// A shard on a free port, its data in `dir/data`, started with `toml` as its config file.
async fn spawn_configured(dir: &Path, toml: &str) -> Server {
    let config = dir.join("shard.toml");
    std::fs::write(&config, toml).unwrap();
    spawn(
        &dir.join("data"),
        "127.0.0.1:0",
        &["--config", config.to_str().unwrap()],
    )
    .await
}

async fn connect(addr: &str) -> PsClient {
    PsClient::connect(client_config(addr)).await.unwrap()
}

async fn table_names(ps: &PsClient) -> Vec<String> {
    let tables = ps.list_tables().await.unwrap();
    tables.into_iter().map(|t| t.name.to_string()).collect()
}

/// The shard's bulk stream address, as its `ShardInfo` gives it.
async fn bulk_addr(addr: &str) -> String {
    let info = raw_client(addr)
        .await
        .shard_info(ps_proto::v1::ShardInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    format!("127.0.0.1:{}", info.bulk_port)
}

/// The head and header of a bulk push of `floats` raw f32 values into chunk 0 of `table`
/// (the body is the caller's to send).
fn bulk_push_head(table: &str, client_id: u64, floats: u64) -> (ps_proto::bulk::Head, Vec<u8>) {
    use prost::Message;
    let mut header = ps_proto::v1::PushDenseRequest {
        table: table.into(),
        push_id: only_push(client_id, 1),
        map_epoch: 0,
        slices: vec![ps_proto::v1::DenseSlice {
            chunk: 0,
            values: Some(ps_core::Payload::from_f32(&[]).into()),
        }],
        trace_context: Default::default(),
        authorization: String::new(),
    };
    header.slices[0].values.as_mut().unwrap().num_values = floats;
    let header = header.encode_to_vec();
    let head = ps_proto::bulk::Head {
        kind: ps_proto::bulk::PUSH_DENSE,
        header_len: header.len() as u32,
        body_len: floats * 4,
    };
    (head, header)
}

/// The resident memory of process `pid`, in bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap()
        * 1024
}

/// Twenty bulk senders that each announce a 48 MiB push, send half of it and stall hold no
/// more than the bulk stream's budget across connections (480 MB without it), and are closed once they have sent nothing for the call timeout; the stream then
/// serves well-formed calls as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_bulk_senders_hold_no_more_than_the_budget_and_are_closed() {
    use prost::Message;
    use ps_proto::bulk;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let mut server = spawn_configured(
        dir.path(),
        "bulk_frame_timeout_ms = 2000\nbulk_budget_bytes = 134217728\n",
    )
    .await;
    let ps = connect(&server.addr).await;
    let t = TableSpec::dense("t", &[1 << 24])
        .and_then(|t| t.with_chunk_elems(1 << 20))
        .unwrap();
    ps.create_table(t).await.unwrap();
    ps.push_dense("t", &vec![1.0; 1 << 24]).await.unwrap();
    let applied = ps.stats().await.unwrap()[0].pushes_applied;
    let bulk_addr = bulk_addr(&server.addr).await;
    let pid = server.svc.id();
    let before = rss(pid);

    // 48 MiB: under the request limit (64 MiB), so the shard reads it rather than refusing.
    let body: u64 = 48 << 20;
    let (head, header) = bulk_push_head("t", 5, body / 4);
    let half = vec![0u8; (body / 2) as usize];
    let senders: Vec<_> = (0..20)
        .map(|_| {
            let (addr, header, half) = (bulk_addr.clone(), header.clone(), half.clone());
            tokio::spawn(async move {
                let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
                sock.write_all(&head.encode()).await.unwrap();
                sock.write_all(&header).await.unwrap();
                // Half the body, then nothing: a sender the shard is not reading from yet
                // blocks here, with the rest in the sockets' buffers.
                let _ = tokio::time::timeout(Duration::from_secs(4), sock.write_all(&half)).await;
                // The shard closes the stalled call: the read ends (0 bytes or an error).
                let mut one = [0u8; 1];
                tokio::time::timeout(Duration::from_secs(20), sock.read(&mut one))
                    .await
                    .is_ok()
            })
        })
        .collect();
    let mut peak = before;
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(4) {
        peak = peak.max(rss(pid));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for s in senders {
        assert!(s.await.unwrap(), "a stalled sender was never closed");
    }
    let grew = peak.saturating_sub(before);
    println!("RSS {} MiB before, peak {} MiB", before >> 20, peak >> 20);
    assert!(
        grew < 200 << 20,
        "20 stalled senders grew the shard by {} MiB (budget 128 MiB)",
        grew >> 20
    );
    assert!(server.svc.check().is_ok());
    // The stream serves as before, and nothing of the stalled pushes was applied.
    let pulled = ps.pull_dense("t").await.unwrap();
    assert!(pulled.iter().all(|&v| v == -0.01), "{:?}", &pulled[..4]);
    ps.push_dense("t", &vec![1.0; 1 << 24]).await.unwrap();
    assert_eq!(ps.stats().await.unwrap()[0].pushes_applied, 2 * applied);
    let mut sock = tokio::net::TcpStream::connect(&bulk_addr).await.unwrap();
    let pull = ps_proto::v1::PullDenseRequest {
        table: "t".into(),
        chunks: vec![3],
        ..Default::default()
    }
    .encode_to_vec();
    bulk::write_frame(&mut sock, bulk::PULL_DENSE, &pull, &[])
        .await
        .unwrap();
    let (answer, _) = bulk::read_head(&mut sock, 1 << 20).await.unwrap().unwrap();
    assert_eq!((answer.kind, answer.body_len), (0, 4 << 20));
}

/// A bulk body arriving slower than the shard's reader asks to be woken for (it waits for
/// 256 KiB at a time) but with a byte within every `bulk_frame_timeout_ms` is read to the end
/// and applied: the timeout bounds the time without a byte, not without 256 KiB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_bulk_sender_with_a_byte_within_the_frame_timeout_is_read_and_applied() {
    use ps_proto::bulk;
    use tokio::io::AsyncWriteExt;
    let dir = tempfile::tempdir().unwrap();
    let server = spawn_configured(dir.path(), "bulk_frame_timeout_ms = 1000\n").await;
    let ps = connect(&server.addr).await;
    let floats = 1usize << 18; // 1 MiB
    ps.create_table(TableSpec::dense("t", &[floats as u64]).unwrap())
        .await
        .unwrap();
    let bulk_addr = bulk_addr(&server.addr).await;
    let (head, header) = bulk_push_head("t", 9, floats as u64);
    let body: Vec<u8> = (0..floats).flat_map(|_| 1.0f32.to_le_bytes()).collect();
    let mut sock = tokio::net::TcpStream::connect(&bulk_addr).await.unwrap();
    sock.set_nodelay(true).unwrap();
    sock.write_all(&head.encode()).await.unwrap();
    sock.write_all(&header).await.unwrap();
    // 100 KiB at once, then 4 KiB every 400 ms for 2.4 s (more than the timeout, less than
    // 256 KiB in all), then the rest.
    let mut sent = 100 << 10;
    sock.write_all(&body[..sent]).await.unwrap();
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_millis(400)).await;
        sock.write_all(&body[sent..sent + 4096]).await.unwrap();
        sent += 4096;
    }
    sock.write_all(&body[sent..]).await.unwrap();
    let (answer, _) =
        tokio::time::timeout(Duration::from_secs(10), bulk::read_head(&mut sock, 1 << 20))
            .await
            .expect("an answer")
            .expect("the stream stays open")
            .expect("an answer, not a close");
    assert_eq!(answer.kind, 0, "the push is accepted");
    assert_eq!(ps.stats().await.unwrap()[0].pushes_applied, 1);
    let pulled = ps.pull_dense("t").await.unwrap();
    assert!(pulled.iter().all(|&v| v != 0.0), "{:?}", &pulled[..4]);
}

/// Dense pushes committed on the connections' threads while the writer is idle (the combining
/// queue, `inline_push_bytes`) are as durable and exactly-once as the writer's: three clients
/// push at once into a small log (so that images, the writer's work, interleave with them;
/// one client pulls with each push, in one exchange), the shard is killed with -9 among their
/// pushes and restarted, and every push is applied once. With `inline_push_bytes = 0` every push goes through the writer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dense_pushes_committed_inline_survive_kill_9_exactly_once() {
    const N: usize = 300_000;
    const PUSHES: usize = 40;
    let dir = tempfile::tempdir().unwrap();
    let toml = "[rocksdb]\ndense_log_mib = 8\n";
    let mut server = spawn_configured(dir.path(), toml).await;
    let port = server.addr.rsplit(':').next().unwrap().to_owned();
    let ps = connect(&server.addr).await;
    ps.create_table(
        TableSpec::dense("w", &[N as u64])
            .unwrap()
            .with_optimizer(Optimizer::sgd(1.0))
            .unwrap(),
    )
    .await
    .unwrap();
    let acked = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut pushers = Vec::new();
    for k in 0..3 {
        // A client each, without lz4 (constant gradients would shrink and go by gRPC).
        let mut cfg = client_config(&server.addr);
        cfg.codec.push.lz4.enabled = false;
        cfg.client_id = Some(100 + k);
        let ps = PsClient::connect(cfg).await.unwrap();
        let acked = acked.clone();
        pushers.push(tokio::spawn(async move {
            let mut out = vec![0.0f32; N];
            for step in 1..=PUSHES {
                if k == 2 {
                    // Pushes and pulls in one exchange each (the bulk stream's push-and-pull):
                    // every value pulled holds at least this client's own pushes.
                    ps.push_pull_dense("w", &vec![-1.0; N], &mut out)
                        .await
                        .unwrap();
                    let least = out.iter().copied().fold(f32::MAX, f32::min);
                    assert!(least >= step as f32, "step {step}: {least}");
                } else {
                    ps.push_dense("w", &vec![-1.0; N]).await.unwrap();
                }
                acked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        }));
    }
    while acked.load(std::sync::atomic::Ordering::SeqCst) < 30 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let inline = metric(&server, "ps_pushes_inline_total").await;
    server.svc.kill();
    let at_kill = acked.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        at_kill < 3 * PUSHES,
        "the kill must land while pushes remain"
    );
    assert!(inline > 0.0, "no push was committed inline");
    let config = dir.path().join("shard.toml");
    let args = ["--config", config.to_str().unwrap()];
    let mut server = spawn(
        &dir.path().join("data"),
        &format!("127.0.0.1:{port}"),
        &args,
    )
    .await;
    for p in pushers {
        p.await.unwrap();
    }
    let w = connect(&server.addr).await.pull_dense("w").await.unwrap();
    assert_eq!(
        w,
        vec![(3 * PUSHES) as f32; N],
        "killed after {at_kill} pushes"
    );
    server.svc.kill();

    // The same data directory with inline commits off: the writer commits every push.
    std::fs::write(&config, format!("inline_push_bytes = 0\n{toml}")).unwrap();
    let mut server = spawn(
        &dir.path().join("data"),
        &format!("127.0.0.1:{port}"),
        &args,
    )
    .await;
    let ps = connect(&server.addr).await;
    for _ in 0..5 {
        ps.push_dense("w", &vec![-1.0; N]).await.unwrap();
    }
    assert_eq!(metric(&server, "ps_pushes_inline_total").await, 0.0);
    let w = ps.pull_dense("w").await.unwrap();
    assert_eq!(w, vec![(3 * PUSHES + 5) as f32; N]);
    server.svc.kill();
}
