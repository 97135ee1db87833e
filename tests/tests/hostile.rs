//! The hostile-input corpus (`tests/corpus/*.jsonl`): requests no client of the project would
//! send, each with the code it must be answered with, sent to real services started as child
//! processes (the shard under an address-space limit, so a request that made it allocate
//! without bound would kill it). After every case the service must still be SERVING and its
//! state unchanged: tables, counters and memory for a shard; jobs, workers, clocks and the map
//! for the scheduler. A case is one JSON line:
//!
//! - gRPC (`shard.jsonl`, `scheduler.jsonl`): `method`, and `request` (proto3 JSON, turned into
//!   the wire message through the services' own descriptors) or `raw_hex` (the message bytes
//!   as sent); `code` (a `google.rpc.Code` name) and optionally `reason` (the ErrorInfo reason).
//! - bulk stream (`bulk.jsonl`): `kind` (method), `header` (proto3 JSON of the request) or
//!   `header_hex`, `body_len` (claimed) and `body` (`zeros`, `nan`, `nan_last`: zeros but a
//!   NaN as the last value, or `none`: what is sent), or
//!   `frame_hex` for bytes as sent; `code`, or `"closed"` when the shard must close the stream.
//!
//! In a `request`, a string `"$repeat:N:V"` stands for an array of N copies of V, and
//! `"$range:A:B"` for the numbers A..B.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use prost::Message;
use prost_reflect::{DescriptorPool, DynamicMessage};
use ps_launch::{Service, binary};
use ps_proto::bulk;
use ps_proto::v1 as pb;
use ps_tests::raw::call;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tonic::transport::Channel;
use tonic_types::StatusExt;

/// The shard's address-space limit: far below what the unbounded cases would allocate (26 GB
/// and more), with room for the address space threads and allocator arenas reserve.
const ADDRESS_SPACE: u64 = 16 << 30;

/// The shard's memory budget for tables, so that the cases over it do not depend on the
/// machine's memory.
const MEMORY_BUDGET: u64 = 2 << 30;

fn corpus(file: &str) -> Vec<Value> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(file);
    let text = std::fs::read_to_string(&path).expect("the corpus file");
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{}: {e}: {l}", path.display())))
        .collect()
}

/// Expands `"$repeat:N:V"` and `"$range:A:B"` strings into arrays.
fn expand(v: Value) -> Value {
    match v {
        Value::String(s) if s.starts_with("$repeat:") => {
            let mut parts = s.splitn(3, ':').skip(1);
            let n: usize = parts
                .next()
                .and_then(|n| n.parse().ok())
                .expect("$repeat:N:V");
            let item: Value =
                serde_json::from_str(parts.next().expect("$repeat:N:V")).expect("V is JSON");
            Value::Array(vec![item; n])
        }
        Value::String(s) if s.starts_with("$range:") => {
            let mut parts = s
                .splitn(3, ':')
                .skip(1)
                .map(|n| n.parse::<u64>().expect("$range:A:B"));
            let (a, b) = (parts.next().expect("A"), parts.next().expect("B"));
            Value::Array((a..b).map(Value::from).collect())
        }
        Value::Array(a) => Value::Array(a.into_iter().map(expand).collect()),
        Value::Object(o) => Value::Object(o.into_iter().map(|(k, v)| (k, expand(v))).collect()),
        v => v,
    }
}

fn text<'a>(case: &'a Value, key: &str) -> Option<&'a str> {
    case.get(key).and_then(Value::as_str)
}

fn code_named(name: &str) -> tonic::Code {
    use tonic::Code::*;
    [
        Ok,
        Cancelled,
        Unknown,
        InvalidArgument,
        DeadlineExceeded,
        NotFound,
        AlreadyExists,
        PermissionDenied,
        ResourceExhausted,
        FailedPrecondition,
        Aborted,
        OutOfRange,
        Unimplemented,
        Internal,
        Unavailable,
        DataLoss,
        Unauthenticated,
    ]
    .into_iter()
    .find(|c| format!("{c:?}").to_ascii_uppercase().replace('_', "") == name.replace('_', ""))
    .unwrap_or_else(|| panic!("unknown code {name}"))
}

