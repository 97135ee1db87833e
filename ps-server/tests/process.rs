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
}

/// Starts `ps-server` on `listen` with its data in `data_dir` (its log in `logs/` beside it)
/// and waits until it serves.
async fn spawn(data_dir: &Path, listen: &str, extra: &[&str]) -> Server {
    let mut args: Vec<String> = ["--data-dir", data_dir.to_str().unwrap(), "--listen", listen]
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
    }
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
/// retried after the restart is recognised from the log alone.
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
    let pushes = 23;
    for k in 0..pushes {
        ps.push_dense("count", &vec![-1.0; n]).await.unwrap();
        let g: Vec<f32> = (0..n).map(|i| ((i * 7 + k) % 13) as f32 - 6.0).collect();
        ps.push_dense("adam", &g).await.unwrap();
    }
    let push = pb::PushDenseRequest {
        table: "raw".into(),
        push_id: only_push(77, 5),
        map_epoch: 0,
        slices: vec![pb::DenseSlice {
            chunk: 0,
            values: Some(ps_core::Payload::from_f32(&[-2.0; 1000]).into()),
        }],
    };
    let mut raw = raw_client(&server.addr).await;
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
    assert_eq!(ps.pull_dense("raw").await.unwrap(), vec![2.0; 1000]);
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
