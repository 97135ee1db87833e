//! Security, from real processes and certificates made by `scripts/dev-certs.sh`, tokens made
//! by `psctl token`:
//!
//! - TLS and mutual TLS on the gRPC port, the bulk stream and the metrics port: a client
//!   without a certificate, with one from another CA, trusting another CA, or in plaintext is
//!   refused; a client certificate's name stands in for a token (and one the tokens file does
//!   not name is `unauthenticated`); a certificate rotated on disk is served without a
//!   restart.
//! - The local cluster (`psctl local --tls-dir --auth`) trains with both on everywhere.
//! - Every method under each role (and none): allowed, `unauthenticated` or
//!   `permission_denied`, against the table in SECURITY.md.
//! - The spoofing cases: a push under another caller's client id with `seq = min_unacked_seq =
//!   2^64-1`, a join under another caller's worker id, a registration over a held shard slot,
//!   another job's tables, an anonymous drop; refused, and nothing they aimed at changed.
//!
//! Needs the workspace's binaries (`cargo build --release` puts them next to the test).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ps_client::auth::Bearer;
use ps_client::scheduler::SchedulerClient;
use ps_client::tls::{ClientTls, ClientTlsFiles};
use ps_client::{ClientConfig, Credentials, PsClient, Token};
use ps_core::{Optimizer, TableSpec};
use ps_proto::bulk;
use ps_proto::v1 as pb;
use ps_proto::v1::parameter_server_client::ParameterServerClient;
use ps_proto::v1::scheduler_client::SchedulerClient as RawScheduler;
use ps_tests::raw::call_as;
use ps_tests::spawn;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::Code;
use tonic::transport::Channel;
use tonic_types::StatusExt;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