/// The wire message of a case: its raw bytes, or its JSON request as `method`'s input type.
fn message(pool: &DescriptorPool, service: &str, case: &Value) -> Vec<u8> {
    if let Some(hex) = text(case, "raw_hex") {
        return from_hex(hex);
    }
    let method = text(case, "method").expect("method");
    let svc = pool
        .get_service_by_name(&format!("ps.v1.{service}"))
        .expect("the service");
    let m = svc
        .methods()
        .find(|m| m.name() == method)
        .unwrap_or_else(|| panic!("no method {method}"));
    json_message(pool, m.input().full_name(), case.get("request"))
}

fn json_message(pool: &DescriptorPool, type_name: &str, json: Option<&Value>) -> Vec<u8> {
    let desc = pool.get_message_by_name(type_name).expect("the type");
    let json = expand(json.cloned().unwrap_or(Value::Object(Default::default())));
    DynamicMessage::deserialize(desc, json)
        .unwrap_or_else(|e| panic!("{type_name}: {e}"))
        .encode_to_vec()
}

fn from_hex(hex: &str) -> Vec<u8> {
    let hex: String = hex.chars().filter(|c| !c.is_whitespace()).collect();
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
        .collect()
}

/// Checks one answer against the case; returns a line for the report when it differs.
fn judge(name: &str, case: &Value, got: Result<Vec<u8>, tonic::Status>) -> Option<String> {
    let want = code_named(text(case, "code").expect("code"));
    let status = match got {
        Ok(_) if want == tonic::Code::Ok => return None,
        Ok(_) => return Some(format!("{name}: answered OK, want {want:?}")),
        Err(s) => s,
    };
    if status.code() != want {
        return Some(format!(
            "{name}: answered {:?} ({}), want {want:?}",
            status.code(),
            status.message()
        ));
    }
    if let Some(reason) = text(case, "reason") {
        let got = status
            .get_error_details()
            .error_info()
            .map(|i| i.reason.clone())
            .unwrap_or_default();
        if got != reason {
            return Some(format!("{name}: reason {got:?}, want {reason:?}"));
        }
    }
    None
}

async fn serving(ch: &Channel) -> bool {
    let mut h = tonic_health::pb::health_client::HealthClient::new(ch.clone());
    matches!(
        h.check(tonic_health::pb::HealthCheckRequest::default()).await,
        Ok(r) if r.get_ref().status == tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    )
}

/// What no refused call may change on a shard: its tables, their counters, its memory.
async fn shard_state(ch: &Channel) -> String {
    let tables = call(ch, "ParameterServer", "ListTables", Vec::new())
        .await
        .expect("ListTables");
    let tables = pb::ListTablesResponse::decode(&tables[..]).expect("tables");
    let stats = call(ch, "ParameterServer", "GetStats", Vec::new())
        .await
        .expect("GetStats");
    let s = pb::GetStatsResponse::decode(&stats[..]).expect("stats");
    let per_table: Vec<_> = s
        .tables
        .iter()
        .map(|t| {
            (
                &t.name,
                t.rows,
                t.pushes,
                t.values_pushed,
                &t.load_error,
                t.memory_bytes,
            )
        })
        .collect();
    format!(
        "{:?} {:?} applied={} duplicate={} memory={}",
        tables.tables, per_table, s.pushes_applied, s.pushes_duplicate, s.memory_bytes
    )
}

/// What no refused call may change on the scheduler: jobs, their members and clocks, the map.
async fn scheduler_state(ch: &Channel) -> String {
    let jobs = call(ch, "Scheduler", "ListJobs", Vec::new())
        .await
        .expect("ListJobs");
    let jobs = pb::ListJobsResponse::decode(&jobs[..]).expect("jobs");
    let map = call(ch, "Scheduler", "GetShardMap", Vec::new())
        .await
        .expect("GetShardMap");
    let map = pb::ShardMap::decode(&map[..]).expect("map");
    let jobs: Vec<_> = jobs
        .jobs
        .iter()
        .map(|j| {
            let workers: Vec<_> = j
                .workers
                .iter()
                .map(|w| (w.worker_id, w.live, w.clock))
                .collect();
            (
                j.spec.as_ref().map(|s| s.name.clone()),
                j.state,
                j.min_clock,
                j.max_clock,
                workers,
            )
        })
        .collect();
    format!("{jobs:?} {map:?}")
}

