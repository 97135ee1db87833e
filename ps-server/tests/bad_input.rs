//! Bad input gets a specific status and a message a user can act on, and changes nothing.
//! A real shard (RocksDB on disk, gRPC on 127.0.0.1) is called with raw wire messages.

use ps_proto::v1 as pb;
use ps_proto::v1::parameter_server_client::ParameterServerClient;
use ps_server::ServerConfig;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::Code;
use tonic::transport::Channel;

struct Shard {
    client: ParameterServerClient<Channel>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
    _dir: tempfile::TempDir,
}

async fn start(max_request_bytes: usize) -> Shard {
    let dir = tempfile::tempdir().unwrap();
    start_in(dir, max_request_bytes, ps_server::engine::Clock::system()).await
}

/// Starts shard 0 of a 2-shard map on `dir` (new, or left by [`Shard::stop_keeping`]), its
/// rows aged by `clock`.
async fn start_in(
    dir: tempfile::TempDir,
    max_request_bytes: usize,
    clock: ps_server::engine::Clock,
) -> Shard {
    let mut cfg = ServerConfig::local(Some(dir.path().to_owned()));
    cfg.max_request_bytes = max_request_bytes;
    cfg.clock = clock;
    // Two shards in the map; this is shard 0, so some ids and chunks belong elsewhere.
    cfg.num_shards = 2;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(ps_server::run(cfg, listener, None, shutdown.clone()));
    let client = ParameterServerClient::connect(url)
        .await
        .unwrap()
        .max_decoding_message_size(usize::MAX)
        .max_encoding_message_size(usize::MAX);
    Shard {
        client,
        shutdown,
        task,
        _dir: dir,
    }
}

impl Shard {
    async fn stop(self) {
        self.stop_keeping().await;
    }

    /// Stops the shard and hands back its data directory.
    async fn stop_keeping(self) -> tempfile::TempDir {
        self.shutdown.cancel();
        self.task.await.unwrap().unwrap();
        self._dir
    }
}

fn f32s(v: &[f32]) -> pb::Payload {
    ps_core::Payload::from_f32(v).into()
}

fn decode(p: &pb::Payload) -> Vec<f32> {
    ps_core::Payload::try_from(p.clone())
        .unwrap()
        .to_vec()
        .unwrap()
}

fn dense_spec(name: &str, len: u64, chunk: u64, non_finite: pb::NonFinitePolicy) -> pb::TableSpec {
    pb::TableSpec {
        name: name.into(),
        kind: Some(pb::table_spec::Kind::Dense(pb::DenseSpec {
            shape: vec![len],
            chunk_elems: chunk,
        })),
        optimizer: Some(pb::Optimizer {
            kind: Some(pb::optimizer::Kind::Sgd(pb::Sgd { learning_rate: 1.0 })),
        }),
        initializer: None,
        non_finite: non_finite as i32,
    }
}

fn sparse_spec(name: &str, dim: u32, non_finite: pb::NonFinitePolicy) -> pb::TableSpec {
    pb::TableSpec {
        kind: Some(pb::table_spec::Kind::Sparse(pb::SparseSpec {
            dim,
            ..Default::default()
        })),
        ..dense_spec(name, 1, 0, non_finite)
    }
}

static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

fn push_id() -> Option<pb::PushId> {
    Some(pb::PushId {
        client_id: 42,
        seq: SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        min_unacked_seq: 0,
    })
}

/// Ids owned by shard 0 (and one owned by shard 1) of a 2-shard map, for table `name`.
fn ids_for(name: &str) -> (Vec<u64>, u64) {
    let p = ps_core::Partitioner::new(2, ps_core::partition::DEFAULT_VIRTUAL_NODES);
    let h = ps_core::hash::fnv1a(name.as_bytes());
    let other = (0..).find(|&i| p.shard_for_id(h, i) == 1).unwrap();
    (owned_ids(name, 3), other)
}

/// The first `n` ids of table `name` that shard 0 of a 2-shard map owns.
fn owned_ids(name: &str, n: usize) -> Vec<u64> {
    let p = ps_core::Partitioner::new(2, ps_core::partition::DEFAULT_VIRTUAL_NODES);
    let h = ps_core::hash::fnv1a(name.as_bytes());
    (0..)
        .filter(|&i| p.shard_for_id(h, i) == 0)
        .take(n)
        .collect()
}

/// Chunks of `name` that shard 0 owns, and one it does not.
fn chunks_for(name: &str, n: u64) -> (Vec<u64>, u64) {
    let p = ps_core::Partitioner::new(2, ps_core::partition::DEFAULT_VIRTUAL_NODES);
    let h = ps_core::hash::fnv1a(name.as_bytes());
    let mine = (0..n).filter(|&c| p.shard_for_chunk(h, c) == 0).collect();
    let other = (0..n).find(|&c| p.shard_for_chunk(h, c) == 1).unwrap();
    (mine, other)
}

/// One request of a bad-input table.
enum Call {
    PushDense(pb::PushDenseRequest),
    PushSparse(pb::PushSparseRequest),
    PullDense(pb::PullDenseRequest),
    PullSparse(pb::PullSparseRequest),
    Create(pb::CreateTableRequest),
}