/// Runs `scripts/dev-certs.sh dir args...`.
fn dev_certs(dir: &Path, args: &[&str]) {
    let out = std::process::Command::new(repo().join("scripts/dev-certs.sh"))
        .arg(dir)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn tls(dir: &Path, client: Option<&str>) -> ClientTls {
    ClientTls::new(ClientTlsFiles {
        ca: dir.join("ca.pem"),
        cert: client.map(|c| dir.join(format!("{c}.pem"))),
        key: client.map(|c| dir.join(format!("{c}.key"))),
    })
    .unwrap()
}

fn config(url: &str, credentials: Credentials) -> ClientConfig {
    let mut cfg = ClientConfig::new([url.to_owned()]);
    cfg.credentials = credentials;
    cfg.max_attempts = 1;
    cfg.connect_timeout = Duration::from_secs(5);
    cfg
}

/// The certificate a TLS server at `addr` shows now, as DER.
async fn served_cert(addr: SocketAddr, tls: &ClientTls) -> Vec<u8> {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let s = tls.connect(tcp, "127.0.0.1").await.unwrap();
    s.get_ref().1.peer_certificates().unwrap()[0].to_vec()
}

fn pem_der(path: &Path) -> Vec<u8> {
    ps_client::tls::load_certs("certificate", path).unwrap()[0].to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_and_mutual_tls_refuse_untrusted_peers_and_certificates_rotate_without_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (certs, other) = (dir.path().join("certs"), dir.path().join("other"));
    dev_certs(
        &certs,
        &[
            "--client", "trainer", "--client", "admin", "--client", "stranger",
        ],
    );
    dev_certs(&other, &["--client", "trainer"]);
    let p = |f: &str| certs.join(f).display().to_string();
    // Certificates stand in for tokens: admin creates tables, trainer pushes and pulls.
    let tokens = dir.path().join("tokens.toml");
    std::fs::write(
        &tokens,
        "[[token]]\nname = \"admin\"\nrole = \"operator\"\njobs = [\"*\"]\ncert_name = \"admin\"\n\
         [[token]]\nname = \"trainer\"\nrole = \"worker\"\njobs = [\"*\"]\ncert_name = \"trainer\"\n",
    )
    .unwrap();
    let tokens_arg = tokens.display().to_string();
    let mut shard = spawn(
        "ps-server",
        "shard-0",
        &[
            "--in-memory",
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
            "--metrics-tls",
            "--tls-cert",
            &p("server.pem"),
            "--tls-key",
            &p("server.key"),
            "--tls-client-ca",
            &p("ca.pem"),
            "--auth-tokens",
            &tokens_arg,
        ],
        &dir.path().join("logs"),
        true,
    );
    let ready = shard.ready(Duration::from_secs(60)).await.unwrap();
    let url = ready.url();
    let good = Credentials {
        tls: Some(tls(&certs, Some("trainer"))),
        token: None,
    };

    // A trusted client with its certificate: gRPC and the bulk stream, both over TLS, its
    // certificate's name its identity (no token).
    let admin = Credentials {
        tls: Some(tls(&certs, Some("admin"))),
        token: None,
    };
    let spec = TableSpec::dense("t", &[100_000])
        .unwrap()
        .with_optimizer(Optimizer::sgd(1.0))
        .unwrap();
    let ps = PsClient::connect(config(&url, good.clone())).await.unwrap();
    let e = ps.create_table(spec.clone()).await.unwrap_err();
    assert_eq!(
        e.code(),
        Some(Code::PermissionDenied),
        "trainer is a worker: {e}"
    );
    let admin = PsClient::connect(config(&url, admin)).await.unwrap();
    admin.create_table(spec).await.unwrap();
    let bulk_calls = async || admin.stats().await.unwrap()[0].bulk_calls;
    let before = bulk_calls().await;
    // Values that do not compress, so that they travel as plain f32 (the bulk stream's).
    let g: Vec<f32> = (0..100_000).map(|i| (i as f32 * 0.37).sin()).collect();
    ps.push_dense("t", &g).await.unwrap();
    let pushed = bulk_calls().await;
    assert!(
        pushed > before,
        "the push went by the bulk stream:\n{}",
        shard.tail()
    );
    let w = ps.pull_dense("t").await.unwrap();
    assert!(
        w.iter().zip(&g).all(|(w, g)| (w + g).abs() < 1e-6),
        "{:?}",
        &w[..4]
    );
    assert!(
        bulk_calls().await > pushed,
        "the pull went by the bulk stream"
    );
    // A step's push and pull in one bulk exchange, admitted by the certificate's name.
    let before = bulk_calls().await;
    let mut out = vec![0.0f32; g.len()];
    ps.push_pull_dense("t", &g, &mut out).await.unwrap();
    assert!(
        out.iter().zip(&g).all(|(w, g)| (w + 2.0 * g).abs() < 1e-5),
        "{:?}",
        &out[..4]
    );
    assert_eq!(bulk_calls().await - before, 1, "one push-and-pull exchange");

    // Refused: no client certificate, a client certificate of another CA, a client that
    // trusts another CA, plaintext.
    let refused = [
        (
            "no client certificate",
            Credentials {
                tls: Some(tls(&certs, None)),
                token: None,
            },
        ),
        (
            "a client certificate of another CA",
            Credentials {
                tls: Some(
                    ClientTls::new(ClientTlsFiles {
                        ca: certs.join("ca.pem"),
                        cert: Some(other.join("trainer.pem")),
                        key: Some(other.join("trainer.key")),
                    })
                    .unwrap(),
                ),
                token: None,
            },
        ),
        (
            "trusting another CA",
            Credentials {
                tls: Some(tls(&other, Some("trainer"))),
                token: None,
            },
        ),
        ("plaintext", Credentials::default()),
    ];
    for (what, creds) in refused {
        // Refused in the handshake, or (TLS 1.3, where the client finishes its handshake
        // before the server checks its certificate; plaintext, answered with a TLS alert) on
        // the first call: the code depends on where the connection broke. The shard counts
        // each failed handshake (checked below).
        let e = PsClient::connect(config(&url, creds)).await.unwrap_err();
        eprintln!("{what}: {e}");
    }
    // A certificate of the right CA whose name the tokens file does not hold: past the
    // handshake, but no caller of ours.
    let stranger = Credentials {
        tls: Some(tls(&certs, Some("stranger"))),
        token: None,
    };
    let e = PsClient::connect(config(&url, stranger)).await.unwrap_err();
    assert_eq!(e.code(), Some(Code::Unauthenticated), "{e}");
    // Plaintext on the bulk port: the handshake fails and the stream closes, unanswered.
    let mut s = tokio::net::TcpStream::connect(ready.bulk.unwrap())
        .await
        .unwrap();
    let header = pb::PullDenseRequest {
        table: "t".into(),
        chunks: vec![0],
        ..Default::default()
    };
    let _ = bulk::write_frame(
        &mut s,
        bulk::PULL_DENSE,
        &prost::Message::encode_to_vec(&header),
        &[],
    )
    .await;
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(15), s.read_to_end(&mut answer)).await;
    // Nothing, or a TLS alert record (0x15): never a bulk answer.
    assert!(
        answer.is_empty() || answer[0] == 0x15,
        "a plaintext bulk call got an answer: {answer:?}"
    );

    // The metrics port over TLS, with a client certificate: the failed handshakes counted.
    let metrics = ready.metrics.unwrap();
    let tcp = tokio::net::TcpStream::connect(metrics).await.unwrap();
    let mut m = good
        .tls
        .as_ref()
        .unwrap()
        .connect(tcp, "127.0.0.1")
        .await
        .unwrap();
    m.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut text = String::new();
    m.read_to_string(&mut text).await.unwrap();
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    let failures: f64 = text
        .lines()
        .find(|l| l.starts_with("ps_tls_handshake_failures_total{port=\"grpc\"}"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    assert!(
        failures >= 4.0,
        "handshake failures on the gRPC port: {failures}\n{text}"
    );
    let plain = tokio::net::TcpStream::connect(metrics).await.unwrap();
    let mut plain = plain;
    plain
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(15), plain.read_to_end(&mut answer)).await;
    assert!(
        !String::from_utf8_lossy(&answer).contains("ps_build_info"),
        "the metrics port answered plaintext"
    );

    // Rotation: new certificates on disk (same CA) are served to new connections within
    // seconds; the shard was not restarted and the old client still works.
    let grpc = ready.grpc;
    let before = served_cert(grpc, good.tls.as_ref().unwrap()).await;
    assert_eq!(before, pem_der(&certs.join("server.pem")));
    dev_certs(&certs, &["--client", "trainer"]);
    let rotated = pem_der(&certs.join("server.pem"));
    assert_ne!(before, rotated);
    let mut served = before.clone();
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        served = served_cert(grpc, good.tls.as_ref().unwrap()).await;
        if served == rotated {
            break;
        }
    }
    assert_eq!(served, rotated, "the rotated certificate is not served");
    let fresh = Credentials {
        tls: Some(tls(&certs, Some("trainer"))),
        token: None,
    };
    let ps2 = PsClient::connect(config(&url, fresh)).await.unwrap();
    assert_eq!(ps2.pull_dense("t").await.unwrap().len(), 100_000);
    shard.check().unwrap();
}