/// A shard process with no scheduler, under the address-space limit, with a short bulk-call
/// timeout (for the stalled-sender case).
async fn hostile_shard(root: &Path) -> (Service, ps_runtime::ready::Ready) {
    let config = root.join("shard.toml");
    std::fs::write(
        &config,
        "bulk_frame_timeout_ms = 1500\nbulk_budget_bytes = 268435456\n",
    )
    .unwrap();
    let server = binary("ps-server").expect("the ps-server binary");
    let args: Vec<String> = vec![
        format!("--as={ADDRESS_SPACE}"),
        "--".into(),
        server.display().to_string(),
        "--config".into(),
        config.display().to_string(),
        "--data-dir".into(),
        root.join("shard").display().to_string(),
        "--listen".into(),
        "127.0.0.1:0".into(),
        "--memory-budget-bytes".into(),
        MEMORY_BUDGET.to_string(),
    ];
    let prlimit = PathBuf::from("/usr/bin/prlimit");
    assert!(
        prlimit.exists(),
        "prlimit (util-linux) runs the shard under a memory limit"
    );
    let mut s = Service::spawn(&prlimit, "hostile-shard", &args, &root.join("logs"), true)
        .expect("the shard starts");
    let ready = s.ready(Duration::from_secs(60)).await.expect("shard ready");
    (s, ready)
}

async fn channel(addr: std::net::SocketAddr) -> Channel {
    Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .expect("connect")
}

/// The tables the shard cases name.
async fn shard_setup(ch: &Channel, pool: &DescriptorPool, data: &Path) {
    let tables = [
        r#"{"name":"d","dense":{"shape":[1000],"chunkElems":100},"optimizer":{"sgd":{"learningRate":0.1}}}"#,
        r#"{"name":"adam","dense":{"shape":[65536],"chunkElems":4096},"optimizer":{"adam":{"learningRate":0.01,"beta1":0.9,"beta2":0.999,"epsilon":1e-8}}}"#,
        r#"{"name":"s","sparse":{"dim":8},"optimizer":{"sgd":{"learningRate":0.1}}}"#,
        r#"{"name":"wide","sparse":{"dim":65536},"optimizer":{"sgd":{"learningRate":0.1}}}"#,
    ];
    for t in tables {
        let spec: Value = serde_json::from_str(t).unwrap();
        let req = json_message(
            pool,
            "ps.v1.CreateTableRequest",
            Some(&serde_json::json!({ "spec": spec })),
        );
        call(ch, "ParameterServer", "CreateTable", req)
            .await
            .expect("create a table");
    }
    // A checkpoint whose files are then damaged: restoring it must be refused as data loss.
    let req = json_message(
        pool,
        "ps.v1.CheckpointRequest",
        Some(&serde_json::json!({"name": "damaged"})),
    );
    call(ch, "ParameterServer", "Checkpoint", req)
        .await
        .expect("checkpoint");
    let db = data.join("checkpoints").join("damaged").join("db");
    let victim = std::fs::read_dir(&db)
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "sst"))
        .or_else(|| {
            std::fs::read_dir(&db)
                .unwrap()
                .filter_map(Result::ok)
                .map(|e| e.path())
                .find(|p| {
                    p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with("MANIFEST"))
                })
        })
        .expect("a file in the checkpoint");
    let mut bytes = std::fs::read(&victim).unwrap();
    bytes[0] ^= 0xff;
    std::fs::write(&victim, bytes).unwrap();
}

