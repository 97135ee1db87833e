//! Traces across processes, through a real OTLP collector: `rotel` (from PyPI; the test command
//! installs it under target/rotel, or set `PS_ROTEL_AGENT`) prints every span it receives. A
//! scheduler, a shard and a worker run as child processes exporting to it; one training step's
//! trace must hold the worker's step with its pull, compute, push and clock-wait children, and
//! the shard's and the scheduler's server spans for that step's calls, under one trace id. The
//! worker's JSON log lines carry the trace ids the collector got.
//!
//! Needs the workspace's binaries (`cargo build --release` puts them next to the test).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ps_client::scheduler::SchedulerClient;
use ps_core::status::JobState;
use ps_launch::Service;

/// The collector's binary: `PS_ROTEL_AGENT`, or the one `scripts/test.sh` installs.
fn rotel_agent() -> PathBuf {
    if let Some(p) = std::env::var_os("PS_ROTEL_AGENT") {
        return PathBuf::from(p);
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let lib = root.join("target/rotel/lib");
    let found = std::fs::read_dir(&lib).ok().and_then(|mut d| {
        d.find_map(|e| {
            let p = e.ok()?.path().join("site-packages/rotel/rotel-agent");
            p.exists().then_some(p)
        })
    });
    found.unwrap_or_else(|| {
        panic!(
            "no rotel-agent under {}: run scripts/rotel.sh (scripts/test.sh does) or set \
             PS_ROTEL_AGENT",
            lib.display()
        )
    })
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One span as the collector printed it.
#[derive(Debug, Clone, Default)]
struct Span {
    service: String,
    trace: String,
    id: String,
    parent: String,
    name: String,
}

/// The spans in rotel's detailed debug log: each under the `service.name` of its resource.
fn parse_spans(log: &str) -> Vec<Span> {
    let mut spans = Vec::new();
    let mut service = String::new();
    let mut cur: Option<Span> = None;
    let value = |line: &str| {
        line.split_once(':')
            .map(|(_, v)| v.trim().to_owned())
            .unwrap_or_default()
    };
    for line in log.lines() {
        let t = line.trim();
        if let Some(rest) = t.split_once("service.name:").map(|(_, r)| r.trim()) {
            service = rest
                .trim_start_matches("Str(")
                .trim_end_matches(')')
                .to_owned();
        } else if t.starts_with("Span #") {
            spans.extend(cur.take());
            cur = Some(Span {
                service: service.clone(),
                ..Span::default()
            });
        } else if let Some(s) = cur.as_mut() {
            if t.starts_with("Trace ID") {
                s.trace = value(t);
            } else if t.starts_with("Parent ID") {
                s.parent = value(t);
            } else if t.starts_with("ID") {
                s.id = value(t);
            } else if t.starts_with("Name") && s.name.is_empty() {
                s.name = value(t);
            } else if t.starts_with("ResourceSpans #") {
                spans.extend(cur.take());
            }
        }
    }
    spans.extend(cur);
    spans
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_id_crosses_the_worker_the_shard_and_the_scheduler() {
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let port = free_port();
    let collected = logs.join("rotel.log");
    let mut rotel = Command::new(rotel_agent())
        .args([
            "start",
            "--exporter",
            "blackhole",
            "--debug-log",
            "traces",
            "--debug-log-verbosity",
            "detailed",
            "--otlp-grpc-endpoint",
            &format!("127.0.0.1:{port}"),
            "--otlp-http-endpoint",
            &format!("127.0.0.1:{}", free_port()),
        ])
        .stdout(std::fs::File::create(&collected).unwrap())
        .stderr(Stdio::from(
            std::fs::File::create(logs.join("rotel.err")).unwrap(),
        ))
        .spawn()
        .expect("rotel-agent starts");
    let t0 = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "rotel never listened on {port}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let endpoint = format!("http://127.0.0.1:{port}");
    let env = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("OTEL_BSP_SCHEDULE_DELAY", "200"),
        ("OTEL_TRACES_SAMPLER", "parentbased_always_on"),
        ("PS_LOG_FORMAT", "json"),
    ];
    let spawn = |bin: &str, name: &str, args: Vec<String>, ready: bool| {
        let bin = ps_launch::binary(bin).unwrap();
        Service::spawn_with_env(&bin, name, &args, &logs, ready, &env).unwrap()
    };
    let arg = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let sched_dir = dir.path().join("scheduler").display().to_string();
    let mut sched = spawn(
        "scheduler",
        "scheduler",
        arg(&["--data-dir", &sched_dir, "--listen", "127.0.0.1:0"]),
        true,
    );
    let url = sched
        .ready(Duration::from_secs(60))
        .await
        .expect("scheduler ready")
        .url();
    let shard_dir = dir.path().join("shard-0").display().to_string();
    let mut shard = spawn(
        "ps-server",
        "shard-0",
        arg(&[
            "--data-dir",
            &shard_dir,
            "--listen",
            "127.0.0.1:0",
            "--scheduler",
            &url,
        ]),
        true,
    );
    shard
        .ready(Duration::from_secs(60))
        .await
        .expect("shard ready");
    let spec = ps_worker::job::job_from_toml(
        "name = \"traced\"\nconsistency = \"bsp\"\nnum_shards = 1\nnum_workers = 1\n\
         dataset = \"synthetic-dense:2000:32:4\"\nmodel = \"softmax\"\nglobal_batch = 64\n\
         max_clocks = 20\n",
    )
    .unwrap();
    let client = SchedulerClient::connect(&url).await.unwrap();
    client.submit(&spec).await.unwrap();
    let mut worker = spawn(
        "worker",
        "worker-0",
        arg(&["--scheduler", &url, "--job", "traced", "--name", "w0"]),
        false,
    );
    let status = worker
        .wait(Duration::from_secs(120))
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("the worker did not finish:\n{}", worker.tail()));
    assert!(status.success(), "the worker failed:\n{}", worker.tail());
    let st = client.job("traced").await.unwrap();
    assert_eq!(st.state, JobState::Succeeded, "{}", st.message);
    // A stopped service flushes its spans.
    shard.stop(Duration::from_secs(20)).await;
    sched.stop(Duration::from_secs(20)).await;

    // Every step's spans reach the collector; wait until the last one has.
    let t0 = Instant::now();
    let spans = loop {
        let spans = parse_spans(&std::fs::read_to_string(&collected).unwrap());
        let steps = spans.iter().filter(|s| s.name == "train.step").count();
        if steps >= 20 || t0.elapsed() > Duration::from_secs(30) {
            break spans;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let _ = rotel.kill();
    let _ = rotel.wait();
    let log = std::fs::read_to_string(&collected).unwrap();
    let steps: Vec<&Span> = spans.iter().filter(|s| s.name == "train.step").collect();
    assert_eq!(
        steps.len(),
        20,
        "one step span per clock; the collector printed:\n{}",
        &log[..log.len().min(20_000)]
    );
    // Step 5's trace (a clock in the middle: a pull, a push and a clock report).
    let step = steps
        .iter()
        .find(|s| {
            spans
                .iter()
                .any(|c| c.parent == s.id && c.name == "pull" && c.trace == s.trace)
        })
        .expect("a step with a pull");
    let trace: Vec<&Span> = spans.iter().filter(|s| s.trace == step.trace).collect();
    let services: BTreeSet<&str> = trace.iter().map(|s| s.service.as_str()).collect();
    let names: BTreeMap<&str, BTreeSet<&str>> = trace.iter().fold(BTreeMap::new(), |mut m, s| {
        m.entry(s.service.as_str())
            .or_default()
            .insert(s.name.as_str());
        m
    });
    eprintln!("one step's trace {}: {names:?}", step.trace);
    assert_eq!(
        services,
        BTreeSet::from(["ps-server", "scheduler", "worker"]),
        "{names:?}"
    );
    for child in ["pull", "compute", "push", "clock_wait"] {
        assert!(
            trace.iter().any(|s| s.name == child && s.parent == step.id),
            "no `{child}` under the step: {names:?}"
        );
    }
    // The shard answered this step's push and pull inside it (on the bulk stream), and the
    // scheduler its clock report.
    let shard = &names["ps-server"];
    assert!(
        shard.contains("ps.v1.ParameterServer/PushDense")
            && shard.contains("ps.v1.ParameterServer/PullDense"),
        "{names:?}"
    );
    assert!(
        names["scheduler"].contains("ps.v1.Scheduler/AdvanceClock"),
        "{names:?}"
    );
    // Every server span has its parent in the same trace: the context crossed, not a copy of
    // the id.
    let ids: BTreeSet<&str> = trace.iter().map(|s| s.id.as_str()).collect();
    for s in trace.iter().filter(|s| s.service != "worker") {
        assert!(ids.contains(s.parent.as_str()), "orphan {s:?}");
    }
    // Logs join up: every service wrote JSON lines, and a line written inside a traced call
    // (the scheduler's "worker joined", inside JoinJob) carries a trace id the collector got.
    for name in ["scheduler", "shard-0", "worker-0"] {
        let text = std::fs::read_to_string(logs.join(format!("{name}.log"))).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| {
                serde_json::from_str(l).unwrap_or_else(|e| panic!("{name}: not JSON ({e}): {l}"))
            })
            .collect();
        assert!(!lines.is_empty(), "{name} logged nothing");
        if name == "scheduler" {
            let joined = lines
                .iter()
                .find(|l| l["message"] == "worker joined")
                .expect("the scheduler logged the join");
            let id = joined["trace_id"]
                .as_str()
                .expect("a trace id on the join's line");
            assert!(
                spans
                    .iter()
                    .any(|s| s.trace == id && s.name == "ps.v1.Scheduler/JoinJob"),
                "the join's log line names trace {id}, which the collector did not get"
            );
        }
    }
}