/// Makes a token with `psctl token` into `dir/<name>.token`; returns its tokens-file entry and
/// the token.
fn make_token(dir: &Path, name: &str, role: &str, jobs: &str) -> (String, String) {
    let out_file = dir.join(format!("{name}.token"));
    let out = std::process::Command::new(ps_launch::binary("psctl").unwrap())
        .args([
            "token", "--name", name, "--role", role, "--jobs", jobs, "--out",
        ])
        .arg(&out_file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let token = std::fs::read_to_string(&out_file)
        .unwrap()
        .trim()
        .to_owned();
    (String::from_utf8(out.stdout).unwrap(), token)
}

/// What the services answer each method under each role: allowed (`ok`: any answer that is
/// not a refusal of the caller) or the refusal's code. The table of SECURITY.md.
const ROLE_TABLE: &[(&str, &str, [&str; 5])] = &[
    // (service, method, [none, worker, operator, shard, reader])
    (
        "ParameterServer",
        "ShardInfo",
        ["unauth", "ok", "ok", "ok", "ok"],
    ),
    (
        "ParameterServer",
        "CreateTable",
        ["unauth", "denied", "ok", "denied", "denied"],
    ),
    (
        "ParameterServer",
        "DescribeTable",
        ["unauth", "ok", "ok", "denied", "ok"],
    ),
    (
        "ParameterServer",
        "ListTables",
        ["unauth", "ok", "ok", "denied", "ok"],
    ),
    (
        "ParameterServer",
        "DropTable",
        ["unauth", "denied", "ok", "denied", "denied"],
    ),
    (
        "ParameterServer",
        "PushDense",
        ["unauth", "ok", "denied", "denied", "denied"],
    ),
    (
        "ParameterServer",
        "PullDense",
        ["unauth", "ok", "denied", "denied", "ok"],
    ),
    (
        "ParameterServer",
        "PushSparse",
        ["unauth", "ok", "denied", "denied", "denied"],
    ),
    (
        "ParameterServer",
        "PullSparse",
        ["unauth", "ok", "denied", "denied", "ok"],
    ),
    (
        "ParameterServer",
        "Checkpoint",
        ["unauth", "denied", "ok", "denied", "denied"],
    ),
    (
        "ParameterServer",
        "RestoreCheckpoint",
        ["unauth", "denied", "ok", "denied", "denied"],
    ),
    (
        "ParameterServer",
        "DeleteCheckpoint",
        ["unauth", "denied", "ok", "denied", "denied"],
    ),
    (
        "ParameterServer",
        "GetStats",
        ["unauth", "denied", "ok", "denied", "ok"],
    ),
    (
        "Scheduler",
        "SubmitJob",
        ["unauth", "denied", "ok", "denied", "denied"],
    ),
    (
        "Scheduler",
        "GetJob",
        ["unauth", "ok", "ok", "denied", "ok"],
    ),
    (
        "Scheduler",
        "ListJobs",
        ["unauth", "ok", "ok", "denied", "ok"],
    ),
    (
        "Scheduler",
        "CancelJob",
        ["unauth", "denied", "ok", "denied", "denied"],
    ),
    (
        "Scheduler",
        "RegisterShard",
        ["unauth", "denied", "denied", "ok", "denied"],
    ),
    (
        "Scheduler",
        "ShardHeartbeat",
        ["unauth", "denied", "denied", "ok", "denied"],
    ),
    (
        "Scheduler",
        "GetShardMap",
        ["unauth", "ok", "ok", "ok", "ok"],
    ),
    (
        "Scheduler",
        "JoinJob",
        ["unauth", "ok", "denied", "denied", "denied"],
    ),
    (
        "Scheduler",
        "WorkerHeartbeat",
        ["unauth", "ok", "denied", "denied", "denied"],
    ),
    (
        "Scheduler",
        "AdvanceClock",
        ["unauth", "ok", "denied", "denied", "denied"],
    ),
    (
        "Scheduler",
        "LeaveJob",
        ["unauth", "ok", "denied", "denied", "denied"],
    ),
    (
        "Scheduler",
        "CheckpointJob",
        ["unauth", "denied", "ok", "denied", "denied"],
    ),
    (
        "Scheduler",
        "ListCheckpoints",
        ["unauth", "ok", "ok", "denied", "ok"],
    ),
    (
        "Scheduler",
        "ResumeJob",
        ["unauth", "denied", "ok", "denied", "denied"],
    ),
    (
        "Scheduler",
        "DeleteCheckpoint",
        ["unauth", "denied", "ok", "denied", "denied"],
    ),
];

fn outcome(r: &Result<Vec<u8>, tonic::Status>) -> &'static str {
    match r {
        Err(s) if s.code() == Code::Unauthenticated => "unauth",
        Err(s) if s.code() == Code::PermissionDenied => "denied",
        _ => "ok",
    }
}