/// Every shard case gives its code and changes nothing; the report lists those that do not.
async fn run_grpc_cases(
    ch: &Channel,
    pool: &DescriptorPool,
    service: &str,
    file: &str,
    proc: &mut Service,
) -> (usize, Vec<String>) {
    let cases = corpus(file);
    let mut wrong = Vec::new();
    let state = |ch: Channel| async move {
        if service == "ParameterServer" {
            shard_state(&ch).await
        } else {
            scheduler_state(&ch).await
        }
    };
    let mut before = state(ch.clone()).await;
    for case in &cases {
        let name = text(case, "case").expect("case").to_owned();
        let method = text(case, "method").expect("method");
        let got = call(ch, service, method, message(pool, service, case)).await;
        if let Some(w) = judge(&name, case, got) {
            wrong.push(w);
        }
        if let Err(e) = proc.check() {
            panic!("{name}: the {service} died: {e}\n{}", proc.tail());
        }
        assert!(serving(ch).await, "{name}: the {service} is not SERVING");
        let after = state(ch.clone()).await;
        if after != before {
            wrong.push(format!(
                "{name}: changed the state\nbefore {before}\nafter  {after}"
            ));
            before = after;
        }
    }
    (cases.len(), wrong)
}

/// Sends one bulk case on a fresh connection; returns the answer's code, or `None` when the
/// shard closed the stream without answering.
async fn bulk_case(addr: std::net::SocketAddr, pool: &DescriptorPool, case: &Value) -> Option<u32> {
    let mut sock = TcpStream::connect(addr).await.expect("bulk connect");
    let frame = match text(case, "frame_hex") {
        Some(hex) => from_hex(hex),
        None => {
            let kind = case["kind"].as_u64().expect("kind") as u32;
            let header = match (text(case, "header_hex"), case.get("header")) {
                (Some(hex), _) => from_hex(hex),
                (None, h) => {
                    let type_name = match kind {
                        bulk::PULL_DENSE => "ps.v1.PullDenseRequest",
                        bulk::PUSH_SPARSE => "ps.v1.PushSparseRequest",
                        bulk::PULL_SPARSE => "ps.v1.PullSparseRequest",
                        _ => "ps.v1.PushDenseRequest",
                    };
                    json_message(pool, type_name, h)
                }
            };
            let body_len = case.get("body_len").and_then(Value::as_u64).unwrap_or(0);
            let head = bulk::Head {
                kind,
                header_len: header.len() as u32,
                body_len,
            };
            let mut frame = head.encode().to_vec();
            frame.extend_from_slice(&header);
            match text(case, "body").unwrap_or("zeros") {
                "zeros" => frame.extend(std::iter::repeat_n(0u8, body_len as usize)),
                "nan" => {
                    for _ in 0..body_len / 4 {
                        frame.extend_from_slice(&f32::NAN.to_le_bytes());
                    }
                }
                "nan_last" => {
                    frame.extend(std::iter::repeat_n(
                        0u8,
                        (body_len as usize).saturating_sub(4),
                    ));
                    frame.extend_from_slice(&f32::NAN.to_le_bytes());
                }
                _ => {}
            }
            frame
        }
    };
    // The shard may close the stream before it has read all of what was sent.
    let _ = sock.write_all(&frame).await;
    let answer = tokio::time::timeout(
        Duration::from_secs(30),
        bulk::read_head(&mut sock, 64 << 20),
    )
    .await
    .expect("an answer or a close within 30 s");
    let (head, _) = answer.ok().flatten()?;
    // Read the body so that the stream can be reused.
    let mut body = vec![0u8; head.body_len as usize];
    sock.read_exact(&mut body).await.ok()?;
    // The stream stays usable after a refusal: a well-formed pull is answered.
    if head.kind != 0 {
        let pull = pb::PullDenseRequest {
            table: "d".into(),
            chunks: vec![0],
            ..Default::default()
        }
        .encode_to_vec();
        bulk::write_frame(&mut sock, bulk::PULL_DENSE, &pull, &[])
            .await
            .expect("a pull after a refusal");
        let (h, _) = bulk::read_head(&mut sock, 64 << 20)
            .await
            .expect("an answer to the pull")
            .expect("the stream stays open after a refusal");
        assert_eq!(h.kind, 0, "{}: the pull after it was refused", case["case"]);
    }
    Some(head.kind)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hostile_corpus_is_answered_with_its_codes_and_changes_nothing() {
    let root = tempfile::tempdir().unwrap();
    let pool = DescriptorPool::decode(ps_proto::FILE_DESCRIPTOR_SET).expect("descriptors");
    let mut report = BTreeMap::new();
    let mut wrong = Vec::new();

    // The shard, over gRPC.
    let (mut shard, ready) = hostile_shard(root.path()).await;
    let ch = channel(ready.grpc).await;
    shard_setup(&ch, &pool, &root.path().join("shard")).await;
    let (n, w) = run_grpc_cases(&ch, &pool, "ParameterServer", "shard.jsonl", &mut shard).await;
    report.insert("shard (gRPC)", (n, n - w.len()));
    wrong.extend(w);

    // The shard, over the bulk stream.
    let bulk_addr = ready.bulk.expect("a bulk stream");
    let before = shard_state(&ch).await;
    let cases = corpus("bulk.jsonl");
    let mut right = 0;
    for case in &cases {
        let name = text(case, "case").expect("case");
        let got = bulk_case(bulk_addr, &pool, case).await;
        let want = match text(case, "code") {
            Some("closed") => None,
            Some(c) => Some(code_named(c) as u32),
            None => panic!("{name}: no code"),
        };
        if got == want {
            right += 1;
        } else {
            wrong.push(format!("bulk {name}: answered {got:?}, want {want:?}"));
        }
        if let Err(e) = shard.check() {
            panic!("bulk {name}: the shard died: {e}\n{}", shard.tail());
        }
        assert!(serving(&ch).await, "bulk {name}: the shard is not SERVING");
    }
    assert_eq!(
        shard_state(&ch).await,
        before,
        "a bulk case changed the shard"
    );
    report.insert("shard (bulk stream)", (cases.len(), right));

    // The scheduler, with a shard of its own and a job with one member.
    let (mut sched, url) = ps_tests::scheduler_process(
        &root.path().join("sched"),
        "127.0.0.1:0",
        &["--lease-ms", "600000"],
    )
    .await;
    let _member_shard = ps_tests::shard_process(&root.path().join("shard-b"), 0, 1, &url).await;
    let sch = Channel::from_shared(url.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let job = serde_json::json!({"spec": {
        "name": "victim", "numShards": 1, "numWorkers": 1, "consistency": "CONSISTENCY_MODEL_BSP",
        "maxClocks": 100, "leaseMs": 600000,
        "tables": [{"spec": {"name": "victim/w", "dense": {"shape": [64], "chunkElems": 64},
                             "optimizer": {"sgd": {"learningRate": 0.1}}}}]
    }});
    call(
        &sch,
        "Scheduler",
        "SubmitJob",
        json_message(&pool, "ps.v1.SubmitJobRequest", Some(&job)),
    )
    .await
    .expect("submit");
    let joined = call(
        &sch,
        "Scheduler",
        "JoinJob",
        json_message(
            &pool,
            "ps.v1.JoinJobRequest",
            Some(&serde_json::json!({"job": "victim", "workerName": "w"})),
        ),
    )
    .await
    .expect("join");
    assert_eq!(
        pb::JoinJobResponse::decode(&joined[..]).unwrap().worker_id,
        1
    );
    // Wait until the job runs (its table created on the shard), so that nothing moves on its
    // own while the cases run.
    for _ in 0..600 {
        let j = call(
            &sch,
            "Scheduler",
            "GetJob",
            json_message(
                &pool,
                "ps.v1.GetJobRequest",
                Some(&serde_json::json!({"job": "victim"})),
            ),
        )
        .await
        .expect("get job");
        if pb::JobStatus::decode(&j[..]).unwrap().state == pb::JobState::Running as i32 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (n, w) = run_grpc_cases(&sch, &pool, "Scheduler", "scheduler.jsonl", &mut sched).await;
    report.insert("scheduler (gRPC)", (n, n - w.len()));
    wrong.extend(w);

    let total: usize = report.values().map(|(n, _)| n).sum();
    for (service, (n, ok)) in &report {
        println!("corpus: {service}: {ok} of {n} cases answered as expected");
    }
    println!("corpus: {total} cases in all");
    assert!(total >= 100, "the corpus holds {total} cases; at least 100");
    assert!(
        wrong.is_empty(),
        "{} cases went wrong:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}