impl Call {
    async fn send(self, c: &mut ParameterServerClient<Channel>) -> Result<(), tonic::Status> {
        match self {
            Call::PushDense(r) => c.push_dense(r).await.map(drop),
            Call::PushSparse(r) => c.push_sparse(r).await.map(drop),
            Call::PullDense(r) => c.pull_dense(r).await.map(drop),
            Call::PullSparse(r) => c.pull_sparse(r).await.map(drop),
            Call::Create(r) => c.create_table(r).await.map(drop),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_refused_and_change_nothing() {
    let mut shard = start(1 << 20).await;
    let c = &mut shard.client;
    c.create_table(pb::CreateTableRequest {
        spec: Some(dense_spec("d", 10, 4, pb::NonFinitePolicy::Reject)),
    })
    .await
    .unwrap();
    c.create_table(pb::CreateTableRequest {
        spec: Some(sparse_spec("s", 2, pb::NonFinitePolicy::Reject)),
    })
    .await
    .unwrap();
    let (chunks, foreign_chunk) = chunks_for("d", 3);
    let (ids, foreign_id) = ids_for("s");
    let chunk = chunks[0];
    let chunk_len = if chunk == 2 { 2 } else { 4 };

    // A good push first, so "unchanged" means something.
    c.push_dense(pb::PushDenseRequest {
        table: "d".into(),
        push_id: push_id(),
        map_epoch: 0,
        slices: vec![pb::DenseSlice {
            chunk,
            values: Some(f32s(&vec![1.0; chunk_len])),
        }],
        trace_context: Default::default(),
        authorization: String::new(),
    })
    .await
    .unwrap();
    c.push_sparse(pb::PushSparseRequest {
        table: "s".into(),
        push_id: push_id(),
        map_epoch: 0,
        ids: ids.clone(),
        values: Some(f32s(&[1.0; 6])),
        clock: None,
        ..Default::default()
    })
    .await
    .unwrap();
    let pull_d = pb::PullDenseRequest {
        table: "d".into(),
        chunks: chunks.clone(),
        ..Default::default()
    };
    let pull_s = pb::PullSparseRequest {
        table: "s".into(),
        ids: ids.clone(),
        ..Default::default()
    };
    let dense_before = c.pull_dense(pull_d.clone()).await.unwrap().into_inner();
    let sparse_before = c.pull_sparse(pull_s.clone()).await.unwrap().into_inner();
    let stats_before = c
        .get_stats(pb::GetStatsRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stats_before.pushes_applied, 2);

    let dense_push = |table: &str, chunk: u64, values: pb::Payload| {
        Call::PushDense(pb::PushDenseRequest {
            table: table.into(),
            push_id: push_id(),
            map_epoch: 0,
            slices: vec![pb::DenseSlice {
                chunk,
                values: Some(values),
            }],
            trace_context: Default::default(),
            authorization: String::new(),
        })
    };
    let sparse_push = |ids: Vec<u64>, values: pb::Payload| pb::PushSparseRequest {
        table: "s".into(),
        push_id: push_id(),
        map_epoch: 0,
        ids,
        values: Some(values),
        clock: None,
        ..Default::default()
    };
    let mut short = f32s(&vec![1.0; chunk_len]);
    short.num_values += 1;
    let mut unknown = f32s(&vec![1.0; chunk_len]);
    unknown.encoding = 77;
    let mut nan = vec![1.0; chunk_len];
    nan[1] = f32::NAN;
    let foreign_len = if foreign_chunk == 2 { 2 } else { 4 };
    let create = |spec: pb::TableSpec| Call::Create(pb::CreateTableRequest { spec: Some(spec) });
    // One row per bad request: what it is, the code, the ErrorInfo reason, words of the message.
    let cases: Vec<(&str, Code, &str, &str, Call)> = vec![
        (
            "unknown table (push)",
            Code::NotFound,
            "TABLE_NOT_FOUND",
            "create it first",
            dense_push("nope", 0, f32s(&[1.0])),
        ),
        (
            "unknown table (pull)",
            Code::NotFound,
            "TABLE_NOT_FOUND",
            "does not exist",
            Call::PullSparse(pb::PullSparseRequest {
                table: "nope".into(),
                ..Default::default()
            }),
        ),
        (
            "a slice that does not end on a chunk boundary",
            Code::InvalidArgument,
            "INVALID_FIELD",
            "chunk boundary",
            dense_push("d", chunk, f32s(&[1.0; 3])),
        ),
        (
            "ids and row data of different lengths",
            Code::InvalidArgument,
            "INVALID_FIELD",
            "3 ids of dim 2 need 6 values",
            Call::PushSparse(sparse_push(ids.clone(), f32s(&[1.0; 5]))),
        ),
        (
            "ids both as varints and as words (push)",
            Code::InvalidArgument,
            "INVALID_FIELD",
            "one of them",
            Call::PushSparse(pb::PushSparseRequest {
                fixed_ids: vec![9],
                ..sparse_push(ids.clone(), f32s(&[1.0; 6]))
            }),
        ),
        (
            "ids both as varints and as words (pull)",
            Code::InvalidArgument,
            "INVALID_FIELD",
            "one of them",
            Call::PullSparse(pb::PullSparseRequest {
                table: "s".into(),
                ids: ids.clone(),
                fixed_ids: vec![9],
                ..Default::default()
            }),
        ),
        (
            "a chunk out of range (push)",
            Code::OutOfRange,
            "CHUNK_OUT_OF_RANGE",
            "out of range",
            dense_push("d", 7, f32s(&[1.0; 4])),
        ),
        (
            "a chunk out of range (pull)",
            Code::OutOfRange,
            "CHUNK_OUT_OF_RANGE",
            "has 3 chunks",
            Call::PullDense(pb::PullDenseRequest {
                table: "d".into(),
                chunks: vec![3],
                ..Default::default()
            }),
        ),
        (
            "a payload longer than its data",
            Code::InvalidArgument,
            "INVALID_FIELD",
            "need 20 bytes",
            dense_push("d", chunk, short),
        ),
        (
            "an unknown encoding",
            Code::InvalidArgument,
            "INVALID_FIELD",
            "unknown encoding",
            dense_push("d", chunk, unknown),
        ),
        (
            "NaN in a dense push",
            Code::InvalidArgument,
            "NON_FINITE",
            "NaN or infinity",
            dense_push("d", chunk, f32s(&nan)),
        ),
        (
            "infinity in a sparse push",
            Code::InvalidArgument,
            "NON_FINITE",
            "NaN or infinity",
            Call::PushSparse(sparse_push(
                ids.clone(),
                f32s(&[1.0, 1.0, f32::INFINITY, 1.0, 1.0, 1.0]),
            )),
        ),
        (
            "an id of another shard",
            Code::FailedPrecondition,
            "NOT_OWNER",
            "belongs to shard 1",
            Call::PushSparse(sparse_push(vec![foreign_id], f32s(&[1.0; 2]))),
        ),
        (
            "a chunk of another shard",
            Code::FailedPrecondition,
            "NOT_OWNER",
            "belongs to shard 1",
            dense_push("d", foreign_chunk, f32s(&vec![1.0; foreign_len])),
        ),
        (
            "a push without its (client id, seq)",
            Code::InvalidArgument,
            "INVALID_FIELD",
            "push_id",
            Call::PushSparse(pb::PushSparseRequest {
                push_id: None,
                ..sparse_push(ids.clone(), f32s(&[1.0; 6]))
            }),
        ),
        (
            "a dense call on a sparse table",
            Code::FailedPrecondition,
            "WRONG_TABLE_KIND",
            "is sparse",
            dense_push("s", 0, f32s(&[1.0])),
        ),
        (
            "a request over the size limit",
            Code::ResourceExhausted,
            "",
            "--max-request-bytes",
            Call::PushSparse(sparse_push(
                vec![ids[0]; 200_000],
                f32s(&vec![1.0; 400_000]),
            )),
        ),
        (
            "a create that conflicts",
            Code::AlreadyExists,
            "TABLE_SPEC_CONFLICT",
            "different spec",
            create(dense_spec("d", 11, 4, pb::NonFinitePolicy::Reject)),
        ),
        (
            "FTRL on a dense table",
            Code::InvalidArgument,
            "INVALID_FIELD",
            "FTRL-proximal is for sparse tables",
            create(pb::TableSpec {
                optimizer: Some(pb::Optimizer {
                    kind: Some(pb::optimizer::Kind::Ftrl(pb::Ftrl {
                        alpha: 0.1,
                        beta: 1.0,
                        l1: 0.0,
                        l2: 0.0,
                    })),
                }),
                ..dense_spec("f", 4, 0, pb::NonFinitePolicy::Reject)
            }),
        ),
        (
            "a dense shape with a zero dimension",
            Code::InvalidArgument,
            "INVALID_FIELD",
            "dimension 0 is 0",
            create(pb::TableSpec {
                kind: Some(pb::table_spec::Kind::Dense(pb::DenseSpec {
                    shape: vec![0],
                    chunk_elems: 0,
                })),
                ..dense_spec("z", 1, 0, pb::NonFinitePolicy::Reject)
            }),
        ),
    ];
    for (what, code, reason, hint, call) in cases {
        let s = call.send(c).await.expect_err(what);
        assert_eq!(s.code(), code, "{what}: {}", s.message());
        assert!(
            s.message().contains(hint),
            "{what}: `{}` should mention `{hint}`",
            s.message()
        );
        // The request-size refusal comes from the gRPC layer, before the shard sees the call.
        if !reason.is_empty() {
            let info = tonic_types::StatusExt::get_details_error_info(&s).expect(what);
            assert_eq!(
                (info.domain.as_str(), info.reason.as_str()),
                ("ps.v1", reason),
                "{what}"
            );
        }
    }

    // Nothing changed.
    assert_eq!(
        c.pull_dense(pull_d).await.unwrap().into_inner(),
        dense_before
    );
    assert_eq!(
        c.pull_sparse(pull_s).await.unwrap().into_inner(),
        sparse_before
    );
    let stats = c
        .get_stats(pb::GetStatsRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stats.pushes_applied, 2);
    assert_eq!(stats.write_batches, stats_before.write_batches);
    let described = c
        .describe_table(pb::DescribeTableRequest { name: "d".into() })
        .await
        .unwrap()
        .into_inner();
    let d_stats = described.stats.unwrap();
    assert_eq!(
        (d_stats.pushes, d_stats.values_pushed),
        (1, chunk_len as u64)
    );
    let tables = c
        .list_tables(pb::ListTablesRequest {})
        .await
        .unwrap()
        .into_inner()
        .tables;
    assert_eq!(
        tables.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(),
        ["d", "s"]
    );
    shard.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skip_policy_drops_only_the_rows_with_nan() {
    let mut shard = start(64 << 20).await;
    let c = &mut shard.client;
    c.create_table(pb::CreateTableRequest {
        spec: Some(sparse_spec("s", 2, pb::NonFinitePolicy::Skip)),
    })
    .await
    .unwrap();
    let (ids, _) = ids_for("s");
    let r = c
        .push_sparse(pb::PushSparseRequest {
            table: "s".into(),
            push_id: push_id(),
            map_epoch: 0,
            ids: ids.clone(),
            values: Some(f32s(&[1.0, 1.0, f32::NAN, 1.0, 2.0, 2.0])),
            clock: None,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((r.applied_values, r.skipped_non_finite), (4, 1));
    let rows = c
        .pull_sparse(pb::PullSparseRequest {
            table: "s".into(),
            ids,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        decode(&rows.values.unwrap()),
        [-1.0, -1.0, 0.0, 0.0, -2.0, -2.0]
    );
    shard.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_push_is_acknowledged_but_applied_once() {
    let mut shard = start(64 << 20).await;
    let c = &mut shard.client;
    c.create_table(pb::CreateTableRequest {
        spec: Some(sparse_spec("s", 2, pb::NonFinitePolicy::Reject)),
    })
    .await
    .unwrap();
    let (ids, _) = ids_for("s");
    let push = pb::PushSparseRequest {
        table: "s".into(),
        push_id: Some(pb::PushId {
            client_id: 7,
            seq: 10,
            min_unacked_seq: 10,
        }),
        map_epoch: 0,
        ids: vec![ids[0]],
        values: Some(f32s(&[1.0, 2.0])),
        clock: None,
        ..Default::default()
    };
    let first = c.push_sparse(push.clone()).await.unwrap().into_inner();
    let again = c.push_sparse(push.clone()).await.unwrap().into_inner();
    assert!(!first.duplicate && again.duplicate);
    // Below the client's floor counts as applied too (a stale copy of an old push).
    let stale = pb::PushSparseRequest {
        push_id: Some(pb::PushId {
            client_id: 7,
            seq: 3,
            min_unacked_seq: 3,
        }),
        ..push.clone()
    };
    assert!(c.push_sparse(stale).await.unwrap().into_inner().duplicate);
    // Another client with the same seq is a different push.
    let other = pb::PushSparseRequest {
        push_id: Some(pb::PushId {
            client_id: 8,
            seq: 10,
            min_unacked_seq: 10,
        }),
        ..push
    };
    assert!(!c.push_sparse(other).await.unwrap().into_inner().duplicate);
    let rows = c
        .pull_sparse(pb::PullSparseRequest {
            table: "s".into(),
            ids: vec![ids[0]],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(decode(&rows.values.unwrap()), [-2.0, -4.0]);
    let stats = c
        .get_stats(pb::GetStatsRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!((stats.pushes_applied, stats.pushes_duplicate), (2, 2));
    shard.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_optimizer_runs_end_to_end_and_survives_a_restart() {
    // Two steps, a restart in between: the second step must see the optimizer state of the
    // first (Adam's moments and step count, Adagrad's accumulator, FTRL's z and n).
    let dir = tempfile::tempdir().unwrap();
    let opts: Vec<(&str, pb::optimizer::Kind, [f32; 2])> = vec![
        // Same hand-worked values as the optimizer unit tests (w0 = 1 except FTRL's 0).
        (
            "sgd",
            pb::optimizer::Kind::Sgd(pb::Sgd { learning_rate: 0.1 }),
            [0.5, -1.0],
        ),
        (
            "mom",
            pb::optimizer::Kind::Momentum(pb::Momentum {
                learning_rate: 0.1,
                momentum: 0.9,
                nesterov: false,
            }),
            [1.0, 1.0],
        ),
        (
            "ada",
            pb::optimizer::Kind::Adagrad(pb::Adagrad {
                learning_rate: 0.5,
                initial_accumulator: 0.1,
                epsilon: 1e-30,
            }),
            [2.0, 1.0],
        ),
        (
            "adam",
            pb::optimizer::Kind::Adam(pb::Adam {
                learning_rate: 0.01,
                beta1: 0.9,
                beta2: 0.999,
                epsilon: 1e-12,
            }),
            [1.0, 0.0],
        ),
        (
            "ftrl",
            pb::optimizer::Kind::Ftrl(pb::Ftrl {
                alpha: 1.0,
                beta: 1.0,
                l1: 0.5,
                l2: 0.0,
            }),
            [2.0, 1.0],
        ),
    ];
    let expected = [
        1.05,
        0.71,
        1.0 - 0.493_864_8 - 0.221_403_7,
        0.99 - 0.006_700_6,
        -0.809_017,
    ];
    for step in 0..2 {
        let mut cfg = ServerConfig::local(Some(dir.path().to_owned()));
        cfg.num_shards = 1;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(ps_server::run(cfg, listener, None, shutdown.clone()));
        let mut c = ParameterServerClient::connect(url).await.unwrap();
        for (i, (name, kind, grads)) in opts.iter().enumerate() {
            let init = if *name == "ftrl" { 0.0 } else { 1.0 };
            let spec = pb::TableSpec {
                name: (*name).into(),
                kind: Some(pb::table_spec::Kind::Sparse(pb::SparseSpec {
                    dim: 1,
                    ..Default::default()
                })),
                optimizer: Some(pb::Optimizer { kind: Some(*kind) }),
                initializer: Some(pb::Initializer {
                    kind: Some(pb::initializer::Kind::Uniform(pb::Uniform {
                        low: init,
                        high: init + 1e-7,
                    })),
                    seed: 0,
                }),
                non_finite: 0,
            };
            c.create_table(pb::CreateTableRequest { spec: Some(spec) })
                .await
                .unwrap();
            c.push_sparse(pb::PushSparseRequest {
                table: (*name).into(),
                push_id: push_id(),
                map_epoch: 0,
                ids: vec![5],
                values: Some(f32s(&[grads[step]])),
                clock: None,
                ..Default::default()
            })
            .await
            .unwrap();
            if step == 1 {
                let v = c
                    .pull_sparse(pb::PullSparseRequest {
                        table: (*name).into(),
                        ids: vec![5],
                        ..Default::default()
                    })
                    .await
                    .unwrap()
                    .into_inner();
                let got = decode(&v.values.unwrap())[0];
                assert!(
                    (got - expected[i]).abs() < 2e-6,
                    "{name}: {got} vs {}",
                    expected[i]
                );
            }
        }
        shutdown.cancel();
        task.await.unwrap().unwrap();
    }
}

/// A raw connection to the shard's bulk stream, at the port its ShardInfo gives.
async fn bulk_socket(c: &mut ParameterServerClient<Channel>) -> tokio::net::TcpStream {
    let info = c
        .shard_info(pb::ShardInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    tokio::net::TcpStream::connect(("127.0.0.1", info.bulk_port as u16))
        .await
        .unwrap()
}

/// One call on a raw bulk stream: (status code, header bytes, body bytes).
async fn bulk_call(
    sock: &mut tokio::net::TcpStream,
    kind: u32,
    header: &impl prost::Message,
    body: &[bytes::Bytes],
) -> (u32, Vec<u8>, Vec<u8>) {
    use tokio::io::AsyncReadExt;
    ps_proto::bulk::write_frame(sock, kind, &header.encode_to_vec(), body)
        .await
        .unwrap();
    let (head, header) = ps_proto::bulk::read_head(sock, 1 << 20)
        .await
        .unwrap()
        .expect("an answer");
    let mut body = vec![0u8; head.body_len as usize];
    sock.read_exact(&mut body).await.unwrap();
    (head.kind, header, body)
}

/// A refusal on the bulk stream: its code, message, and the `ErrorInfo` reason in its body
/// (the error details gRPC would send in its trailer).
fn bulk_refused(
    code: Code,
    reason: &str,
    hint: &str,
    (got, header, body): (u32, Vec<u8>, Vec<u8>),
) {
    use tonic_types::StatusExt;
    let message = String::from_utf8(header).unwrap();
    assert_eq!(Code::from_i32(got as i32), code, "{message}");
    assert!(
        message.contains(hint),
        "`{message}` should mention `{hint}`"
    );
    let status = tonic::Status::with_details(code, message.clone(), body.into());
    let info = status.get_details_error_info().expect("error details");
    assert_eq!(
        (info.domain.as_str(), info.reason.as_str()),
        ("ps.v1", reason),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bulk_stream_applies_pushes_once_and_refuses_bad_input_on_a_usable_stream() {
    use ps_proto::bulk::{PULL_DENSE, PUSH_DENSE, PUSH_PULL_DENSE};
    let mut shard = start(1 << 20).await;
    let c = &mut shard.client;
    let info = c
        .shard_info(pb::ShardInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_ne!(
        info.bulk_port, 0,
        "a shard offers its bulk stream by default"
    );
    for (name, len) in [("d", 10), ("big", 1 << 20)] {
        c.create_table(pb::CreateTableRequest {
            spec: Some(dense_spec(name, len, 0, pb::NonFinitePolicy::Reject)),
        })
        .await
        .unwrap();
    }
    c.create_table(pb::CreateTableRequest {
        spec: Some(dense_spec("d4", 12, 4, pb::NonFinitePolicy::Reject)),
    })
    .await
    .unwrap();
    let (chunks, _) = chunks_for("d4", 3);
    let mut sock = tokio::net::TcpStream::connect(("127.0.0.1", info.bulk_port as u16))
        .await
        .unwrap();

    // A push whose header carries the slices and whose body carries their values.
    let push =
        |table: &str, push_id: Option<pb::PushId>, chunks: &[u64], encoding: pb::Encoding| {
            pb::PushDenseRequest {
                table: table.into(),
                push_id,
                map_epoch: 0,
                slices: chunks
                    .iter()
                    .map(|&chunk| pb::DenseSlice {
                        chunk,
                        values: Some(pb::Payload {
                            encoding: encoding as i32,
                            num_values: 4,
                            ..Default::default()
                        }),
                    })
                    .collect(),
                trace_context: Default::default(),
                authorization: String::new(),
            }
        };
    let values =
        |v: &[f32]| bytes::Bytes::from(v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>());
    let grad: Vec<bytes::Bytes> = chunks
        .iter()
        .map(|&c| values(&[c as f32, 0.5, -2.0, 4.0]))
        .collect();
    let id = push_id();
    let good = push("d4", id, &chunks, pb::Encoding::F32);
    let (code, header, _) = bulk_call(&mut sock, PUSH_DENSE, &good, &grad).await;
    assert_eq!(code, 0);
    let first: pb::PushResponse = prost::Message::decode(header.as_slice()).unwrap();
    assert_eq!(
        (first.duplicate, first.applied_values),
        (false, 4 * chunks.len() as u64)
    );
    // The same push again, on the same stream: acknowledged, not applied.
    let (code, header, _) = bulk_call(&mut sock, PUSH_DENSE, &good, &grad).await;
    assert_eq!(code, 0);
    let again: pb::PushResponse = prost::Message::decode(header.as_slice()).unwrap();
    assert!(again.duplicate);
    // Again as a push-and-pull: a duplicate still, answered with its chunks' values after the
    // push (SGD at rate 1 from zeros: the gradient negated), slice after slice.
    let (code, header, body) = bulk_call(&mut sock, PUSH_PULL_DENSE, &good, &grad).await;
    assert_eq!(code, 0);
    let both: pb::PushPullDenseResponse = prost::Message::decode(header.as_slice()).unwrap();
    assert!(both.push.unwrap().duplicate);
    let pulled = both.pull.expect("the pushed chunks pulled");
    assert_eq!(
        pulled.slices.iter().map(|s| s.chunk).collect::<Vec<_>>(),
        chunks
    );
    let got: Vec<f32> = body
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let want: Vec<f32> = chunks
        .iter()
        .flat_map(|&c| [-(c as f32), -0.5, 2.0, -4.0])
        .collect();
    assert_eq!(got, want);

    // The bulk pull answers what gRPC answers, as raw little-endian f32 after the header.
    let pull = pb::PullDenseRequest {
        table: "d4".into(),
        chunks: chunks.iter().rev().copied().collect(),
        ..Default::default()
    };
    let by_grpc = c.pull_dense(pull.clone()).await.unwrap().into_inner();
    let (code, header, body) = bulk_call(&mut sock, PULL_DENSE, &pull, &[]).await;
    assert_eq!(code, 0);
    let answer: pb::PullDenseResponse = prost::Message::decode(header.as_slice()).unwrap();
    assert_eq!(
        answer.slices.iter().map(|s| s.chunk).collect::<Vec<_>>(),
        pull.chunks
    );
    let want: Vec<f32> = by_grpc
        .slices
        .iter()
        .flat_map(|s| decode(s.values.as_ref().unwrap()))
        .collect();
    let got: Vec<f32> = body
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    assert_eq!(got, want);
    assert_eq!(got[..4], [-(pull.chunks[0] as f32), -0.5, 2.0, -4.0]);

    // Bad input: each refused with its code and reason, nothing applied, the stream usable.
    let one = &chunks[..1];
    let bad_pushes = [
        (
            Code::NotFound,
            "TABLE_NOT_FOUND",
            "nope",
            push("nope", push_id(), one, pb::Encoding::F32),
            grad[0].clone(),
        ),
        (
            Code::InvalidArgument,
            "INVALID_FIELD",
            "body",
            push("d4", push_id(), one, pb::Encoding::F32),
            values(&[1.0; 3]),
        ),
        (
            // A compressed payload's data is in the header: a body beside it is refused.
            Code::InvalidArgument,
            "INVALID_FIELD",
            "body",
            push("d4", push_id(), one, pb::Encoding::F16),
            values(&[1.0; 2]),
        ),
        (
            Code::InvalidArgument,
            "NON_FINITE",
            "NaN",
            push("d4", push_id(), one, pb::Encoding::F32),
            values(&[1.0, f32::NAN, 0.0, 0.0]),
        ),
        (
            Code::InvalidArgument,
            "INVALID_FIELD",
            "push_id",
            push("d4", None, one, pb::Encoding::F32),
            grad[0].clone(),
        ),
    ];
    for (code, reason, hint, req, body) in bad_pushes {
        // Refused alike as a push and as a push-and-pull (which then pulls nothing).
        for kind in [PUSH_DENSE, PUSH_PULL_DENSE] {
            bulk_refused(
                code,
                reason,
                hint,
                bulk_call(&mut sock, kind, &req, std::slice::from_ref(&body)).await,
            );
        }
    }
    // 2 MiB of values against a 1 MiB limit: refused, its body read and dropped.
    let mut big = push("big", push_id(), &[0, 1], pb::Encoding::F32);
    for s in &mut big.slices {
        s.values.as_mut().unwrap().num_values = 256 * 1024;
    }
    let mib = bytes::Bytes::from(vec![0u8; 1 << 20]);
    bulk_refused(
        Code::ResourceExhausted,
        "REQUEST_TOO_LARGE",
        "--max-request-bytes",
        bulk_call(&mut sock, PUSH_DENSE, &big, &[mib.clone(), mib]).await,
    );
    // A pull in another encoding is answered whole in the header, as gRPC answers it.
    let f16_pull = pb::PullDenseRequest {
        accept: pb::Encoding::F16 as i32,
        ..pull.clone()
    };
    let (code, header, f16_body) = bulk_call(&mut sock, PULL_DENSE, &f16_pull, &[]).await;
    assert_eq!(code, 0, "{}", String::from_utf8_lossy(&header));
    assert!(f16_body.is_empty());
    let f16: pb::PullDenseResponse = prost::Message::decode(header.as_slice()).unwrap();
    assert_eq!(f16, c.pull_dense(f16_pull).await.unwrap().into_inner());
    assert_eq!(
        f16.slices[0].values.as_ref().unwrap().encoding(),
        pb::Encoding::F16
    );
    bulk_refused(
        Code::Unimplemented,
        "NOT_ON_BULK_STREAM",
        "unknown",
        bulk_call(&mut sock, 9, &pull, &[]).await,
    );
    // Still the same stream, still the same values.
    let (code, _, body_after) = bulk_call(&mut sock, PULL_DENSE, &pull, &[]).await;
    assert_eq!(code, 0);
    assert_eq!(body_after, body);
    let stats = c
        .get_stats(pb::GetStatsRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!((stats.pushes_applied, stats.pushes_duplicate), (1, 2));
    assert_eq!(stats.bulk_calls, 18);

    // A stream that is not speaking the bulk framing is closed.
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stray = tokio::net::TcpStream::connect(("127.0.0.1", info.bulk_port as u16))
        .await
        .unwrap();
    stray
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 16];
    assert_eq!(stray.read(&mut buf).await.unwrap_or(0), 0);
    drop(sock);
    shard.stop().await;
}

/// Delta pulls on the bulk stream: answered whole in the header, as gRPC answers the same
/// pulls of another client (whole chunks in f32 first, then the change since), save for the
/// replicas' versions, which the shard draws at random; a bad one refused as gRPC refuses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bulk_stream_answers_delta_pulls_as_grpc_does() {
    use ps_proto::bulk::PULL_DENSE;
    let mut shard = start(1 << 20).await;
    let c = &mut shard.client;
    // Small chunks (their whole change in fp16) and large ones (the top of their change).
    for (name, len, chunk) in [("ds", 12, 4), ("dl", 3 * 4096, 4096)] {
        c.create_table(pb::CreateTableRequest {
            spec: Some(dense_spec(name, len, chunk, pb::NonFinitePolicy::Reject)),
        })
        .await
        .unwrap();
    }
    let mut sock = bulk_socket(c).await;
    for (name, len) in [("ds", 4usize), ("dl", 4096)] {
        let (chunks, _) = chunks_for(name, 3);
        let delta = |client_id: u64, versions: &[u64]| pb::PullDenseRequest {
            table: name.into(),
            chunks: chunks.clone(),
            delta: Some(pb::DeltaPull {
                client_id,
                ratio: 0.01,
                versions: versions.to_vec(),
            }),
            ..Default::default()
        };
        let none = vec![0; chunks.len()];
        let (mut bulk_versions, mut grpc_versions) = (none.clone(), none);
        for round in 0..3 {
            let (code, header, body) =
                bulk_call(&mut sock, PULL_DENSE, &delta(42, &bulk_versions), &[]).await;
            assert_eq!(code, 0, "{}", String::from_utf8_lossy(&header));
            assert!(body.is_empty(), "a delta pull is answered in the header");
            let by_bulk: pb::PullDenseResponse = prost::Message::decode(header.as_slice()).unwrap();
            let by_grpc = c
                .pull_dense(delta(43, &grpc_versions))
                .await
                .unwrap()
                .into_inner();
            assert_eq!(by_bulk.slices, by_grpc.slices, "{name}, round {round}");
            assert_eq!(by_bulk.is_delta, by_grpc.is_delta);
            // Whole chunks first, then changes against the replica each pull left.
            assert_eq!(by_bulk.is_delta, vec![round > 0; chunks.len()], "{name}");
            assert!(by_bulk.versions.iter().all(|&v| v != 0));
            if round > 0 {
                let encoding = by_bulk.slices[0].values.as_ref().unwrap().encoding();
                let want = if len <= 2048 {
                    pb::Encoding::F16
                } else {
                    pb::Encoding::SparseF16
                };
                assert_eq!(encoding, want, "{name}");
            }
            (bulk_versions, grpc_versions) = (by_bulk.versions, by_grpc.versions);
            // Move every chunk before the next pull.
            let grad = (0..len)
                .map(|i| (i % 7) as f32 - 3.0 + round as f32)
                .collect::<Vec<_>>();
            c.push_dense(pb::PushDenseRequest {
                table: name.into(),
                push_id: push_id(),
                slices: chunks
                    .iter()
                    .map(|&chunk| pb::DenseSlice {
                        chunk,
                        values: Some(ps_core::Payload::from_f32(&grad).into()),
                    })
                    .collect(),
                ..Default::default()
            })
            .await
            .unwrap();
        }
    }
    // One version short: refused as gRPC refuses it, and the stream still answers.
    let (chunks, _) = chunks_for("ds", 3);
    let short = pb::PullDenseRequest {
        table: "ds".into(),
        chunks: chunks.clone(),
        delta: Some(pb::DeltaPull {
            client_id: 42,
            ratio: 0.5,
            versions: vec![0; chunks.len() - 1],
        }),
        ..Default::default()
    };
    let grpc = c.pull_dense(short.clone()).await.unwrap_err();
    bulk_refused(
        grpc.code(),
        "INVALID_FIELD",
        "versions",
        bulk_call(&mut sock, PULL_DENSE, &short, &[]).await,
    );
    let plain = pb::PullDenseRequest {
        table: "ds".into(),
        chunks,
        ..Default::default()
    };
    let (code, _, body) = bulk_call(&mut sock, PULL_DENSE, &plain, &[]).await;
    assert_eq!(code, 0);
    assert_eq!(body.len(), 4 * 4 * plain.chunks.len());
    drop(sock);
    shard.stop().await;
}

/// Sparse pushes on the bulk stream: the rows' values are the body, applied exactly as the
/// same push through gRPC is (duplicate ids summed), once however often it is sent; bad
/// input is refused with gRPC's code and reason, nothing applied, and the stream stays usable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bulk_stream_applies_sparse_pushes_as_grpc_does_and_refuses_bad_input() {
    use ps_proto::bulk::PUSH_SPARSE;
    let mut shard = start(1 << 20).await;
    let c = &mut shard.client;
    for name in ["by_bulk", "by_grpc"] {
        c.create_table(pb::CreateTableRequest {
            spec: Some(sparse_spec(name, 2, pb::NonFinitePolicy::Reject)),
        })
        .await
        .unwrap();
    }
    // Ids shard 0 owns in both tables.
    let theirs = owned_ids("by_grpc", 64);
    let ids: Vec<u64> = owned_ids("by_bulk", 64)
        .into_iter()
        .filter(|i| theirs.contains(i))
        .take(2)
        .collect();
    assert_eq!(ids.len(), 2);
    let mut sock = bulk_socket(c).await;
    // A push whose header carries the ids and an empty payload, and whose body the values.
    let header = |table: &str, push_id, ids: Vec<u64>, encoding: pb::Encoding, n: u64| {
        pb::PushSparseRequest {
            table: table.into(),
            push_id,
            ids,
            values: Some(pb::Payload {
                encoding: encoding as i32,
                num_values: n,
                ..Default::default()
            }),
            ..Default::default()
        }
    };
    let values =
        |v: &[f32]| bytes::Bytes::from(v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>());
    let dup = vec![ids[0], ids[1], ids[0]];
    let grad = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
    let good = header("by_bulk", push_id(), dup.clone(), pb::Encoding::F32, 6);
    let (code, answer, _) = bulk_call(&mut sock, PUSH_SPARSE, &good, &[values(&grad)]).await;
    assert_eq!(code, 0, "{}", String::from_utf8_lossy(&answer));
    let first: pb::PushResponse = prost::Message::decode(answer.as_slice()).unwrap();
    assert_eq!((first.duplicate, first.applied_values), (false, 4));
    let (code, answer, _) = bulk_call(&mut sock, PUSH_SPARSE, &good, &[values(&grad)]).await;
    assert_eq!(code, 0);
    let again: pb::PushResponse = prost::Message::decode(answer.as_slice()).unwrap();
    assert!(again.duplicate);
    c.push_sparse(pb::PushSparseRequest {
        table: "by_grpc".into(),
        push_id: push_id(),
        ids: dup.clone(),
        values: Some(f32s(&grad)),
        ..Default::default()
    })
    .await
    .unwrap();
    let rows = async |c: &mut ParameterServerClient<Channel>, table: &str| {
        let r = c
            .pull_sparse(pull_rows(table, ids.clone()))
            .await
            .unwrap()
            .into_inner();
        decode(&r.values.unwrap())
    };
    let before = rows(c, "by_bulk").await;
    assert_eq!(before, [-6.0, -8.0, -3.0, -4.0]);
    assert_eq!(before, rows(c, "by_grpc").await);

    let bad = [
        (
            Code::NotFound,
            "TABLE_NOT_FOUND",
            "nope",
            header("nope", push_id(), ids.clone(), pb::Encoding::F32, 4),
            values(&[1.0; 4]),
        ),
        (
            Code::InvalidArgument,
            "INVALID_FIELD",
            "body",
            header("by_bulk", push_id(), ids.clone(), pb::Encoding::F32, 4),
            values(&[1.0; 3]),
        ),
        (
            // A compressed payload's data is in the header: a body beside it is refused.
            Code::InvalidArgument,
            "INVALID_FIELD",
            "body",
            header("by_bulk", push_id(), ids.clone(), pb::Encoding::F16, 4),
            values(&[1.0; 2]),
        ),
        (
            Code::InvalidArgument,
            "NON_FINITE",
            "NaN",
            header("by_bulk", push_id(), ids.clone(), pb::Encoding::F32, 4),
            values(&[1.0, f32::NAN, 0.0, 0.0]),
        ),
        (
            Code::InvalidArgument,
            "INVALID_FIELD",
            "need 4 values",
            header("by_bulk", push_id(), ids.clone(), pb::Encoding::F32, 6),
            values(&[1.0; 6]),
        ),
        (
            Code::InvalidArgument,
            "INVALID_FIELD",
            "push_id",
            header("by_bulk", None, ids.clone(), pb::Encoding::F32, 4),
            values(&[1.0; 4]),
        ),
        (
            Code::ResourceExhausted,
            "REQUEST_TOO_LARGE",
            "--max-request-bytes",
            header(
                "by_bulk",
                push_id(),
                vec![ids[0]; 1 << 17],
                pb::Encoding::F32,
                1 << 18,
            ),
            bytes::Bytes::from(vec![0u8; 1 << 20]),
        ),
    ];
    for (code, reason, hint, req, body) in bad {
        bulk_refused(
            code,
            reason,
            hint,
            bulk_call(&mut sock, PUSH_SPARSE, &req, &[body]).await,
        );
    }
    // A header without values is no push.
    let mut none = header("by_bulk", push_id(), ids.clone(), pb::Encoding::F32, 4);
    none.values = None;
    bulk_refused(
        Code::InvalidArgument,
        "INVALID_FIELD",
        "needs its values",
        bulk_call(&mut sock, PUSH_SPARSE, &none, &[]).await,
    );
    // Nothing changed, and the stream still carries pushes.
    assert_eq!(rows(c, "by_bulk").await, before);
    let once = header("by_bulk", push_id(), vec![ids[1]], pb::Encoding::F32, 2);
    let (code, _, _) = bulk_call(&mut sock, PUSH_SPARSE, &once, &[values(&[1.0, 1.0])]).await;
    assert_eq!(code, 0);
    assert_eq!(rows(c, "by_bulk").await, [-6.0, -8.0, -4.0, -5.0]);
    let stats = c
        .get_stats(pb::GetStatsRequest {})
        .await
        .unwrap()
        .into_inner();
    // Three applied (bulk, gRPC, bulk), one duplicate; every bulk call counted.
    assert_eq!((stats.pushes_applied, stats.pushes_duplicate), (3, 1));
    assert_eq!(stats.bulk_calls, 11);
    drop(sock);
    shard.stop().await;
}

/// Compressed pushes on the bulk stream carry their values in the header: dense and sparse,
/// each applied exactly as the same push through gRPC is, once however often it is sent; one
/// whose values do not decode is refused with gRPC's code and reason, and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bulk_stream_applies_compressed_pushes_from_their_headers() {
    use ps_proto::bulk::{PUSH_DENSE, PUSH_SPARSE};
    let mut shard = start(1 << 20).await;
    let c = &mut shard.client;
    // Chunks of 4 values; each table's first chunk this shard owns is pushed.
    for name in ["d_bulk", "d_grpc"] {
        c.create_table(pb::CreateTableRequest {
            spec: Some(dense_spec(name, 32, 4, pb::NonFinitePolicy::Reject)),
        })
        .await
        .unwrap();
    }
    for name in ["s_bulk", "s_grpc"] {
        c.create_table(pb::CreateTableRequest {
            spec: Some(sparse_spec(name, 2, pb::NonFinitePolicy::Reject)),
        })
        .await
        .unwrap();
    }
    let mut sock = bulk_socket(c).await;
    // fp16 of 1, -2, 0.5 and 4, in the payload itself.
    let fp16 = |bits: &[u16]| pb::Payload {
        encoding: pb::Encoding::F16 as i32,
        num_values: bits.len() as u64,
        data: bits.iter().flat_map(|b| b.to_le_bytes()).collect(),
        ..Default::default()
    };
    let grad = fp16(&[0x3c00, 0xc000, 0x3800, 0x4400]);
    let dense = |table: &str, push_id, values: pb::Payload| pb::PushDenseRequest {
        table: table.into(),
        push_id,
        slices: vec![pb::DenseSlice {
            chunk: chunks_for(table, 8).0[0],
            values: Some(values),
        }],
        ..Default::default()
    };
    let good = dense("d_bulk", push_id(), grad.clone());
    for duplicate in [false, true] {
        let (code, answer, body) = bulk_call(&mut sock, PUSH_DENSE, &good, &[]).await;
        assert_eq!(code, 0, "{}", String::from_utf8_lossy(&answer));
        assert!(body.is_empty());
        let r: pb::PushResponse = prost::Message::decode(answer.as_slice()).unwrap();
        assert_eq!(r.duplicate, duplicate);
    }
    c.push_dense(dense("d_grpc", push_id(), grad.clone()))
        .await
        .unwrap();
    let pulled = async |c: &mut ParameterServerClient<Channel>, table: &str| {
        let r = c
            .pull_dense(pb::PullDenseRequest {
                table: table.into(),
                chunks: chunks_for(table, 8).0[..1].to_vec(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        decode(r.slices[0].values.as_ref().unwrap())
    };
    // SGD at rate 1 from zeros: the gradient negated, once.
    assert_eq!(pulled(c, "d_bulk").await, [-1.0, 2.0, -0.5, -4.0]);
    assert_eq!(pulled(c, "d_bulk").await, pulled(c, "d_grpc").await);

    let ids: Vec<u64> = owned_ids("s_bulk", 64)
        .into_iter()
        .filter(|i| owned_ids("s_grpc", 64).contains(i))
        .take(2)
        .collect();
    let sparse = |table: &str, push_id, values: pb::Payload| pb::PushSparseRequest {
        table: table.into(),
        push_id,
        ids: ids.clone(),
        values: Some(values),
        ..Default::default()
    };
    let good = sparse("s_bulk", push_id(), grad.clone());
    for duplicate in [false, true] {
        let (code, answer, _) = bulk_call(&mut sock, PUSH_SPARSE, &good, &[]).await;
        assert_eq!(code, 0, "{}", String::from_utf8_lossy(&answer));
        let r: pb::PushResponse = prost::Message::decode(answer.as_slice()).unwrap();
        assert_eq!(r.duplicate, duplicate);
    }
    c.push_sparse(sparse("s_grpc", push_id(), grad.clone()))
        .await
        .unwrap();
    let rows = async |c: &mut ParameterServerClient<Channel>, table: &str| {
        let r = c
            .pull_sparse(pull_rows(table, ids.clone()))
            .await
            .unwrap()
            .into_inner();
        decode(&r.values.unwrap())
    };
    assert_eq!(rows(c, "s_bulk").await, [-1.0, 2.0, -0.5, -4.0]);
    assert_eq!(rows(c, "s_bulk").await, rows(c, "s_grpc").await);

    // Values that do not decode (fp16 of three values where four are claimed; a NaN) are
    // refused as gRPC refuses them; nothing changes and the stream carries the next push.
    let mut short = grad.clone();
    short.data = short.data.slice(..6);
    let nan = fp16(&[0x3c00, 0x7e00, 0x3800, 0x4400]);
    for (values, reason) in [(short, "INVALID_FIELD"), (nan, "NON_FINITE")] {
        let by_grpc = c
            .push_dense(dense("d_grpc", push_id(), values.clone()))
            .await
            .unwrap_err();
        assert_eq!(by_grpc.code(), Code::InvalidArgument);
        let answer = bulk_call(
            &mut sock,
            PUSH_DENSE,
            &dense("d_bulk", push_id(), values.clone()),
            &[],
        )
        .await;
        bulk_refused(Code::InvalidArgument, reason, "", answer);
        let answer = bulk_call(
            &mut sock,
            PUSH_SPARSE,
            &sparse("s_bulk", push_id(), values),
            &[],
        )
        .await;
        bulk_refused(Code::InvalidArgument, reason, "", answer);
    }
    assert_eq!(pulled(c, "d_bulk").await, [-1.0, 2.0, -0.5, -4.0]);
    assert_eq!(rows(c, "s_bulk").await, [-1.0, 2.0, -0.5, -4.0]);
    let stats = c
        .get_stats(pb::GetStatsRequest {})
        .await
        .unwrap()
        .into_inner();
    // Two applied by bulk and two by gRPC; two duplicates; eight bulk calls.
    assert_eq!((stats.pushes_applied, stats.pushes_duplicate), (4, 2));
    assert_eq!(stats.bulk_calls, 8);
    drop(sock);
    shard.stop().await;
}

/// Sparse pulls on the bulk stream are answered whole in the header exactly as gRPC answers
/// them (f32 and fp16 rows, a table read beside another, held rows marked unchanged), and bad
/// ones are refused with gRPC's code and reason, the stream carrying the next call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bulk_stream_answers_sparse_pulls_as_grpc_does() {
    use ps_proto::bulk::{PULL_SPARSE, PUSH_SPARSE};
    use tonic_types::StatusExt;
    let mut shard = start(1 << 20).await;
    let c = &mut shard.client;
    c.create_table(pb::CreateTableRequest {
        spec: Some(sparse_spec("rows", 2, pb::NonFinitePolicy::Reject)),
    })
    .await
    .unwrap();
    let mut beside = sparse_spec("beside", 2, pb::NonFinitePolicy::Reject);
    if let Some(pb::table_spec::Kind::Sparse(s)) = beside.kind.as_mut() {
        s.placed_with = "rows".into();
    }
    c.create_table(pb::CreateTableRequest { spec: Some(beside) })
        .await
        .unwrap();
    let ids = owned_ids("rows", 3);
    let mut sock = bulk_socket(c).await;
    // Two of the three rows pushed (by bulk, plain f32 as the body), the third never.
    let push = push_ones("rows", ids[..2].to_vec(), push_id());
    let body = push.values.as_ref().unwrap().data.clone();
    let mut header = push.clone();
    header.values.as_mut().unwrap().data = Default::default();
    let (code, answer, _) = bulk_call(&mut sock, PUSH_SPARSE, &header, &[body]).await;
    assert_eq!(code, 0, "{}", String::from_utf8_lossy(&answer));

    let by_bulk = async |sock: &mut tokio::net::TcpStream, req: &pb::PullSparseRequest| {
        let (code, answer, body) = bulk_call(sock, PULL_SPARSE, req, &[]).await;
        assert_eq!(code, 0, "{}", String::from_utf8_lossy(&answer));
        assert!(body.is_empty(), "a sparse pull's answer has no body");
        <pb::PullSparseResponse as prost::Message>::decode(answer.as_slice()).unwrap()
    };
    let f32_pull = pull_rows("rows", ids.clone());
    let grpc = c.pull_sparse(f32_pull.clone()).await.unwrap().into_inner();
    let bulk = by_bulk(&mut sock, &f32_pull).await;
    assert_eq!(bulk, grpc);
    let rows = decode(bulk.values.as_ref().unwrap());
    assert_eq!(&rows[..4], [-1.0; 4], "SGD at rate 1 from zeros");

    // fp16 rows of both tables in one call, the first two rows of `rows` held by the caller:
    // the first as it is (-1 is exact in fp16, so its digest is the f32 row's), the second
    // with a stale digest (sent again).
    let digest = ps_core::hash::row_digest;
    let fp16_pull = pb::PullSparseRequest {
        accept: pb::Encoding::F16 as i32,
        held: vec![0b011],
        held_digests: vec![digest(&rows[..2]), digest(&[0.0, 0.0])],
        also: vec![pb::PullSparseAlso {
            table: "beside".into(),
            accept: pb::Encoding::F16 as i32,
            ..Default::default()
        }],
        ..pull_rows("rows", ids.clone())
    };
    let grpc = c.pull_sparse(fp16_pull.clone()).await.unwrap().into_inner();
    let bulk = by_bulk(&mut sock, &fp16_pull).await;
    assert_eq!(bulk, grpc);
    assert_eq!(bulk.unchanged, [0b001], "the first row is unchanged");
    assert_eq!(bulk.values.as_ref().unwrap().num_values, 4);
    assert_eq!(bulk.also.len(), 1);

    // Bad pulls: refused with gRPC's code and reason, on a stream that stays usable.
    let unknown = pull_rows("nope", ids.clone());
    let both_ids = pb::PullSparseRequest {
        fixed_ids: ids.clone(),
        ..pull_rows("rows", ids.clone())
    };
    let not_owned = pull_rows("rows", vec![ids_for("rows").1]);
    let short_digests = pb::PullSparseRequest {
        held: vec![0b111],
        held_digests: vec![1],
        ..pull_rows("rows", ids.clone())
    };
    for bad in [unknown, both_ids, not_owned, short_digests] {
        let want = c.pull_sparse(bad.clone()).await.unwrap_err();
        let reason = want.get_details_error_info().expect("error details").reason;
        let answer = bulk_call(&mut sock, PULL_SPARSE, &bad, &[]).await;
        bulk_refused(want.code(), &reason, "", answer);
    }
    // A pull with a body is refused, its body read; the stream carries the next pull.
    let answer = bulk_call(
        &mut sock,
        PULL_SPARSE,
        &f32_pull,
        &[bytes::Bytes::from_static(&[0; 8])],
    )
    .await;
    bulk_refused(Code::InvalidArgument, "INVALID_FIELD", "body", answer);
    assert_eq!(
        by_bulk(&mut sock, &f32_pull).await.values,
        grpc_values(c, &f32_pull).await
    );

    let stats = c
        .get_stats(pb::GetStatsRequest {})
        .await
        .unwrap()
        .into_inner();
    // Pulls change nothing: one push applied. Calls by bulk: a push, 3 good pulls, 5 refused.
    assert_eq!((stats.pushes_applied, stats.pushes_duplicate), (1, 0));
    assert_eq!(stats.bulk_calls, 9);
    drop(sock);
    shard.stop().await;
}

/// The values gRPC answers to a sparse pull.
async fn grpc_values(
    c: &mut ParameterServerClient<Channel>,
    req: &pb::PullSparseRequest,
) -> Option<pb::Payload> {
    c.pull_sparse(req.clone())
        .await
        .unwrap()
        .into_inner()
        .values
}

/// Reads a whole export; the status it ended in, when it failed.
async fn export(
    c: &mut ParameterServerClient<Channel>,
    checkpoint: &str,
    since: &str,
    tables: &[&str],
) -> Result<Vec<ps_core::ExportPart>, tonic::Status> {
    let mut s = c
        .export_checkpoint(pb::ExportCheckpointRequest {
            checkpoint: checkpoint.into(),
            since: since.into(),
            tables: tables.iter().map(|t| t.to_string()).collect(),
        })
        .await?
        .into_inner();
    let mut parts = Vec::new();
    while let Some(p) = s.message().await? {
        parts.push(ps_core::ExportPart::try_from(p).unwrap());
    }
    Ok(parts)
}

/// A checkpoint's export: every row in key order; against an earlier checkpoint, only the rows
/// that differ and the keys that are gone (here, of a table dropped and created again between
/// the two). Bad requests are refused with a status that says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_export_streams_a_checkpoint_or_its_changes_and_refuses_bad_requests() {
    use ps_core::ExportPart;
    let mut shard = start(64 << 20).await;
    let c = &mut shard.client;
    let create = pb::CreateTableRequest {
        spec: Some(sparse_spec("e", 2, pb::NonFinitePolicy::Reject)),
    };
    let (ids, _) = ids_for("e");
    let push = |ids: Vec<u64>, values: &[f32]| pb::PushSparseRequest {
        table: "e".into(),
        push_id: push_id(),
        map_epoch: 0,
        ids,
        values: Some(f32s(values)),
        clock: None,
        ..Default::default()
    };
    let checkpoint = |name: &str| pb::CheckpointRequest { name: name.into() };
    c.create_table(create.clone()).await.unwrap();
    c.push_sparse(push(vec![ids[0], ids[1]], &[1.0, 1.0, 2.0, 2.0]))
        .await
        .unwrap();
    c.checkpoint(checkpoint("a")).await.unwrap();
    c.drop_table(pb::DropTableRequest { name: "e".into() })
        .await
        .unwrap();
    c.create_table(create).await.unwrap();
    c.push_sparse(push(vec![ids[2], ids[1]], &[3.0, 3.0, 2.0, 2.0]))
        .await
        .unwrap();
    c.checkpoint(checkpoint("b")).await.unwrap();

    let spec =
        ps_core::TableSpec::try_from(sparse_spec("e", 2, pb::NonFinitePolicy::Reject)).unwrap();
    let full = export(c, "b", "", &["e"]).await.unwrap();
    assert_eq!(
        full,
        [
            ExportPart::Table(spec.clone()),
            ExportPart::Rows {
                keys: vec![ids[1], ids[2]],
                values: vec![-2.0, -2.0, -3.0, -3.0]
            }
        ]
    );
    let changed = export(c, "b", "a", &["e"]).await.unwrap();
    assert_eq!(
        changed,
        [
            ExportPart::Table(spec.clone()),
            ExportPart::Rows {
                keys: vec![ids[2]],
                values: vec![-3.0, -3.0]
            },
            ExportPart::Deleted { keys: vec![ids[0]] }
        ]
    );
    let first = export(c, "a", "", &["e"]).await.unwrap();
    assert_eq!(
        first[1],
        ExportPart::Rows {
            keys: vec![ids[0], ids[1]],
            values: vec![-1.0, -1.0, -2.0, -2.0]
        }
    );

    let code = |r: Result<Vec<ExportPart>, tonic::Status>| r.unwrap_err().code();
    assert_eq!(code(export(c, "nope", "", &["e"]).await), Code::NotFound);
    assert_eq!(code(export(c, "b", "nope", &["e"]).await), Code::NotFound);
    assert_eq!(
        code(export(c, "../b", "", &["e"]).await),
        Code::InvalidArgument
    );
    assert_eq!(code(export(c, "", "", &["e"]).await), Code::InvalidArgument);
    assert_eq!(code(export(c, "b", "", &[]).await), Code::InvalidArgument);
    assert_eq!(
        code(export(c, "b", "", &["e", "e"]).await),
        Code::InvalidArgument
    );
    let missing = export(c, "b", "", &["e", "f"]).await.unwrap_err();
    assert_eq!(missing.code(), Code::InvalidArgument);
    assert!(missing.message().contains("no table `f`"), "{missing:?}");
    // A checkpoint whose files no longer match its manifest is refused, not read.
    let dir = shard._dir.path().join("checkpoints/b/db");
    let sst = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "sst"))
        .expect("an SST file in the checkpoint");
    // The file is a hard link to one of the live store's: the damaged copy replaces the link.
    let mut bytes = std::fs::read(&sst).unwrap();
    bytes[0] ^= 0xff;
    std::fs::remove_file(&sst).unwrap();
    std::fs::write(&sst, bytes).unwrap();
    assert_eq!(code(export(c, "b", "", &["e"]).await), Code::DataLoss);
    shard.stop().await;
}

/// A push of gradient 1.0 to every value of rows `ids` (dim 2) of `table`.
fn push_ones(table: &str, ids: Vec<u64>, push_id: Option<pb::PushId>) -> pb::PushSparseRequest {
    pb::PushSparseRequest {
        table: table.into(),
        push_id,
        map_epoch: 0,
        values: Some(f32s(&vec![1.0; ids.len() * 2])),
        ids,
        clock: None,
        ..Default::default()
    }
}

fn pull_rows(table: &str, ids: Vec<u64>) -> pb::PullSparseRequest {
    pb::PullSparseRequest {
        table: table.into(),
        ids,
        ..Default::default()
    }
}

/// Admission by frequency: an id's row is stored on its third push (`admit_after = 3`); the
/// pushes before are acknowledged but change nothing (pulls get the initializer's value), a
/// retried push counts once, ids already stored are never held back, and DescribeTable shows
/// the policy and what it did. A threshold past the sketch's range is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_stores_an_id_from_its_nth_push() {
    let mut shard = start(64 << 20).await;
    let c = &mut shard.client;
    let mut spec = sparse_spec("adm", 2, pb::NonFinitePolicy::Reject);
    if let Some(pb::table_spec::Kind::Sparse(s)) = &mut spec.kind {
        s.admit_after = 3;
    }
    c.create_table(pb::CreateTableRequest {
        spec: Some(spec.clone()),
    })
    .await
    .unwrap();
    let (ids, _) = ids_for("adm");
    let (a, b) = (ids[0], ids[1]);
    let push = |ids, push_id| push_ones("adm", ids, push_id);
    let pull = |ids| pull_rows("adm", ids);
    // Two pushes of `a` (the second one sent twice: a retry), one of `b`: nothing stored yet.
    c.push_sparse(push(vec![a, b], push_id())).await.unwrap();
    let second = push_id();
    c.push_sparse(push(vec![a], second)).await.unwrap();
    let retry = c
        .push_sparse(push(vec![a], second))
        .await
        .unwrap()
        .into_inner();
    assert!(retry.duplicate);
    let got = c.pull_sparse(pull(vec![a, b])).await.unwrap().into_inner();
    assert_eq!(decode(&got.values.unwrap()), [0.0; 4]);
    // The third push of `a` stores it with that push's gradient; `b` is still held back.
    let third = c
        .push_sparse(push(vec![a, b], push_id()))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(third.applied_values, 2);
    let got = c.pull_sparse(pull(vec![a, b])).await.unwrap().into_inner();
    assert_eq!(decode(&got.values.unwrap()), [-1.0, -1.0, 0.0, 0.0]);
    // Once stored, every push applies.
    c.push_sparse(push(vec![a], push_id())).await.unwrap();
    let got = c.pull_sparse(pull(vec![a])).await.unwrap().into_inner();
    assert_eq!(decode(&got.values.unwrap()), [-2.0, -2.0]);

    let d = c
        .describe_table(pb::DescribeTableRequest { name: "adm".into() })
        .await
        .unwrap()
        .into_inner();
    let Some(pb::table_spec::Kind::Sparse(s)) = d.spec.unwrap().kind else {
        panic!("a sparse spec");
    };
    assert_eq!(s.admit_after, 3);
    let stats = d.stats.unwrap();
    assert_eq!(
        (stats.rows, stats.rows_admitted, stats.rows_held_back),
        (1, 1, 4),
        "{stats:?}"
    );

    let mut big = spec;
    big.name = "adm-big".into();
    if let Some(pb::table_spec::Kind::Sparse(s)) = &mut big.kind {
        s.admit_after = 1_000_000;
    }
    let e = c
        .create_table(pb::CreateTableRequest { spec: Some(big) })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("admit_after"), "{e:?}");
    shard.stop().await;
}

/// Waits (up to 20 s) until `table`'s stats on the shard satisfy `done`; returns them.
async fn stats_when(
    c: &mut ParameterServerClient<Channel>,
    table: &str,
    done: impl Fn(&pb::TableStats) -> bool,
) -> pb::TableStats {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let stats = c
            .describe_table(pb::DescribeTableRequest { name: table.into() })
            .await
            .unwrap()
            .into_inner()
            .stats
            .unwrap();
        if done(&stats) {
            return stats;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "`{table}` never got there: {stats:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

fn sparse_policy(name: &str, ttl_seconds: u64, max_rows: u64) -> pb::TableSpec {
    let mut spec = sparse_spec(name, 2, pb::NonFinitePolicy::Reject);
    if let Some(pb::table_spec::Kind::Sparse(s)) = &mut spec.kind {
        s.ttl_seconds = ttl_seconds;
        s.max_rows = max_rows;
    }
    spec
}

/// Eviction by age, with the shard's clock paused and moved by hand: a row not pushed for
/// `ttl_seconds` is deleted (pulls do not keep it alive), the others stay exactly as trained;
/// an evicted id starts again from the initializer; the ages survive a restart; an incremental
/// export lists the evicted rows as deleted. Bad policies are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_idle_past_their_ttl_are_evicted_by_the_shards_clock() {
    let clock = ps_server::engine::Clock::manual(1_000_000);
    let shard = start_in(tempfile::tempdir().unwrap(), 64 << 20, clock.clone()).await;
    let mut shard = shard;
    let c = &mut shard.client;
    c.create_table(pb::CreateTableRequest {
        spec: Some(sparse_policy("ttl", 100, 0)),
    })
    .await
    .unwrap();
    let ids = owned_ids("ttl", 3);
    let (a, b, d) = (ids[0], ids[1], ids[2]);
    let push = |ids| push_ones("ttl", ids, push_id());
    let pull = |ids| pull_rows("ttl", ids);
    c.push_sparse(push(vec![a, b])).await.unwrap();
    c.checkpoint(pb::CheckpointRequest {
        name: "before".into(),
    })
    .await
    .unwrap();
    clock.advance(60);
    c.push_sparse(push(vec![a])).await.unwrap();
    // b is pulled, not pushed: it still ages.
    c.pull_sparse(pull(vec![b])).await.unwrap();
    clock.advance(40);
    // b's 100 s are up (a has 40 of them): the writer's tick evicts b alone.
    let stats = stats_when(c, "ttl", |s| s.rows_expired > 0).await;
    assert_eq!(
        (stats.rows, stats.rows_expired, stats.rows_capped),
        (1, 1, 0)
    );
    let got = c.pull_sparse(pull(vec![a, b])).await.unwrap().into_inner();
    assert_eq!(decode(&got.values.unwrap()), [-2.0, -2.0, 0.0, 0.0]);
    c.checkpoint(pb::CheckpointRequest {
        name: "after".into(),
    })
    .await
    .unwrap();
    let changed = export(c, "after", "before", &["ttl"]).await.unwrap();
    assert_eq!(
        changed[1..],
        [
            ps_core::ExportPart::Rows {
                keys: vec![a],
                values: vec![-2.0, -2.0]
            },
            ps_core::ExportPart::Deleted { keys: vec![b] }
        ]
    );
    // An evicted id starts again; d is new. The ages are stored: after a restart a and d
    // expire when their time comes, not from the restart.
    c.push_sparse(push(vec![b, d])).await.unwrap();
    let dir = shard.stop_keeping().await;
    let mut shard = start_in(dir, 64 << 20, clock.clone()).await;
    let c = &mut shard.client;
    let got = c
        .pull_sparse(pull(vec![a, b, d]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        decode(&got.values.unwrap()),
        [-2.0, -2.0, -1.0, -1.0, -1.0, -1.0]
    );
    clock.advance(61); // a last pushed 101 s ago, b and d 61 s ago
    let stats = stats_when(c, "ttl", |s| s.rows_expired > 0).await;
    assert_eq!((stats.rows, stats.rows_expired), (2, 1), "{stats:?}");
    clock.advance(40);
    let stats = stats_when(c, "ttl", |s| s.rows == 0).await;
    assert_eq!(stats.rows_expired, 3, "{stats:?}");
    let got = c
        .pull_sparse(pull(vec![a, b, d]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(decode(&got.values.unwrap()), [0.0; 6]);

    // Policies that cannot be kept are refused, and create nothing.
    for (spec, field) in [
        (sparse_policy("bad", 11 * 365 * 86_400, 0), "ttl_seconds"),
        (sparse_policy("bad", 0, 1 << 50), "max_rows"),
    ] {
        let e = c
            .create_table(pb::CreateTableRequest { spec: Some(spec) })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        assert!(e.message().contains(field), "{e:?}");
    }
    let e = c
        .describe_table(pb::DescribeTableRequest { name: "bad".into() })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    shard.stop().await;

    // An in-memory shard has no store to keep the ages in: it refuses such tables.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(ps_server::run(
        ServerConfig::local(None),
        listener,
        None,
        shutdown.clone(),
    ));
    let mut c = ParameterServerClient::connect(url).await.unwrap();
    let e = c
        .create_table(pb::CreateTableRequest {
            spec: Some(sparse_policy("ttl", 100, 0)),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("needs a durable shard"), "{e:?}");
    shutdown.cancel();
    task.await.unwrap().unwrap();
}

/// A hard row cap: each of the 2 shards holds at most ceil(9 / 2) = 5 rows of the table; past
/// it the least recently pushed rows go (pushing a row again makes it recent), the rest keep
/// their trained values, and DescribeTable counts what was evicted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_cap_evicts_the_least_recently_pushed_rows() {
    let clock = ps_server::engine::Clock::manual(2_000_000);
    let mut shard = start_in(tempfile::tempdir().unwrap(), 64 << 20, clock.clone()).await;
    let c = &mut shard.client;
    c.create_table(pb::CreateTableRequest {
        spec: Some(sparse_policy("cap", 0, 9)),
    })
    .await
    .unwrap();
    let ids = owned_ids("cap", 7);
    let push = |ids| push_ones("cap", ids, push_id());
    // ids[0..5] pushed a second apart, then ids[0] again: ids[1] is now the oldest.
    for &id in &ids[..5] {
        c.push_sparse(push(vec![id])).await.unwrap();
        clock.advance(1);
    }
    c.push_sparse(push(vec![ids[0]])).await.unwrap();
    clock.advance(1);
    let stats = stats_when(c, "cap", |s| s.rows == 5).await;
    assert_eq!(stats.rows_capped, 0);
    // Two new rows: 7 > 5, so the two least recently pushed (ids[1], ids[2]) go.
    c.push_sparse(push(vec![ids[5], ids[6]])).await.unwrap();
    let stats = stats_when(c, "cap", |s| s.rows_capped > 0).await;
    assert_eq!(
        (stats.rows, stats.rows_capped, stats.rows_expired),
        (5, 2, 0)
    );
    let got = c
        .pull_sparse(pull_rows("cap", ids.clone()))
        .await
        .unwrap()
        .into_inner();
    let values = decode(&got.values.unwrap());
    let rows: Vec<f32> = values.chunks(2).map(|r| r[0]).collect();
    assert_eq!(rows, [-2.0, 0.0, 0.0, -1.0, -1.0, -1.0, -1.0]);
    let d = c
        .describe_table(pb::DescribeTableRequest { name: "cap".into() })
        .await
        .unwrap()
        .into_inner();
    let Some(pb::table_spec::Kind::Sparse(s)) = d.spec.unwrap().kind else {
        panic!("a sparse spec");
    };
    assert_eq!((s.ttl_seconds, s.max_rows), (0, 9));
    shard.stop().await;
}

/// Eviction by job clocks: rows are aged by the clock their pushes carry and the table's clock
/// is the newest one pushed, so wall-clock time does not matter; a push without a clock counts
/// as the newest clock. A table cannot age by both seconds and clocks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_not_pushed_for_ttl_clocks_job_clocks_are_evicted() {
    let clock = ps_server::engine::Clock::manual(3_000_000);
    let mut shard = start_in(tempfile::tempdir().unwrap(), 64 << 20, clock.clone()).await;
    let c = &mut shard.client;
    let mut spec = sparse_policy("clk", 0, 0);
    if let Some(pb::table_spec::Kind::Sparse(s)) = &mut spec.kind {
        s.ttl_clocks = 3;
    }
    c.create_table(pb::CreateTableRequest {
        spec: Some(spec.clone()),
    })
    .await
    .unwrap();
    let ids = owned_ids("clk", 5);
    let push = |i: usize, clock: Option<u64>| pb::PushSparseRequest {
        clock,
        ..push_ones("clk", vec![ids[i]], push_id())
    };
    c.push_sparse(push(0, Some(0))).await.unwrap();
    c.push_sparse(push(1, Some(2))).await.unwrap();
    c.push_sparse(push(2, None)).await.unwrap(); // counts as clock 2
    clock.advance(1_000_000); // seconds do not age this table
    c.push_sparse(push(3, Some(3))).await.unwrap(); // clock 3: row 0 is 3 clocks old
    let stats = stats_when(c, "clk", |s| s.rows_expired > 0).await;
    assert_eq!((stats.rows, stats.rows_expired), (3, 1), "{stats:?}");
    c.push_sparse(push(4, Some(5))).await.unwrap(); // clock 5: rows 1 and 2 go, 3 stays
    let stats = stats_when(c, "clk", |s| s.rows_expired >= 3).await;
    assert_eq!((stats.rows, stats.rows_expired), (2, 3), "{stats:?}");
    let got = c.pull_sparse(pull_rows("clk", ids.clone())).await.unwrap();
    let rows: Vec<f32> = decode(&got.into_inner().values.unwrap())
        .chunks(2)
        .map(|r| r[0])
        .collect();
    assert_eq!(rows, [0.0, 0.0, 0.0, -1.0, -1.0]);

    if let Some(pb::table_spec::Kind::Sparse(s)) = &mut spec.kind {
        s.ttl_seconds = 60;
    }
    spec.name = "both".into();
    let e = c
        .create_table(pb::CreateTableRequest { spec: Some(spec) })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("not both"), "{e:?}");
    shard.stop().await;
}