fn channel(url: &str) -> Channel {
    tonic::transport::Endpoint::from_shared(url.to_owned())
        .unwrap()
        .connect_lazy()
}

fn shard_as(url: &str, token: &str) -> ParameterServerClient<Bearer<Channel>> {
    ParameterServerClient::new(Bearer::new(channel(url), Some(&Token::new(token).unwrap())))
}

fn scheduler_as(url: &str, token: &str) -> RawScheduler<Bearer<Channel>> {
    RawScheduler::new(Bearer::new(channel(url), Some(&Token::new(token).unwrap())))
}

fn reason(s: &tonic::Status) -> String {
    s.get_error_details()
        .error_info()
        .map(|i| i.reason.clone())
        .unwrap_or_default()
}

const JOB: &str = r#"
name = "j"
consistency = "bsp"
num_shards = 1
num_workers = 1
dataset = "fashion-mnist"
model = "softmax"

[model_tables]
optimizer = "sgd"
learning_rate = 1.0
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roles_gate_every_method_and_identities_cannot_be_spoofed() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys");
    std::fs::create_dir_all(&keys).unwrap();
    let mut entries = String::new();
    let mut token = std::collections::HashMap::new();
    for (name, role, jobs) in [
        ("scheduler", "operator", "*"),
        ("shard-0", "shard", "*"),
        ("shard-evil", "shard", "*"),
        ("alice", "worker", "j"),
        ("mallory", "worker", "j"),
        ("other-job", "worker", "k"),
        ("dashboard", "reader", "*"),
    ] {
        let (entry, t) = make_token(&keys, name, role, jobs);
        entries.push_str(&entry);
        token.insert(name, t);
    }
    let tokens = dir.path().join("tokens.toml");
    std::fs::write(&tokens, &entries).unwrap();
    let logs = dir.path().join("logs");
    let key = |n: &str| keys.join(format!("{n}.token")).display().to_string();
    let tokens_arg = tokens.display().to_string();
    let mut sched = spawn(
        "scheduler",
        "scheduler",
        &[
            "--in-memory",
            "--listen",
            "127.0.0.1:0",
            "--auth-tokens",
            &tokens_arg,
            "--token-file",
            &key("scheduler"),
        ],
        &logs,
        true,
    );
    let sched_url = sched.ready(Duration::from_secs(60)).await.unwrap().url();
    let mut shard = spawn(
        "ps-server",
        "shard-0",
        &[
            "--in-memory",
            "--listen",
            "127.0.0.1:0",
            "--scheduler",
            &sched_url,
            "--auth-tokens",
            &tokens_arg,
            "--token-file",
            &key("shard-0"),
        ],
        &logs,
        true,
    );
    let shard_ready = shard.ready(Duration::from_secs(60)).await.unwrap();
    let url = shard_ready.url();
    let creds = |name: &str| Credentials {
        tls: None,
        token: Some(Token::new(&token[name]).unwrap()),
    };
    let operator = SchedulerClient::connect_with(&sched_url, None, creds("scheduler"))
        .await
        .unwrap();
    // The shard registered with its token.
    let mut map = operator.shard_map().await.unwrap();
    for _ in 0..100 {
        if map.complete {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        map = operator.shard_map().await.unwrap();
    }
    assert!(
        map.complete,
        "the shard did not register:\n{}",
        shard.tail()
    );
    // The scheduler creates the job's tables on the shard with its operator token.
    operator
        .submit(&ps_worker::job::job_from_toml(JOB).unwrap())
        .await
        .unwrap();
    let reader = PsClient::connect(config(&url, creds("dashboard")))
        .await
        .unwrap();
    for _ in 0..100 {
        if reader.list_tables().await.unwrap().len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let names: Vec<String> = reader
        .list_tables()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name.to_string())
        .collect();
    assert_eq!(names, ["j/b0", "j/w0"], "{}", sched.tail());

    // Every method under each role, with an empty request: the auth layer answers before the
    // method reads it.
    let sched_ch = channel(&sched_url);
    let shard_ch = channel(&url);
    let callers = [
        None,
        Some(token["alice"].as_str()),
        Some(token["scheduler"].as_str()),
        Some(token["shard-0"].as_str()),
        Some(token["dashboard"].as_str()),
    ];
    let mut table = String::from(
        "| method | no token | worker | operator | shard | reader |\n|---|---|---|---|---|---|\n",
    );
    let mut wrong = Vec::new();
    for (service, method, want) in ROLE_TABLE {
        let ch = if *service == "Scheduler" {
            &sched_ch
        } else {
            &shard_ch
        };
        let mut row = format!("| {service}/{method} |");
        for (i, caller) in callers.iter().enumerate() {
            let got = outcome(&call_as(ch, service, method, Vec::new(), *caller).await);
            row.push_str(&format!(" {got} |"));
            if got != want[i] {
                wrong.push(format!(
                    "{service}/{method} as caller {i}: {got}, want {}",
                    want[i]
                ));
            }
        }
        table.push_str(&row);
        table.push('\n');
    }
    println!("{table}");
    assert!(wrong.is_empty(), "{wrong:#?}\n{table}");
    // A wrong token and a malformed header are `unauthenticated` too.
    let e = call_as(
        &shard_ch,
        "ParameterServer",
        "ShardInfo",
        Vec::new(),
        Some("0123456789abcdef0123"),
    )
    .await
    .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");

    // Spoofing a client id: mallory pushes under alice's client id with seq = min_unacked =
    // 2^64-1; alice's next push is still applied (not taken for a duplicate), and a retry of
    // it still is one.
    let epoch = map.epoch;
    let push = |client_id: u64, seq: u64, min: u64| pb::PushDenseRequest {
        table: "j/b0".into(),
        push_id: Some(pb::PushId {
            client_id,
            seq,
            min_unacked_seq: min,
        }),
        map_epoch: epoch,
        slices: vec![pb::DenseSlice {
            chunk: 0,
            values: Some(ps_core::Payload::from_f32(&[1.0; 10]).into()),
        }],
        ..Default::default()
    };
    let start = reader.pull_dense("j/b0").await.unwrap();
    let mut alice = shard_as(&url, &token["alice"]);
    let mut mallory = shard_as(&url, &token["mallory"]);
    let a = alice.push_dense(push(77, 1, 1)).await.unwrap().into_inner();
    assert!(!a.duplicate && a.applied_values == 10);
    let m = mallory
        .push_dense(push(77, u64::MAX, u64::MAX))
        .await
        .unwrap()
        .into_inner();
    assert!(!m.duplicate);
    let a = alice.push_dense(push(77, 2, 2)).await.unwrap().into_inner();
    assert!(
        !a.duplicate && a.applied_values == 10,
        "alice's push was taken for a duplicate"
    );
    let a = alice.push_dense(push(77, 2, 2)).await.unwrap().into_inner();
    assert!(a.duplicate, "a retry is still recognised");
    // Three pushes of 1.0 applied with SGD at rate 1: every value went down by 3.
    let pulled = reader.pull_dense("j/b0").await.unwrap();
    assert!(
        pulled
            .iter()
            .zip(&start)
            .all(|(v, s)| (s - v - 3.0).abs() < 1e-5),
        "{start:?} -> {pulled:?}"
    );

    // Another job's worker: none of this job's tables, status or membership.
    let mut outsider = shard_as(&url, &token["other-job"]);
    let e = outsider.push_dense(push(5, 1, 1)).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    let listed = outsider
        .list_tables(pb::ListTablesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(listed.tables.is_empty(), "{listed:?}");
    let e = scheduler_as(&sched_url, &token["other-job"])
        .get_job(pb::GetJobRequest { job: "j".into() })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");

    // A worker id is its joiner's.
    let joined = scheduler_as(&sched_url, &token["alice"])
        .join_job(pb::JoinJobRequest {
            job: "j".into(),
            worker_name: "a".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut m_sched = scheduler_as(&sched_url, &token["mallory"]);
    let e = m_sched
        .join_job(pb::JoinJobRequest {
            job: "j".into(),
            worker_name: "a".into(),
            worker_id: joined.worker_id,
        })
        .await
        .unwrap_err();
    assert_eq!(
        (e.code(), reason(&e).as_str()),
        (Code::PermissionDenied, "NOT_YOURS"),
        "{e:?}"
    );
    let e = m_sched
        .leave_job(pb::LeaveJobRequest {
            job: "j".into(),
            worker_id: joined.worker_id,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    let st = operator.job("j").await.unwrap();
    assert!(
        st.workers
            .iter()
            .any(|w| w.worker_id == joined.worker_id && w.live),
        "alice's worker is still a live member: {st:?}"
    );

    // A shard slot is the registered shard's while its lease holds.
    let decoy = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let e = scheduler_as(&sched_url, &token["shard-evil"])
        .register_shard(pb::RegisterShardRequest {
            shard_index: 0,
            num_shards: 1,
            virtual_nodes: map.virtual_nodes,
            endpoint: format!("http://{}", decoy.local_addr().unwrap()),
        })
        .await
        .unwrap_err();
    assert_eq!(
        (e.code(), reason(&e).as_str()),
        (Code::PermissionDenied, "NOT_YOURS"),
        "{e:?}"
    );
    assert_eq!(operator.shard_map().await.unwrap().endpoints, map.endpoints);

    // An anonymous drop and a worker's restore are refused; the table is still there.
    let e = call_as(
        &shard_ch,
        "ParameterServer",
        "DropTable",
        prost::Message::encode_to_vec(&pb::DropTableRequest {
            name: "j/b0".into(),
        }),
        None,
    )
    .await
    .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated);
    let e = alice
        .restore_checkpoint(pb::RestoreCheckpointRequest { name: "x".into() })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    assert_eq!(reader.pull_dense("j/b0").await.unwrap(), pulled);

    // The bulk stream checks the token in its header: alice's SDK pushes through it; a call
    // without a token is answered `unauthenticated`.
    let ps = PsClient::connect(config(&url, creds("alice")))
        .await
        .unwrap();
    let before = reader.stats().await.unwrap()[0].bulk_calls;
    ps.push_dense("j/b0", &[1.0; 10]).await.unwrap();
    assert!(reader.stats().await.unwrap()[0].bulk_calls > before);
    let mut s = tokio::net::TcpStream::connect(shard_ready.bulk.unwrap())
        .await
        .unwrap();
    // A dense pull and a sparse pull without a token, one after the other on one stream.
    let dense = pb::PullDenseRequest {
        table: "j/b0".into(),
        chunks: vec![0],
        map_epoch: epoch,
        ..Default::default()
    };
    let sparse = pb::PullSparseRequest {
        table: "j/b0".into(),
        ids: vec![1],
        map_epoch: epoch,
        ..Default::default()
    };
    for (kind, header) in [
        (bulk::PULL_DENSE, prost::Message::encode_to_vec(&dense)),
        (bulk::PULL_SPARSE, prost::Message::encode_to_vec(&sparse)),
    ] {
        bulk::write_frame(&mut s, kind, &header, &[]).await.unwrap();
        let (head, message) = bulk::read_head(&mut s, 1 << 20).await.unwrap().unwrap();
        assert_eq!(
            head.kind,
            Code::Unauthenticated as u32,
            "{}",
            String::from_utf8_lossy(&message)
        );
    }
    sched.check().unwrap();
    shard.check().unwrap();
}

/// `psctl local --tls-dir --auth`: the scheduler, the shards and the workers with mutual TLS on
/// every connection and a token per process train as they do in the open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_cluster_trains_with_mutual_tls_and_tokens_everywhere() {
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        local: ps_cli::local::LocalArgs,
    }
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    dev_certs(&certs, &[]);
    let run = dir.path().join("run");
    let args = <Cli as clap::Parser>::parse_from([
        "local",
        "--dataset",
        "synthetic-dense:4000:16:4",
        "--model",
        "mlp:16",
        "--epochs",
        "2",
        "--batch",
        "64",
        "--tls-dir",
        certs.to_str().unwrap(),
        "--auth",
        "--quiet",
        "--run-dir",
        run.to_str().unwrap(),
    ])
    .local;
    let o = ps_cli::local::run(&args).await.unwrap();
    // Four classes: chance is 25%; in the open this data reaches about 89%.
    assert!(o.result.eval.test_accuracy > 0.8, "{:?}", o.result.eval);
    for service in ["scheduler", "shard-0", "shard-1"] {
        let log = std::fs::read_to_string(run.join("logs").join(format!("{service}.log"))).unwrap();
        assert!(
            log.contains(r#"tls="mutual" auth=true"#),
            "{service} did not serve with mutual TLS and tokens:\n{log}"
        );
    }
    let tokens = std::fs::read_to_string(run.join("security/tokens.toml")).unwrap();
    assert_eq!(tokens.matches("[[token]]").count(), 4, "{tokens}");
    assert!(
        !tokens.contains(
            std::fs::read_to_string(run.join("security/workers.token"))
                .unwrap()
                .trim()
        )
    );
}

/// Per-job quotas on a shard: a job's tables past `job_max_tables`, or its tables and new
/// sparse rows past `job_max_bytes`, are refused (`resource_exhausted`) and change nothing;
/// other jobs keep their own room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jobs_quota_bounds_its_tables_and_bytes_and_no_other_jobs() {
    let cluster = ps_tests::TestCluster::start_with(1, |c| {
        c.job_quota = ps_server::engine::JobQuota {
            max_tables: Some(2),
            max_bytes: Some(1 << 20),
        };
    })
    .await;
    let ps = cluster.client().await;
    let dense = |name: &str, n: u64| {
        TableSpec::dense(name, &[n])
            .unwrap()
            .with_optimizer(Optimizer::sgd(0.1))
            .unwrap()
    };
    ps.create_table(dense("a/t1", 1000)).await.unwrap();
    ps.create_table(dense("a/t2", 1000)).await.unwrap();
    let e = ps.create_table(dense("a/t3", 1000)).await.unwrap_err();
    assert_eq!(e.code(), Some(Code::ResourceExhausted), "{e}");
    assert!(e.to_string().contains("job `a`"), "{e}");
    // Another job has its own room; a table past the byte quota is refused.
    ps.create_table(dense("b/t1", 1000)).await.unwrap();
    let e = ps.create_table(dense("b/big", 1 << 20)).await.unwrap_err();
    assert_eq!(e.code(), Some(Code::ResourceExhausted), "{e}");
    // New sparse rows count too: 10,000 rows of 64 floats are 2.5 MiB.
    let sparse = TableSpec::sparse("c/emb", 64)
        .unwrap()
        .with_optimizer(Optimizer::sgd(0.1))
        .unwrap();
    ps.create_table(sparse).await.unwrap();
    // Sent as one request, which the quota refuses whole (a push the client splits into
    // several requests is refused or applied request by request).
    let mut cfg = ClientConfig::new(cluster.endpoints.clone());
    cfg.max_request_bytes = 4 << 20;
    let whole = PsClient::connect(cfg).await.unwrap();
    let ids: Vec<u64> = (0..10_000).collect();
    let e = whole
        .push_sparse("c/emb", &ids, &vec![0.1; 10_000 * 64])
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(Code::ResourceExhausted), "{e}");
    ps.push_sparse("c/emb", &ids[..100], &vec![0.1; 100 * 64])
        .await
        .unwrap();
    let names: Vec<String> = ps
        .list_tables()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name.to_string())
        .collect();
    assert_eq!(names, ["a/t1", "a/t2", "b/t1", "c/emb"]);
    let rows: u64 = ps.stats().await.unwrap()[0]
        .tables
        .iter()
        .filter(|t| t.name == "c/emb")
        .map(|t| t.rows)
        .sum();
    assert_eq!(rows, 100, "the refused push added no rows");
    cluster.stop().await;
}

