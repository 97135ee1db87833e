//! What a platform team scrapes, from real processes: every family a dashboard or an alert
//! reads exists from start-up (zeros where the labels are known), workers serve `/metrics`
//! while they train (step time by phase, examples, loss, bytes, compression ratio), every
//! service reports its process's CPU, memory and file descriptors, no series carries a label
//! named `job` (Prometheus's own), and a job's cost shows in the scheduler's metrics and in
//! `psctl status`.
//!
//! Needs the workspace's binaries (`cargo build --release` puts them next to the test).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use ps_client::scheduler::SchedulerClient;
use ps_core::status::JobState;
use ps_tests::spawn;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn scrape(addr: SocketAddr) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).await.unwrap();
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    text
}

/// The value of the one series of `text` that starts with `series` (name and labels).
fn value(text: &str, series: &str) -> f64 {
    let line = text
        .lines()
        .find(|l| l.starts_with(series))
        .unwrap_or_else(|| panic!("no series {series}"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

/// Every family of `families` has a TYPE line and at least one series; no series is labelled
/// `job`; the process's own figures are there.
fn check_families(service: &str, text: &str, families: &[&str]) {
    for f in families.iter().chain(&[
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_max_fds",
        "process_start_time_seconds",
        "ps_build_info",
        "ps_tls_handshake_failures_total",
        "ps_auth_refusals_total",
    ]) {
        assert!(
            text.contains(&format!("# TYPE {f} ")),
            "{service}: no family {f} at start-up:\n{text}"
        );
        assert!(
            text.lines()
                .any(|l| l.starts_with(f) && !l.starts_with('#')),
            "{service}: family {f} has no series:\n{text}"
        );
    }
    for l in text.lines().filter(|l| !l.starts_with('#')) {
        assert!(
            !l.contains("{job=") && !l.contains(",job="),
            "{service}: a series labelled `job`, which Prometheus renames: {l}"
        );
    }
    assert!(
        value(text, "process_resident_memory_bytes") > 1e6,
        "{service}"
    );
    assert!(value(text, "process_open_fds") >= 3.0, "{service}");
}

fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn families_exist_from_start_up_workers_serve_metrics_and_jobs_show_their_cost() {
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("logs");
    let d = |n: &str| dir.path().join(n).display().to_string();
    let mut sched = spawn(
        "scheduler",
        "scheduler",
        &[
            "--data-dir",
            &d("scheduler"),
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
        ],
        &logs,
        true,
    );
    let ready = sched.ready(Duration::from_secs(60)).await.unwrap();
    let (url, sched_metrics) = (ready.url(), ready.metrics.unwrap());
    let mut shard = spawn(
        "ps-server",
        "shard-0",
        &[
            "--data-dir",
            &d("shard-0"),
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
            "--scheduler",
            &url,
        ],
        &logs,
        true,
    );
    let shard_metrics = shard
        .ready(Duration::from_secs(60))
        .await
        .unwrap()
        .metrics
        .unwrap();

    // Before any job or table: every family the dashboard and the alerts read.
    let text = scrape(shard_metrics).await;
    check_families(
        "ps-server",
        &text,
        &[
            "ps_rpc_requests_total",
            "ps_rpc_duration_seconds",
            "ps_apply_seconds",
            "ps_group_commit_size",
            "ps_store_write_seconds",
            "ps_bulk_connections_total",
            "ps_rows_write_back_seconds",
            "ps_rows_written_back_total",
            "ps_sparse_rows_dirty",
            "ps_sparse_rows_pending",
            "ps_disk_free_bytes",
            "ps_disk_total_bytes",
        ],
    );
    for method in ["PushDense", "PullDense", "PushSparse", "PullSparse"] {
        let series = format!(
            "ps_rpc_requests_total{{rpc_service=\"ps.v1.ParameterServer\",rpc_method=\"{method}\",code=\"Ok\"}}"
        );
        assert_eq!(value(&text, &series), 0.0, "{series}");
    }
    let t0 = Instant::now();
    let text = loop {
        // The scheduler's gauges come with its first tick after the shard registered.
        let text = scrape(sched_metrics).await;
        if text.contains("ps_sched_shards_registered 1") || t0.elapsed() > Duration::from_secs(10) {
            break text;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    check_families(
        "scheduler",
        &text,
        &[
            "ps_rpc_requests_total",
            "ps_sched_map_epoch",
            "ps_sched_shards_registered",
            "ps_sched_shards_expected",
            "ps_disk_free_bytes",
        ],
    );
    assert_eq!(value(&text, "ps_sched_shards_registered"), 1.0);

    // A job: its series exist once it is known, before any clock.
    let spec = ps_worker::job::job_from_toml(
        "name = \"cost\"\nconsistency = \"ssp\"\nstaleness = 2\nnum_shards = 1\n\
         num_workers = 1\ndataset = \"synthetic-dense:1000:8:2\"\nmodel = \"counter:4096:20\"\n\
         global_batch = 16\nmax_clocks = 120\n",
    )
    .unwrap();
    let client = SchedulerClient::connect(&url).await.unwrap();
    client.submit(&spec).await.unwrap();
    let t0 = Instant::now();
    let text = loop {
        let text = scrape(sched_metrics).await;
        if text.contains("ps_sched_job_state{ps_job=\"cost\"")
            || t0.elapsed() > Duration::from_secs(10)
        {
            break text;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    check_families(
        "scheduler",
        &text,
        &[
            "ps_sched_job_state",
            "ps_sched_min_clock",
            "ps_sched_max_clock",
            "ps_sched_live_workers",
            "ps_sched_expected_workers",
            "ps_sched_staleness_max",
            "ps_sched_staleness_bound",
            "ps_sched_clock_advances_total",
            "ps_sched_checkpoints_total",
            "ps_sched_job_cpu_seconds",
            "ps_sched_job_bytes_moved",
            "ps_sched_job_wall_seconds",
            "ps_sched_param_age_seconds",
        ],
    );
    assert_eq!(
        value(&text, "ps_sched_staleness_bound{ps_job=\"cost\"}"),
        2.0
    );

    // A worker serving metrics while it trains (20 ms a clock: 120 clocks take over 2 s).
    let worker_metrics = free_addr();
    let mut worker = spawn(
        "worker",
        "worker-0",
        &[
            "--scheduler",
            &url,
            "--job",
            "cost",
            "--name",
            "w0",
            "--metrics-listen",
            &worker_metrics.to_string(),
        ],
        &logs,
        false,
    );
    let t0 = Instant::now();
    let text = loop {
        if let Ok(s) = tokio::net::TcpStream::connect(worker_metrics).await {
            drop(s);
            let text = scrape(worker_metrics).await;
            if text
                .lines()
                .find(|l| l.starts_with("ps_worker_steps_total"))
                .is_some_and(|l| !l.ends_with(" 0"))
            {
                break text;
            }
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the worker served no steps:\n{}",
            worker.tail()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    check_families(
        "worker",
        &text,
        &[
            "ps_worker_step_seconds",
            "ps_worker_steps_total",
            "ps_worker_examples_total",
            "ps_worker_examples_per_second",
            "ps_worker_loss",
            "ps_worker_train_accuracy",
            "ps_worker_test_accuracy",
            "ps_worker_push_wire_bytes_total",
            "ps_worker_push_raw_bytes_total",
            "ps_worker_compression_ratio",
            "ps_worker_row_residual_rows",
            "ps_worker_row_residuals_evicted_total",
        ],
    );
    // The scheduler's per-member histograms exist once the worker has joined; the shard's
    // per-table series once the job's table exists.
    let text_sched = scrape(sched_metrics).await;
    check_families(
        "scheduler",
        &text_sched,
        &["ps_sched_clock_gap_size", "ps_sched_wait_seconds"],
    );
    let text_shard = scrape(shard_metrics).await;
    check_families(
        "ps-server",
        &text_shard,
        &[
            "ps_push_requests_total",
            "ps_push_values_total",
            "ps_push_skipped_non_finite_total",
            "ps_pull_requests_total",
            "ps_pull_values_total",
        ],
    );
    assert_eq!(
        value(
            &text_shard,
            "ps_push_skipped_non_finite_total{table=\"cost/count\"}"
        ),
        0.0
    );
    let labels = "ps_job=\"cost\",worker=\"w0\"";
    for phase in ["pull", "data", "compute", "encode", "push", "wait"] {
        let count = value(
            &text,
            &format!("ps_worker_step_seconds_count{{{labels},phase=\"{phase}\"}}"),
        );
        assert!(count >= 1.0, "phase {phase}: {count}");
    }
    // The counter model computes for 20 ms a step: compute is most of a step.
    let sum = |phase: &str| {
        value(
            &text,
            &format!("ps_worker_step_seconds_sum{{{labels},phase=\"{phase}\"}}"),
        )
    };
    let steps = value(&text, &format!("ps_worker_steps_total{{{labels}}}"));
    assert!(sum("compute") >= 0.019 * steps, "{}", sum("compute"));
    // 4096 values a step, as f32 before the codec; all -1, so lz4 takes most of it away.
    let raw = value(
        &text,
        &format!("ps_worker_push_raw_bytes_total{{{labels}}}"),
    );
    let wire = value(
        &text,
        &format!("ps_worker_push_wire_bytes_total{{{labels}}}"),
    );
    assert_eq!(raw, 16384.0 * steps);
    assert!(wire > 0.0 && wire < raw / 4.0, "{wire} of {raw}");
    let ratio = value(&text, &format!("ps_worker_compression_ratio{{{labels}}}"));
    assert!(ratio > 4.0, "{ratio}");
    assert_eq!(
        value(&text, &format!("ps_worker_examples_total{{{labels}}}")),
        16.0 * steps
    );

    let status = worker
        .wait(Duration::from_secs(120))
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("the worker did not finish:\n{}", worker.tail()));
    assert!(status.success(), "{}", worker.tail());
    let st = client.job("cost").await.unwrap();
    assert_eq!(st.state, JobState::Succeeded, "{}", st.message);

    // The job's cost: the shards' statistics are read every 5 s. The bytes moved are the
    // payload bytes the shard counted for the job's table, both ways.
    let shard_text = scrape(shard_metrics).await;
    let table_bytes: f64 = shard_text
        .lines()
        .filter(|l| l.starts_with("ps_wire_bytes_total{") && l.contains("table=\"cost/count\""))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum();
    assert!(table_bytes > 16384.0, "{shard_text}");
    let t0 = Instant::now();
    let cost = loop {
        let c = client.job("cost").await.unwrap().cost;
        if c.bytes_moved as f64 == table_bytes || t0.elapsed() > Duration::from_secs(20) {
            break c;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert_eq!(cost.bytes_moved as f64, table_bytes, "{cost:?}");
    // One table of 4096 f32 (SGD keeps no state), with the cells' bookkeeping.
    assert!((16384..2 * 16384).contains(&cost.bytes_stored), "{cost:?}");
    assert!(cost.worker_cpu_seconds > 0.0, "{cost:?}");
    assert!(cost.shard_cpu_seconds > 0.0, "{cost:?}");
    // The worker computed (slept) 20 ms a clock: the wall time covers at least that.
    assert!(cost.wall_seconds >= 2.4, "{cost:?}");
    // The wall time stopped at the end.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let later = client.job("cost").await.unwrap().cost;
    assert_eq!(later.wall_seconds, cost.wall_seconds);

    // In `psctl status` and in the scheduler's metrics.
    let out = std::process::Command::new(ps_launch::binary("psctl").unwrap())
        .args(["--scheduler", &url, "status", "cost"])
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{printed}");
    let line = printed
        .lines()
        .find(|l| l.trim_start().starts_with("cost"))
        .unwrap_or_else(|| panic!("no cost line:\n{printed}"));
    assert!(line.contains(" stored 16."), "{line}");
    let text = scrape(sched_metrics).await;
    assert_eq!(
        value(&text, "ps_sched_job_bytes_stored{ps_job=\"cost\"}"),
        cost.bytes_stored as f64
    );
    assert!(
        value(
            &text,
            "ps_sched_job_cpu_seconds{ps_job=\"cost\",side=\"workers\""
        ) > 0.0
    );
    assert_eq!(
        value(
            &text,
            "ps_sched_job_state{ps_job=\"cost\",state=\"succeeded\"}"
        ),
        1.0
    );
}