/// `--connection-calls-per-second`: a connection past its rate is refused at once
/// (`resource_exhausted`, CALLER_LIMIT), without tokens; another connection has its own rate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_over_its_rate_is_refused_and_others_are_not() {
    let dir = tempfile::tempdir().unwrap();
    let mut shard = spawn(
        "ps-server",
        "shard-0",
        &[
            "--in-memory",
            "--listen",
            "127.0.0.1:0",
            "--connection-calls-per-second",
            "20",
        ],
        &dir.path().join("logs"),
        true,
    );
    let url = shard.ready(Duration::from_secs(60)).await.unwrap().url();
    let calls = async |ch: &Channel, n: usize| {
        let (mut ok, mut limited) = (0, 0);
        for _ in 0..n {
            match call_as(ch, "ParameterServer", "ShardInfo", Vec::new(), None).await {
                Ok(_) => ok += 1,
                Err(e) => {
                    assert_eq!(
                        (e.code(), reason(&e).as_str()),
                        (Code::ResourceExhausted, "CALLER_LIMIT"),
                        "{e:?}"
                    );
                    limited += 1;
                }
            }
        }
        (ok, limited)
    };
    let first = channel(&url);
    let (ok, limited) = calls(&first, 200).await;
    // A second of burst (20) plus what refills while the calls run.
    assert!(
        (20..200).contains(&ok) && limited > 0,
        "ok {ok}, limited {limited}"
    );
    let second = channel(&url);
    assert_eq!(
        calls(&second, 5).await,
        (5, 0),
        "a new connection has its own rate"
    );
    shard.check().unwrap();
}
