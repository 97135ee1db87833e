//! `ps-bench`: push+pull goodput and sparse update rate on 127.0.0.1, with the machine's own
//! limits (memcpy and a raw loopback TCP stream) measured in the same run. One JSON line per
//! case, each with its ratio to those limits.
//!
//! ```text
//! cargo run --release --bin ps-bench            # everything, about two minutes
//! cargo run --release --bin ps-bench -- --quick # fewer sizes and shorter runs
//! ```

use std::io::{Read, Write};
use std::net::{TcpListener as StdListener, TcpStream};
use std::time::Instant;

use clap::Parser;
use ps_client::{ClientConfig, PsClient};
use ps_core::{Optimizer, TableSpec};
use ps_server::ServerConfig;
use rand::SeedableRng;
use rand_distr::{Distribution, Zipf};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
#[command(about = "Parameter-server goodput against memcpy and loopback TCP, in one run")]
struct Args {
    /// Fewer sizes and shorter runs.
    #[arg(long)]
    quick: bool,
    /// Seconds per case (at least 3 rounds are always run).
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    /// Seconds of push+pull rounds before each dense case is timed (at least one round; on
    /// durable shards also until a lap of their push logs, for at most 20 s).
    #[arg(long, default_value_t = 2.0)]
    warmup: f64,
    /// Only the dense cases with this many floats (repeatable).
    #[arg(long)]
    floats: Vec<usize>,
    /// Skip the sparse cases.
    #[arg(long)]
    no_sparse: bool,
    /// Only the sparse cases.
    #[arg(long)]
    only_sparse: bool,
    /// Only this mode for the dense cases: durable or memory.
    #[arg(long)]
    mode: Option<String>,
    /// The client's largest request, in KiB (smaller requests pipeline better).
    #[arg(long, default_value_t = 1024)]
    request_kib: usize,
    /// The shards' dense-log size in MiB (the server's `dense_log_mib`; its default if unset).
    #[arg(long)]
    dense_log_mib: Option<u64>,
    /// A RocksDB tunable of every `ps-server` process the run starts, as the `[rocksdb]`
    /// table of its config file takes it (`level0_compaction_trigger=32`; repeatable): to
    /// measure a setting without a build of its own.
    #[arg(long = "rocksdb", value_name = "KEY=VALUE")]
    rocksdb: Vec<String>,
    /// A top-level setting of every `ps-server` process the run starts, as its config file
    /// takes it (`writer_spin_us=0`, `inline_push_bytes=0`, `group_commit_bytes=65536`;
    /// repeatable): to measure a setting of the server's own without a build of its own.
    #[arg(long = "server", value_name = "KEY=VALUE")]
    server: Vec<String>,
    /// Pushes and pulls through gRPC only, not the shards' bulk stream.
    #[arg(long)]
    grpc_only: bool,
    /// Mutual TLS on every connection, with the certificates `scripts/dev-certs.sh DIR` made
    /// (to measure what TLS costs: run with and without it).
    #[arg(long)]
    tls_dir: Option<std::path::PathBuf>,
    /// Only the optimizer's pass of a durable shard's dense push, on one core: SGD over 1 MiB
    /// chunks of gradients taken in turn from 64 MiB of them (out of the caches, as the body
    /// ring's pages are), with the gradient's CRC-32 taken in a pass of its own, in the
    /// optimizer's pass as the shard takes it (`optim::apply_checksummed`), and not at all; and
    /// the bulk listener's NaN and infinity check over one read's bytes in the core's cache,
    /// f32-aligned and one byte off; core-ms per GB of gradient, each of --rounds rounds.
    #[arg(long)]
    only_apply: bool,
    /// Rounds of --only-apply.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Only the flood cases: one tenant's pull latency while another floods the shard with
    /// pushes, without limits and with the flooder's token limited to this many calls in
    /// flight (tokens checked on both runs).
    #[arg(long)]
    flood: Option<u32>,
    /// Only the store cases: durable sparse updates per second (dim 64, Adagrad, Zipf 1.05 ids
    /// over --keys) on a ps-server process with the hot set in its row cache and with a cache
    /// ten times smaller than the table, and with the hot set cached on a table that evicts
    /// rows (a day's TTL and --evict-cap), its resident memory against the cache's budget, and
    /// the time a shard takes to serve again after kill -9 with each of --restart-rows rows,
    /// then how fast it exports them (full, and incremental after 1% changed).
    #[arg(long)]
    store: bool,
    /// The sparse cases' key space.
    #[arg(long, default_value_t = 100_000_000)]
    keys: u64,
    /// The row cache of the store cases' first run, in MiB (the second gets a tenth of the
    /// table) [default: room for every row the run touches].
    #[arg(long)]
    cache_mib: Option<u64>,
    /// Rows stored before each kill -9 of the restart cases (comma-separated; 0: none).
    #[arg(long, value_delimiter = ',', default_values_t = [1_000_000u64, 10_000_000, 50_000_000])]
    restart_rows: Vec<u64>,
    /// With --store: only the restart cases.
    #[arg(long)]
    only_restart: bool,
    /// With --store: the row cap (`max_rows`) of the run on a table that evicts rows.
    #[arg(long, default_value_t = 1_000_000)]
    evict_cap: u64,
    /// Run the shards inside this process, on a runtime of their own, instead of as
    /// `ps-server` processes.
    #[arg(long)]
    in_process: bool,
    /// How each dense case's steps run (comma-separated): `pair`, a push then a pull, each
    /// awaited (`push_dense`, then `pull_dense_into`); `fused`, the SDK's `push_pull_dense`,
    /// which pulls each request's chunks once their push is acknowledged.
    #[arg(long, value_delimiter = ',', default_values_t = ["pair".to_owned(), "fused".to_owned()])]
    steps: Vec<String>,
    /// The dense cases' layouts, shards x clients (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = ["1x1".to_owned(), "2x2".to_owned(), "4x4".to_owned()])]
    layouts: Vec<String>,
    /// ps-lite's side of each dense case, in the same run: a `pslite-dense` program that
    /// `scripts/pslite-bench.sh` builds (repeatable: one per build of ps-lite). Each layout's
    /// dense cases then start with ps-lite's (scheduler, servers and workers as processes on
    /// 127.0.0.1, ZeroMQ van), reported as `pslite_dense` lines named by the program's file
    /// name, and each of ours gives its `ratio_pslite` against the fastest of them.
    #[arg(long, value_name = "BIN")]
    pslite: Vec<std::path::PathBuf>,
}

/// `iperf3` (a 1 MiB-write TCP stream on 127.0.0.1 for three seconds) when it is installed:
/// the machine's loopback limit as the usual tool measures it, in GB/s.
fn iperf3_gbps() -> Option<f64> {
    let port = StdListener::bind("127.0.0.1:0")
        .ok()?
        .local_addr()
        .ok()?
        .port()
        .to_string();
    let mut server = std::process::Command::new("iperf3")
        .args(["-s", "-1", "-B", "127.0.0.1", "-p", &port])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .ok()?;
    let mut out = None;
    for _ in 0..50 {
        std::thread::sleep(std::time::Duration::from_millis(100));
        let o = std::process::Command::new("iperf3")
            .args(["-c", "127.0.0.1", "-p", &port, "-l", "1M", "-t", "3", "-J"])
            .output()
            .ok()?;
        if o.status.success() {
            out = Some(o.stdout);
            break;
        }
    }
    let _ = server.kill();
    let _ = server.wait();
    let v: serde_json::Value = serde_json::from_slice(&out?).ok()?;
    v["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .map(|bps| bps / 8e9)
}

fn memcpy_gbps() -> f64 {
    let n = 256 << 20;
    let src = vec![1u8; n];
    let mut dst = vec![0u8; n];
    dst.copy_from_slice(&src); // fault the pages in
    let reps = 8;
    let t = Instant::now();
    for i in 0..reps {
        dst.copy_from_slice(&src);
        std::hint::black_box(&dst[i]);
    }
    (n * reps) as f64 / t.elapsed().as_secs_f64() / 1e9
}

/// `--only-apply`: what a dense gradient's checksum costs the shard's optimizer pass, taken
/// in its own pass over the gradient or in the optimizer's, block by block.
fn apply_case(rounds: usize) {
    const CHUNK: usize = 1 << 18; // 1 MiB of f32, a request's largest chunk
    const CHUNKS: usize = 64;
    let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(7);
    let normal = rand_distr::Normal::new(0.0f32, 1e-3).expect("a normal distribution");
    let grads: Vec<Vec<f32>> = (0..CHUNKS)
        .map(|_| (0..CHUNK).map(|_| normal.sample(&mut rng)).collect())
        .collect();
    let opt = Optimizer::sgd(0.001);
    let (mut w, mut state, mut step) = (vec![0.0f32; CHUNK], Vec::new(), 0);
    let reps = 4 * CHUNKS;
    let gb = (reps * CHUNK * 4) as f64 / 1e9;
    let mut sums = 0u32;
    for round in 0..rounds {
        let time = |f: &mut dyn FnMut(&[f32])| {
            let t = Instant::now();
            for r in 0..reps {
                f(&grads[r % CHUNKS]);
            }
            t.elapsed().as_secs_f64() * 1e3 / gb
        };
        let own_pass = time(&mut |g| {
            ps_core::optim::apply(&opt, &mut w, &mut state, &mut step, g);
            sums ^= crc32fast::hash(bytemuck::cast_slice(g));
        });
        let in_pass = time(&mut |g| {
            sums ^= ps_core::optim::apply_checksummed(&opt, &mut w, &mut state, &mut step, g);
        });
        let none = time(&mut |g| ps_core::optim::apply(&opt, &mut w, &mut state, &mut step, g));
        // The bulk listener's NaN and infinity check, over one read's bytes while they are in
        // the core's cache (`WAKE_BYTES` of a chunk, scanned again and again): f32-aligned,
        // as a body is, and one byte off, which is scanned four bytes at a time.
        let piece = bytemuck::cast_slice::<f32, u8>(&grads[0][..ps_client::tls::WAKE_BYTES / 4]);
        let mut shifted = vec![0u8; piece.len() + 4];
        let at = shifted.as_ptr().align_offset(4) + 1;
        shifted[at..at + piece.len() - 4].copy_from_slice(&piece[..piece.len() - 4]);
        let mut scan = |bytes: &[u8]| {
            let t = Instant::now();
            let mut seen = false;
            for _ in 0..reps * (CHUNK * 4 / bytes.len()) {
                seen |= ps_codec::quant::any_non_finite_le(std::hint::black_box(bytes));
            }
            sums ^= u32::from(seen);
            t.elapsed().as_secs_f64() * 1e3 / gb
        };
        let scan_aligned = scan(piece);
        let scan_unaligned = scan(&shifted[at..at + piece.len() - 4]);
        println!(
            "{{\"case\":\"apply_checksum\",\"round\":{round},\"optimizer\":\"sgd\",\"chunk_bytes\":{},\"crc_own_pass_ms_per_gb\":{own_pass:.1},\"crc_in_optimizer_pass_ms_per_gb\":{in_pass:.1},\"no_crc_ms_per_gb\":{none:.1},\"non_finite_scan_ms_per_gb\":{scan_aligned:.1},\"non_finite_scan_unaligned_ms_per_gb\":{scan_unaligned:.1}}}",
            CHUNK * 4
        );
    }
    std::hint::black_box((sums, &w));
}

fn tcp_gbps() -> f64 {
    let listener = StdListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let total: usize = 4 << 30;
    let reader = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().expect("accept");
        let mut buf = vec![0u8; 1 << 20];
        let mut got = 0;
        while got < total {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => got += n,
            }
        }
        got
    });
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_nodelay(true).ok();
    let buf = vec![7u8; 1 << 20];
    let t = Instant::now();
    let mut sent = 0;
    while sent < total {
        s.write_all(&buf).expect("write");
        sent += buf.len();
    }
    drop(s);
    let got = reader.join().expect("reader");
    got as f64 / t.elapsed().as_secs_f64() / 1e9
}

/// Appending to a new file (what a WAL does) through the page cache, no fsync: the bound on
/// durable pushes, since every pushed byte is written to the WAL once.
fn file_append_gbps() -> f64 {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("append");
    let mut f = std::fs::File::create(&path).expect("create");
    let block = vec![3u8; 1 << 20];
    let total = 1usize << 30;
    let t = Instant::now();
    let mut written = 0;
    while written < total {
        f.write_all(&block).expect("write");
        written += block.len();
    }
    let gbps = written as f64 / t.elapsed().as_secs_f64() / 1e9;
    drop(f);
    let _ = std::fs::remove_file(&path);
    gbps
}

/// How the shards under test run.
#[derive(Clone, Copy)]
struct Shards<'a> {
    count: u32,
    durable: bool,
    sync: bool,
    dense_log_mib: Option<u64>,
    tls_dir: Option<&'a std::path::Path>,
    /// `--rocksdb`'s settings (processes only).
    rocksdb: &'a [String],
    /// `--server`'s settings (processes only).
    server: &'a [String],
    /// `ps-server` processes of this build, as deployed (the default); otherwise servers on a
    /// runtime of their own inside this process (`--in-process`).
    processes: bool,
}

/// The shards of one case.
struct Cluster {
    endpoints: Vec<String>,
    running: Running,
    _dir: tempfile::TempDir,
}

enum Running {
    Processes(Vec<ShardProcess>),
    InProcess {
        shutdown: CancellationToken,
        rt: tokio::runtime::Runtime,
        handles: Vec<tokio::task::JoinHandle<anyhow::Result<()>>>,
    },
}

impl Cluster {
    fn start(client_rt: &tokio::runtime::Runtime, s: Shards<'_>) -> anyhow::Result<Self> {
        if s.processes {
            client_rt.block_on(Self::spawn(s))
        } else {
            Ok(Self::start_with(s, None))
        }
    }

    /// `ps-server` processes, each with its own data directory (or `--in-memory`).
    async fn spawn(s: Shards<'_>) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let mut shards = Vec::new();
        for i in 0..s.count {
            let data = dir.path().join(format!("s{i}"));
            let mut args: Vec<String> = vec![
                "--shard-index".into(),
                i.to_string(),
                "--num-shards".into(),
                s.count.to_string(),
            ];
            if !s.durable {
                args.push("--in-memory".into());
            }
            if s.sync {
                args.push("--sync".into());
            }
            if let Some(d) = s.tls_dir {
                for (flag, file) in [
                    ("--tls-cert", "server.pem"),
                    ("--tls-key", "server.key"),
                    ("--tls-client-ca", "ca.pem"),
                ] {
                    args.push(flag.into());
                    args.push(d.join(file).display().to_string());
                }
            }
            args.extend(config_args(
                &dir.path().join(format!("s{i}.toml")),
                shard_config(s.dense_log_mib, s.rocksdb, s.server)?,
            )?);
            shards.push(ShardProcess::spawn(&data, &args).await?);
        }
        Ok(Self {
            endpoints: shards.iter().map(|p| p.endpoint.clone()).collect(),
            running: Running::Processes(shards),
            _dir: dir,
        })
    }

    /// Servers on a runtime of their own in this process (the flood cases: their tokens are
    /// loaded here).
    fn start_with(s: Shards<'_>, auth: Option<ps_runtime::auth::Auth>) -> Self {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("shard")
            .enable_all()
            .build()
            .expect("runtime");
        let dir = tempfile::tempdir().expect("temp dir");
        let shutdown = CancellationToken::new();
        let mut endpoints = Vec::new();
        let mut handles = Vec::new();
        for i in 0..s.count {
            let mut cfg = ServerConfig::local(s.durable.then(|| dir.path().join(format!("s{i}"))));
            cfg.shard_index = i;
            cfg.num_shards = s.count;
            cfg.rocksdb.sync = s.sync;
            if let Some(mib) = s.dense_log_mib {
                cfg.rocksdb.dense_log_mib = mib;
            }
            if let Some(d) = s.tls_dir {
                cfg.service.security.tls = Some(
                    ps_runtime::tls::ServerTls::new(ps_runtime::tls::ServerTlsFiles {
                        cert: d.join("server.pem"),
                        key: d.join("server.key"),
                        client_ca: Some(d.join("ca.pem")),
                    })
                    .expect("the TLS files of --tls-dir"),
                );
            }
            cfg.service.security.auth = auth.clone();
            let listener = rt.block_on(TcpListener::bind("127.0.0.1:0")).expect("bind");
            endpoints.push(format!("http://{}", listener.local_addr().expect("addr")));
            handles.push(rt.spawn(ps_server::run(cfg, listener, None, shutdown.clone())));
        }
        Self {
            endpoints,
            running: Running::InProcess {
                shutdown,
                rt,
                handles,
            },
            _dir: dir,
        }
    }

    fn stop(self, client_rt: &tokio::runtime::Runtime) {
        match self.running {
            Running::Processes(shards) => client_rt.block_on(async {
                for p in shards {
                    p.svc.stop(std::time::Duration::from_secs(60)).await;
                }
            }),
            Running::InProcess {
                shutdown,
                rt,
                handles,
            } => {
                shutdown.cancel();
                for h in handles {
                    if let Ok(Err(e)) = rt.block_on(h) {
                        eprintln!("shard stopped with an error: {e:#}");
                    }
                }
            }
        }
    }
}

/// How the benchmark's clients talk to the shards.
#[derive(Clone)]
struct Transport {
    request_kib: usize,
    bulk: bool,
    /// Mutual TLS (the server's certificate doubles as the client's).
    tls: Option<ps_client::tls::ClientTls>,
}

impl Transport {
    fn name(&self) -> &'static str {
        match (self.bulk, self.tls.is_some()) {
            (true, false) => "bulk",
            (false, false) => "grpc",
            (true, true) => "bulk+tls",
            (false, true) => "grpc+tls",
        }
    }
}

fn client_config(endpoints: &[String], t: &Transport) -> ClientConfig {
    let mut cfg = ClientConfig::new(endpoints.to_vec());
    cfg.max_request_bytes = t.request_kib << 10;
    cfg.bulk = t.bulk;
    cfg.credentials.tls = t.tls.clone();
    cfg
}

async fn dense_case(
    endpoints: &[String],
    clients: usize,
    floats: usize,
    seconds: f64,
    warmup: Warmup,
    t: &Transport,
    fused: bool,
) -> anyhow::Result<Dense> {
    let mut tasks = Vec::new();
    let start = std::sync::Arc::new(tokio::sync::Barrier::new(clients));
    for c in 0..clients {
        let cfg = client_config(endpoints, t);
        let start = start.clone();
        tasks.push(tokio::spawn(async move {
            let ps = PsClient::connect(cfg).await?;
            let name = format!("bench/dense/{floats}/{c}");
            ps.create_table(
                TableSpec::dense(&name, &[floats as u64])?.with_optimizer(Optimizer::sgd(0.001))?,
            )
            .await?;
            // Random values, as real gradients are: a constant one would let lz4 shrink every
            // push to almost nothing and measure the codec instead of the path.
            let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(c as u64);
            let normal = rand_distr::Normal::new(0.0f32, 1e-3)?;
            let grad: Vec<f32> = (0..floats).map(|_| normal.sample(&mut rng)).collect();
            // Warm-up: connections, buffers, and the first lap through a new push log, whose
            // pages the kernel allocates once (a one-time cost of a new data directory).
            // Pulled into one buffer, as a training loop keeps its parameters from step to
            // step (a fresh tensor per pull would cost its pages' faults and zeroing).
            let mut w = vec![0.0f32; floats];
            let written = warmup.written(&ps).await?;
            let t = Instant::now();
            let mut polled = Instant::now();
            let mut pushed = 0u64;
            let step = async |w: &mut [f32]| -> anyhow::Result<()> {
                if fused {
                    ps.push_pull_dense(&name, &grad, w).await?;
                } else {
                    ps.push_dense(&name, &grad).await?;
                    ps.pull_dense_into(&name, w).await?;
                }
                Ok(())
            };
            loop {
                step(&mut w).await?;
                pushed += floats as u64 * 4;
                let elapsed = t.elapsed().as_secs_f64();
                if elapsed < warmup.seconds {
                    continue;
                }
                if warmup.log_bytes == 0 || elapsed >= MAX_WARMUP_S {
                    break;
                }
                // The shards' counters, a few times a second: a call per step would weigh on
                // small tensors' steps.
                if polled.elapsed().as_secs_f64() >= 0.25 {
                    polled = Instant::now();
                    if warmup.lapped(&ps, &written).await? {
                        break;
                    }
                }
            }
            let warm = (pushed as f64 * 2.0, t.elapsed().as_secs_f64());
            start.wait().await;
            let t = Instant::now();
            let mut pairs = Vec::new();
            while pairs.len() < 3 || t.elapsed().as_secs_f64() < seconds {
                let pair = Instant::now();
                step(&mut w).await?;
                std::hint::black_box(&w);
                pairs.push(pair.elapsed().as_secs_f64() * 1e3);
            }
            Ok::<_, anyhow::Error>(((pairs, t.elapsed().as_secs_f64()), warm))
        }));
    }
    let (mut clients, mut warm_bytes, mut warm_s) = (Vec::new(), 0.0, 0.0f64);
    for t in tasks {
        let (timed, (bytes, secs)) = t.await??;
        clients.push(timed);
        warm_bytes += bytes;
        warm_s = warm_s.max(secs);
    }
    let mut d = Dense::of(floats, clients);
    d.warmup = Some((warm_s, warm_bytes / warm_s / 1e9));
    Ok(d)
}

/// ps-lite's side of a dense case (`--pslite`): a scheduler, `servers` servers and `workers`
/// workers of `bin` (bench/pslite/pslite_dense.cc) on 127.0.0.1, each worker stepping on its
/// own tensor of `floats` floats split into one key per server; the same measure as
/// [`dense_case`] (pushed plus pulled bytes of all workers, each step's latency).
struct PsliteCase<'a> {
    bin: &'a std::path::Path,
    servers: u32,
    workers: usize,
    floats: usize,
    seconds: f64,
    warmup: f64,
    step: &'a str,
}

impl PsliteCase<'_> {
    /// The case, run again when it fails (ps-lite's nodes now and then hang at start-up or at
    /// the final barrier, and are killed at the case's deadline), up to three times.
    fn run(&self) -> anyhow::Result<Dense> {
        let mut tries = 0;
        loop {
            tries += 1;
            match self.run_once() {
                Err(e) if tries < 3 => eprintln!("ps-bench: {e:#}; running it again"),
                done => return done,
            }
        }
    }

    fn run_once(&self) -> anyhow::Result<Dense> {
        use std::process::{Command, Stdio};
        let PsliteCase {
            bin,
            servers,
            workers,
            floats,
            seconds,
            warmup,
            step,
        } = *self;
        let port = StdListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let spawn = |role: &str, out: Stdio| {
            Command::new(bin)
                .args([
                    floats.to_string(),
                    seconds.to_string(),
                    warmup.to_string(),
                    step.to_owned(),
                ])
                .env("DMLC_ROLE", role)
                .env("DMLC_NUM_SERVER", servers.to_string())
                .env("DMLC_NUM_WORKER", workers.to_string())
                .env("DMLC_PS_ROOT_URI", "127.0.0.1")
                .env("DMLC_PS_ROOT_PORT", port.to_string())
                .env("DMLC_NODE_HOST", "127.0.0.1")
                .stdin(Stdio::null())
                .stdout(out)
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| anyhow::anyhow!("--pslite {}: {e}", bin.display()))
        };
        let mut nodes: Vec<(&str, std::process::Child)> = Vec::new();
        let mut readers = Vec::new();
        let mut start = || -> anyhow::Result<()> {
            nodes.push(("scheduler", spawn("scheduler", Stdio::null())?));
            for _ in 0..servers {
                nodes.push(("server", spawn("server", Stdio::null())?));
            }
            for _ in 0..workers {
                let mut w = spawn("worker", Stdio::piped())?;
                let mut out = w.stdout.take().expect("piped");
                nodes.push(("worker", w));
                readers.push(std::thread::spawn(move || {
                    let mut s = String::new();
                    out.read_to_string(&mut s).map(|_| s)
                }));
            }
            Ok(())
        };
        let mut failed = start().err().map(|e| format!("{e:#}"));
        // Every node leaves after the workers' final barrier; one that has not by the deadline
        // (a node that failed leaves the others waiting) is killed, and the case fails.
        let deadline = Instant::now() + std::time::Duration::from_secs_f64(warmup + seconds + 60.0);
        for (role, p) in &mut nodes {
            let status = loop {
                if failed.is_some() {
                    break None;
                }
                if let Some(st) = p.try_wait()? {
                    break Some(st);
                }
                if Instant::now() >= deadline {
                    failed = Some(format!("a ps-lite {role} did not finish in time"));
                    break None;
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            };
            if let Some(st) = status.filter(|st| !st.success()) {
                failed = Some(format!("a ps-lite {role} exited with {st}"));
            }
        }
        for (_, p) in &mut nodes {
            let _ = p.kill();
            let _ = p.wait();
        }
        let lines: Vec<String> = readers
            .into_iter()
            .map(|r| r.join().unwrap_or_else(|_| Ok(String::new())))
            .collect::<Result<_, _>>()?;
        if let Some(f) = failed {
            anyhow::bail!("{f}; run {} by hand to see its log", bin.display());
        }
        let mut timed = Vec::new();
        for s in lines {
            let v: serde_json::Value = serde_json::from_str(s.trim())?;
            let p: Vec<f64> = v["pairs_ms"]
                .as_array()
                .ok_or_else(|| anyhow::anyhow!("a ps-lite worker's line has no pairs_ms: {s}"))?
                .iter()
                .filter_map(serde_json::Value::as_f64)
                .collect();
            let elapsed = v["elapsed_s"].as_f64().unwrap_or(0.0);
            anyhow::ensure!(
                elapsed > 0.0,
                "a ps-lite worker reported no elapsed time: {s}"
            );
            timed.push((p, elapsed));
        }
        Ok(Dense::of(floats, timed))
    }
}

/// How long a dense case warms up: at least `seconds`, and until every shard has written
/// `log_bytes` (a lap through its push log, as its `bytes_written` counter tells: a new log's
/// first lap is slower, as the kernel allocates its pages and, with `--sync`, converts its
/// extents; the body ring laps sooner), for at most `MAX_WARMUP_S`. The counter also counts
/// the shard's store writes, which in a dense case are its push ids, a few bytes a push. What
/// the warm-up took is reported beside the timed figures (`warmup_s`, `warmup_gbps`).
#[derive(Debug, Clone, Copy)]
struct Warmup {
    seconds: f64,
    /// 0: no push log to lap (in-memory shards).
    log_bytes: u64,
}

/// The most a lap may add to a warm-up (small tensors, latency-bound, take long to lap a log
/// and gain little from it).
const MAX_WARMUP_S: f64 = 20.0;

impl Warmup {
    /// Each shard's bytes written so far, by shard index (none without a log to lap).
    async fn written(&self, ps: &PsClient) -> anyhow::Result<Vec<(u32, u64)>> {
        if self.log_bytes == 0 {
            return Ok(Vec::new());
        }
        let mut w: Vec<(u32, u64)> = ps
            .stats()
            .await?
            .iter()
            .map(|s| (s.shard_index, s.bytes_written))
            .collect();
        w.sort_unstable();
        Ok(w)
    }

    /// Whether every shard has written a lap of its log since `before` ([`Warmup::written`]).
    async fn lapped(&self, ps: &PsClient, before: &[(u32, u64)]) -> anyhow::Result<bool> {
        let now = self.written(ps).await?;
        Ok(now.len() == before.len()
            && now
                .iter()
                .zip(before)
                .all(|(&(i, n), &(j, b))| i == j && n.saturating_sub(b) >= self.log_bytes))
    }
}

/// A dense case's result: goodput (pushed plus pulled bytes, all clients), push+pull pairs,
/// and the pairs' latency.
struct Dense {
    gbps: f64,
    rounds: usize,
    p50_ms: f64,
    p99_ms: f64,
    /// Our side's warm-up: its seconds and goodput (a new shard's first lap of its push log
    /// is in it).
    warmup: Option<(f64, f64)>,
}

impl Dense {
    /// From each client's step latencies (ms) and timed seconds, on tensors of `floats`.
    fn of(floats: usize, clients: Vec<(Vec<f64>, f64)>) -> Self {
        let mut bytes = 0.0;
        let mut elapsed: f64 = 0.0;
        let mut pairs = Vec::new();
        for (p, e) in clients {
            bytes += (p.len() * floats * 4 * 2) as f64;
            elapsed = elapsed.max(e);
            pairs.extend(p);
        }
        Dense {
            gbps: bytes / elapsed / 1e9,
            rounds: pairs.len(),
            p50_ms: quantile(&mut pairs, 0.5),
            p99_ms: quantile(&mut pairs, 0.99),
            warmup: None,
        }
    }
}

/// The sparse cases' table: dim 64, Adagrad, evicting rows by `ttl_seconds` and `max_rows`
/// (0: never).
fn sparse_table(ttl_seconds: u64, max_rows: u64) -> anyhow::Result<TableSpec> {
    Ok(TableSpec::sparse("bench/sparse", 64)?
        .with_optimizer(Optimizer::adagrad(0.05))?
        .with_ttl_seconds(ttl_seconds)?
        .with_max_rows(max_rows)?)
}

async fn sparse_case(
    endpoints: &[String],
    seconds: f64,
    t: &Transport,
    space: u64,
) -> anyhow::Result<(f64, f64, f64)> {
    sparse_case_on(endpoints, seconds, t, space, sparse_table(0, 0)?).await
}

async fn sparse_case_on(
    endpoints: &[String],
    seconds: f64,
    t: &Transport,
    space: u64,
    spec: TableSpec,
) -> anyhow::Result<(f64, f64, f64)> {
    let dim = spec.row_dim();
    let batch = SPARSE_BATCH;
    let ps = PsClient::connect(client_config(endpoints, t)).await?;
    ps.create_table(spec).await?;
    let (batches, mut rng) = zipf_batches(space)?;
    let unique: f64 = batches
        .iter()
        .map(|b| b.iter().collect::<std::collections::HashSet<_>>().len() as f64)
        .sum::<f64>()
        / batches.len() as f64;
    // Random values, as real gradients are (a constant would let lz4 shrink every push and
    // measure the codec: 12% of the shard's CPU when it was one).
    let normal = rand_distr::Normal::new(0.0f32, 1e-3)?;
    let grads: Vec<f32> = (0..batch * dim).map(|_| normal.sample(&mut rng)).collect();
    let in_flight = 4;
    let t = Instant::now();
    let mut pushed = 0usize;
    let mut i = 0;
    while t.elapsed().as_secs_f64() < seconds {
        let round: Vec<_> = (0..in_flight)
            .map(|k| {
                let ids = &batches[(i + k) % batches.len()];
                ps.push_sparse("bench/sparse", ids, &grads)
            })
            .collect();
        for r in futures::future::join_all(round).await {
            r?;
        }
        pushed += in_flight;
        i += in_flight;
    }
    let secs = t.elapsed().as_secs_f64();
    // Group commit at work: shard requests made durable per write.
    let stats = ps.stats().await?;
    let per_write = stats.iter().map(|s| s.pushes_applied).sum::<u64>() as f64
        / stats.iter().map(|s| s.write_batches).sum::<u64>().max(1) as f64;
    Ok((
        (pushed * batch) as f64 / secs,
        pushed as f64 * unique / secs,
        per_write,
    ))
}

/// Ids per sparse push or pull of the sparse cases.
const SPARSE_BATCH: usize = 4096;

/// The sparse cases' id batches (Zipf 1.05 over `space`, drawn before the timed loop so that
/// sampling costs it nothing), and the generator that drew them.
fn zipf_batches(space: u64) -> anyhow::Result<(Vec<Vec<u64>>, rand_xoshiro::Xoshiro256PlusPlus)> {
    let zipf = Zipf::new(space as f64, 1.05)?;
    let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(1);
    let batches = (0..256)
        .map(|_| {
            (0..SPARSE_BATCH)
                .map(|_| zipf.sample(&mut rng) as u64)
                .collect()
        })
        .collect();
    Ok((batches, rng))
}

/// Rows pulled per second from `bench/sparse` (which the push cases made), with the push
/// cases' ids, four pulls in flight.
async fn sparse_pulls(
    endpoints: &[String],
    seconds: f64,
    t: &Transport,
    space: u64,
) -> anyhow::Result<f64> {
    let ps = PsClient::connect(client_config(endpoints, t)).await?;
    let (batches, _) = zipf_batches(space)?;
    let in_flight = 4;
    let t = Instant::now();
    let mut pulled = 0usize;
    while t.elapsed().as_secs_f64() < seconds {
        let round: Vec<_> = (0..in_flight)
            .map(|k| ps.pull_sparse("bench/sparse", &batches[(pulled + k) % batches.len()]))
            .collect();
        for r in futures::future::join_all(round).await {
            r?;
        }
        pulled += in_flight;
    }
    Ok((pulled * SPARSE_BATCH) as f64 / t.elapsed().as_secs_f64())
}

/// Times `sparse_pulls` on `shard` and prints its line (`cache`: which shard it is).
async fn pull_case(
    shard: &ShardProcess,
    seconds: f64,
    t: &Transport,
    space: u64,
    cache: &str,
) -> anyhow::Result<()> {
    let (cpu0, t0) = (shard.svc.cpu_seconds()?, Instant::now());
    let pulls = sparse_pulls(std::slice::from_ref(&shard.endpoint), seconds, t, space).await?;
    let cpu = shard.svc.cpu_seconds()? - cpu0;
    println!(
        "{{\"case\":\"store_sparse_pull_dim64\",\"keys\":{space},\"cache\":\"{cache}\",\"rows_pulled_per_s\":{pulls:.0},\"shard_cpu_s\":{cpu:.2},\"rows_pulled_per_shard_cpu_s\":{:.0}}}",
        pulls * t0.elapsed().as_secs_f64() / cpu.max(0.01)
    );
    Ok(())
}

/// Tokens for the flood cases: an operator (tables), the victim, and the flooder (limited to
/// `flooder_in_flight` calls at once when given). Returns the file's directory and the tokens.
fn flood_tokens(
    flooder_in_flight: Option<u32>,
) -> anyhow::Result<(tempfile::TempDir, ps_runtime::auth::Auth, [String; 3])> {
    use ps_runtime::auth::{Role, new_token, token_entry};
    let dir = tempfile::tempdir()?;
    let tokens = [new_token()?, new_token()?, new_token()?];
    let mut text = String::new();
    for ((name, role), t) in [
        ("op", Role::Operator),
        ("victim", Role::Worker),
        ("flooder", Role::Worker),
    ]
    .iter()
    .zip(&tokens)
    {
        text.push_str(&token_entry(name, *role, &["*".to_owned()], t));
        if *name == "flooder"
            && let Some(n) = flooder_in_flight
        {
            text.push_str(&format!("max_in_flight = {n}\n"));
        }
    }
    let path = dir.path().join("tokens.toml");
    std::fs::write(&path, text)?;
    let auth = ps_runtime::auth::Auth::load(path)?;
    Ok((dir, auth, tokens))
}

fn config_as(endpoints: &[String], token: &str) -> anyhow::Result<ClientConfig> {
    let mut cfg = ClientConfig::new(endpoints.to_vec());
    cfg.credentials.token = Some(ps_client::Token::new(token)?);
    // The flooder's calls over its limit are retried (after a pause) as a real client's are.
    cfg.max_attempts = u32::MAX;
    cfg.initial_backoff = std::time::Duration::from_millis(5);
    cfg.max_backoff = std::time::Duration::from_millis(50);
    Ok(cfg)
}

/// The victim's pull latencies (p50, p99 in ms) over `seconds` while `flooders` tasks push
/// 1 M floats each as fast as they can (none: a quiet shard); and the flood's pushes per second.
async fn flood_case(
    endpoints: &[String],
    tokens: &[String; 3],
    flooders: usize,
    seconds: f64,
) -> anyhow::Result<(f64, f64, f64)> {
    let op = PsClient::connect(config_as(endpoints, &tokens[0])?).await?;
    for (name, n) in [("v/t", 64u64 << 10), ("f/t", 1 << 20)] {
        op.create_table(TableSpec::dense(name, &[n])?.with_optimizer(Optimizer::sgd(1e-6))?)
            .await?;
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let pushes = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let flooder = PsClient::connect(config_as(endpoints, &tokens[2])?).await?;
    let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(9);
    let normal = rand_distr::Normal::new(0.0f32, 1e-3)?;
    let grad: std::sync::Arc<Vec<f32>> =
        std::sync::Arc::new((0..1 << 20).map(|_| normal.sample(&mut rng)).collect());
    let tasks: Vec<_> = (0..flooders)
        .map(|_| {
            let (ps, stop, pushes, grad) =
                (flooder.clone(), stop.clone(), pushes.clone(), grad.clone());
            tokio::spawn(async move {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    ps.push_dense("f/t", &grad).await?;
                    pushes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                Ok::<_, anyhow::Error>(())
            })
        })
        .collect();
    let victim = PsClient::connect(config_as(endpoints, &tokens[1])?).await?;
    // Let the flood build up.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let (before, t) = (
        pushes.load(std::sync::atomic::Ordering::Relaxed),
        Instant::now(),
    );
    let mut lat = Vec::new();
    while t.elapsed().as_secs_f64() < seconds {
        let s = Instant::now();
        std::hint::black_box(victim.pull_dense("v/t").await?);
        lat.push(s.elapsed().as_secs_f64() * 1e3);
    }
    let rate = (pushes.load(std::sync::atomic::Ordering::Relaxed) - before) as f64
        / t.elapsed().as_secs_f64();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for task in tasks {
        task.await??;
    }
    Ok((quantile(&mut lat, 0.5), quantile(&mut lat, 0.99), rate))
}

/// The `p` quantile of `values` (sorted in place); 0 when there are none.
fn quantile(values: &mut [f64], p: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    values[((values.len() - 1) as f64 * p) as usize]
}

/// `--flood N`: the victim's pull latency on a quiet shard, under an unlimited flood, and
/// under the same flood with the flooder's token limited to N calls in flight.
fn flood(client_rt: &tokio::runtime::Runtime, limit: u32, seconds: f64) -> anyhow::Result<()> {
    let flooders = 32;
    let mut quiet_p99 = None;
    for (case, n, in_flight) in [
        ("quiet", 0, None),
        ("unlimited", flooders, None),
        ("limited", flooders, Some(limit)),
    ] {
        let (_dir, auth, tokens) = flood_tokens(in_flight)?;
        let shards = Shards {
            count: 1,
            durable: false,
            sync: false,
            dense_log_mib: None,
            tls_dir: None,
            rocksdb: &[],
            server: &[],
            processes: false,
        };
        let cluster = Cluster::start_with(shards, Some(auth));
        let (p50, p99, rate) =
            client_rt.block_on(flood_case(&cluster.endpoints, &tokens, n, seconds))?;
        cluster.stop(client_rt);
        let quiet = *quiet_p99.get_or_insert(p99);
        println!(
            "{{\"case\":\"flood\",\"flooder\":\"{case}\",\"flooder_tasks\":{n},\"flooder_max_in_flight\":{},\"flooder_pushes_per_s\":{rate:.1},\"victim_pull_p50_ms\":{p50:.3},\"victim_pull_p99_ms\":{p99:.3},\"p99_vs_quiet\":{:.2}}}",
            in_flight.map_or("null".to_owned(), |n| n.to_string()),
            p99 / quiet
        );
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    // The clients' heap as a worker's (the shards set theirs).
    ps_runtime::heap::keep_large_buffers();
    let args = Args::parse();
    anyhow::ensure!(
        (args.rocksdb.is_empty() && args.server.is_empty()) || !args.in_process,
        "--rocksdb and --server set ps-server processes' config files: not with --in-process"
    );
    // A malformed setting is refused here, before the limits and cases take their minutes.
    shard_config(None, &args.rocksdb, &args.server)?;
    for bin in &args.pslite {
        anyhow::ensure!(
            bin.is_file(),
            "--pslite {}: no such program (scripts/pslite-bench.sh --build-only builds it)",
            bin.display()
        );
    }
    if args.only_apply {
        apply_case(args.rounds);
        return Ok(());
    }
    if let Some(limit) = args.flood {
        let client_rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("client")
            .enable_all()
            .build()?;
        return flood(&client_rt, limit, args.seconds.max(3.0));
    }
    if args.store {
        let client_rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("client")
            .enable_all()
            .build()?;
        return client_rt.block_on(store_cases(&args));
    }
    if let Some(s) = args
        .steps
        .iter()
        .find(|s| !matches!(s.as_str(), "pair" | "fused"))
    {
        anyhow::bail!("--steps: `{s}` is neither `pair` nor `fused`");
    }
    let mut layouts = Vec::new();
    for l in &args.layouts {
        let parsed = l
            .split_once('x')
            .and_then(|(s, c)| Some((s.parse::<u32>().ok()?, c.parse::<usize>().ok()?)))
            .filter(|&(s, c)| s > 0 && c > 0);
        match parsed {
            Some(p) => layouts.push(p),
            None => anyhow::bail!("--layouts: `{l}` is not SHARDSxCLIENTS (e.g. 2x2)"),
        }
    }
    if args.only_sparse {
        layouts.clear();
    }
    let memcpy = memcpy_gbps();
    let tcp = tcp_gbps();
    println!("{{\"case\":\"memcpy\",\"gbps\":{memcpy:.3}}}");
    println!("{{\"case\":\"loopback_tcp\",\"gbps\":{tcp:.3}}}");
    let iperf3 = iperf3_gbps();
    match iperf3 {
        Some(g) => println!("{{\"case\":\"iperf3\",\"gbps\":{g:.3}}}"),
        None => eprintln!("ps-bench: iperf3 is not installed; loopback_tcp is the limit"),
    }
    let limit = iperf3.unwrap_or(tcp);
    let append = file_append_gbps();
    println!("{{\"case\":\"file_append\",\"gbps\":{append:.3}}}");
    let tls_dir = args.tls_dir.as_deref();
    let transport = Transport {
        request_kib: args.request_kib,
        bulk: !args.grpc_only,
        tls: tls_dir.map(|d| {
            ps_client::tls::ClientTls::new(ps_client::tls::ClientTlsFiles {
                ca: d.join("ca.pem"),
                cert: Some(d.join("server.pem")),
                key: Some(d.join("server.key")),
            })
            .expect("the TLS files of --tls-dir")
        }),
    };
    let client_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("client")
        .enable_all()
        .build()?;
    let sizes = if !args.floats.is_empty() {
        args.floats.clone()
    } else if args.quick {
        vec![1 << 20, 16 << 20]
    } else {
        vec![1 << 10, 64 << 10, 1 << 20, 16 << 20]
    };
    let warmup = if args.quick {
        args.warmup.min(0.5)
    } else {
        args.warmup
    };
    let seconds = if args.quick {
        args.seconds.min(1.0)
    } else {
        args.seconds
    };
    let shards = |count, durable, sync| Shards {
        count,
        durable,
        sync,
        dense_log_mib: args.dense_log_mib,
        tls_dir,
        rocksdb: &args.rocksdb,
        server: &args.server,
        processes: !args.in_process,
    };
    let shards_in = if args.in_process {
        "process"
    } else {
        "processes"
    };
    // ps-lite's best goodput of this layout's cases (--pslite), by floats and step.
    let mut pslite: std::collections::HashMap<(usize, String), f64> = Default::default();
    let report = |floats: usize,
                  n: u32,
                  clients: usize,
                  mode: &str,
                  step: &str,
                  d: &Dense,
                  pslite: Option<f64>| {
        let vs_pslite = pslite
            .map(|g| format!(",\"ratio_pslite\":{:.3}", d.gbps / g))
            .unwrap_or_default();
        let warmed = d
            .warmup
            .map(|(s, g)| format!(",\"warmup_s\":{s:.1},\"warmup_gbps\":{g:.3}"))
            .unwrap_or_default();
        println!(
            "{{\"case\":\"dense_push_pull\",\"floats\":{floats},\"shards\":{n},\"clients\":{clients},\"mode\":\"{mode}\",\"step\":\"{step}\",\"transport\":\"{}\",\"shards_in\":\"{shards_in}\",\"rounds\":{},\"goodput_gbps\":{:.3},\"pair_p50_ms\":{:.3},\"pair_p99_ms\":{:.3},\"ratio_limit\":{:.3},\"ratio_memcpy\":{:.3},\"ratio_file_append\":{:.3}{vs_pslite}{warmed}}}",
            transport.name(),
            d.rounds,
            d.gbps,
            d.p50_ms,
            d.p99_ms,
            d.gbps / limit,
            d.gbps / memcpy,
            d.gbps / append
        );
    };
    // A lap through each shard's push log (durable shards only).
    let log_bytes = args
        .dense_log_mib
        .unwrap_or(ps_server::store::RocksOptions::default().dense_log_mib)
        << 20;
    let warm = |durable: bool| Warmup {
        seconds: warmup,
        log_bytes: if durable { log_bytes } else { 0 },
    };
    let modes: &[(&str, bool, bool)] = &[("durable", true, false), ("memory", false, false)];
    for &(n, clients) in &layouts {
        pslite.clear();
        for bin in &args.pslite {
            let build = bin.file_name().unwrap_or_default().to_string_lossy();
            for &floats in &sizes {
                for step in &args.steps {
                    let case = PsliteCase {
                        bin,
                        servers: n,
                        workers: clients,
                        floats,
                        seconds,
                        warmup,
                        step,
                    };
                    let d = match case.run() {
                        Ok(d) => d,
                        Err(e) => {
                            let e = format!("{e:#}").replace('"', "'");
                            println!(
                                "{{\"case\":\"pslite_dense\",\"build\":\"{build}\",\"floats\":{floats},\"shards\":{n},\"clients\":{clients},\"step\":\"{step}\",\"error\":\"{e}\"}}"
                            );
                            continue;
                        }
                    };
                    println!(
                        "{{\"case\":\"pslite_dense\",\"build\":\"{build}\",\"floats\":{floats},\"shards\":{n},\"clients\":{clients},\"step\":\"{step}\",\"rounds\":{},\"goodput_gbps\":{:.5},\"pair_p50_ms\":{:.3},\"pair_p99_ms\":{:.3},\"ratio_limit\":{:.3}}}",
                        d.rounds,
                        d.gbps,
                        d.p50_ms,
                        d.p99_ms,
                        d.gbps / limit
                    );
                    let best = pslite.entry((floats, step.clone())).or_insert(0.0);
                    *best = best.max(d.gbps);
                }
            }
        }
        for &(mode, durable, sync) in modes {
            if args.mode.as_deref().is_some_and(|m| m != mode) {
                continue;
            }
            let cluster = Cluster::start(&client_rt, shards(n, durable, sync))?;
            for &floats in &sizes {
                for step in &args.steps {
                    let d = client_rt.block_on(dense_case(
                        &cluster.endpoints,
                        clients,
                        floats,
                        seconds,
                        warm(durable),
                        &transport,
                        step == "fused",
                    ))?;
                    let vs = pslite.get(&(floats, step.clone())).copied();
                    report(floats, n, clients, mode, step, &d, vs);
                }
            }
            cluster.stop(&client_rt);
        }
    }
    // The cost of fsync per group commit, on the largest size.
    if !args.only_sparse && args.mode.as_deref().is_none_or(|m| m == "durable+sync") {
        let cluster = Cluster::start(&client_rt, shards(1, true, true))?;
        let floats = *sizes.iter().max().unwrap_or(&(1 << 20));
        let d = client_rt.block_on(dense_case(
            &cluster.endpoints,
            1,
            floats,
            seconds,
            warm(true),
            &transport,
            false,
        ))?;
        report(floats, 1, 1, "durable+sync", "pair", &d, None);
        cluster.stop(&client_rt);
    }
    if !args.no_sparse {
        for (mode, durable, sync) in [
            ("durable", true, false),
            ("durable+sync", true, true),
            ("memory", false, false),
        ] {
            let cluster = Cluster::start(&client_rt, shards(1, durable, sync))?;
            let (keys, unique, per_write) = client_rt.block_on(sparse_case(
                &cluster.endpoints,
                seconds.max(2.0),
                &transport,
                args.keys.min(1_000_000),
            ))?;
            println!(
                "{{\"case\":\"sparse_adagrad_dim64\",\"shards\":1,\"mode\":\"{mode}\",\"shards_in\":\"{shards_in}\",\"key_updates_per_s\":{keys:.0},\"unique_row_updates_per_s\":{unique:.0},\"pushes_per_write\":{per_write:.2}}}"
            );
            cluster.stop(&client_rt);
        }
    }
    Ok(())
}

/// A shard's config file: `--server`'s top-level settings, and a `[rocksdb]` table of
/// `dense_log_mib` and `--rocksdb`'s settings (none of them: no file).
fn shard_config(
    dense_log_mib: Option<u64>,
    rocksdb: &[String],
    server: &[String],
) -> anyhow::Result<Option<String>> {
    let lines = |flag: &str, settings: &[String]| -> anyhow::Result<Vec<String>> {
        settings
            .iter()
            .map(|s| {
                let (key, value) = s
                    .split_once('=')
                    .ok_or_else(|| anyhow::anyhow!("--{flag} {s}: not KEY=VALUE"))?;
                Ok(format!("{} = {}", key.trim(), toml_value(value.trim())))
            })
            .collect()
    };
    // The top-level keys come before the `[rocksdb]` table, as TOML requires.
    let mut toml: Vec<String> = lines("server", server)?;
    let mut table: Vec<String> = dense_log_mib
        .map(|mib| format!("dense_log_mib = {mib}"))
        .into_iter()
        .collect();
    table.extend(lines("rocksdb", rocksdb)?);
    if !table.is_empty() {
        toml.push("[rocksdb]".to_owned());
        toml.extend(table);
    }
    Ok((!toml.is_empty()).then(|| toml.join("\n") + "\n"))
}

/// `value` as a TOML value: a number, a boolean or a quoted string as it is; a bare word
/// (`--rocksdb key=word`) quoted.
fn toml_value(value: &str) -> String {
    let literal = value.parse::<f64>().is_ok()
        || value == "true"
        || value == "false"
        || (value.len() >= 2 && value.starts_with('"') && value.ends_with('"'));
    if literal {
        value.to_owned()
    } else {
        format!("{value:?}")
    }
}

/// `ps-server`'s arguments for the config file `toml`, written at `file` (none: no arguments).
fn config_args(file: &std::path::Path, toml: Option<String>) -> anyhow::Result<Vec<String>> {
    let Some(toml) = toml else {
        return Ok(Vec::new());
    };
    std::fs::write(file, toml)?;
    Ok(vec!["--config".to_owned(), file.display().to_string()])
}

/// A ps-server process of this build (the binary beside this one) on `data`.
struct ShardProcess {
    svc: ps_launch::Service,
    endpoint: String,
}

impl ShardProcess {
    /// A durable shard with a row cache of `cache_mib` (the store cases) and `config`'s
    /// arguments ([`config_args`]).
    async fn start(
        data: &std::path::Path,
        cache_mib: u64,
        config: &[String],
    ) -> anyhow::Result<Self> {
        let mut args: Vec<String> = [
            "--data-dir",
            &data.display().to_string(),
            "--cache-mib",
            &cache_mib.to_string(),
        ]
        .map(str::to_owned)
        .into();
        args.extend_from_slice(config);
        Self::spawn(data, &args).await
    }

    /// A shard listening on 127.0.0.1 with `args` (its data under `data`, logs beside it).
    async fn spawn(data: &std::path::Path, args: &[String]) -> anyhow::Result<Self> {
        let exe = std::env::current_exe()?;
        let bin = exe.with_file_name("ps-server");
        let mut all: Vec<String> = vec!["--listen".into(), "127.0.0.1:0".into()];
        if !args.iter().any(|a| a == "--in-memory" || a == "--data-dir") {
            all.push("--data-dir".into());
            all.push(data.display().to_string());
        }
        all.extend_from_slice(args);
        let logs = data.with_extension("logs");
        let mut svc = ps_launch::Service::spawn(&bin, "ps-server", &all, &logs, true)?;
        let ready = svc.ready(std::time::Duration::from_secs(600)).await?;
        Ok(Self {
            svc,
            endpoint: ready.url(),
        })
    }

    /// What the shard's log says its start-up took: RocksDB's open, and the log's replay
    /// (records, the rows they updated, milliseconds), as JSON fields.
    fn start_up(&self) -> String {
        let log = std::fs::read_to_string(self.svc.log()).unwrap_or_default();
        let field = |name: &str| {
            log.lines()
                .rev()
                .find_map(|l| l.split_once(&format!(" {name}="))?.1.split(' ').next())
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        format!(
            "\"open_ms\":{},\"replayed_records\":{},\"pending_rows\":{},\"replay_ms\":{}",
            field("open_ms"),
            field("replayed"),
            field("pending_rows"),
            field("replay_ms")
        )
    }

    fn rss(&self) -> u64 {
        std::fs::read_to_string(format!("/proc/{}/status", self.svc.id()))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("VmRSS:"))
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            })
            .map_or(0, |kib| kib * 1024)
    }
}

/// Bytes one row of dim 64 with Adagrad takes in a shard's cache.
const ROW_BYTES: u64 = 64 * 4 * 2 + 64;

/// The store cases: update rate with the hot set cached and with a cache a tenth of the
/// table, on a shard process; then the time to serve after kill -9 by rows stored.
async fn store_cases(args: &Args) -> anyhow::Result<()> {
    // Sparse pushes of plain f32 take the shard's bulk stream, unless `--grpc-only`.
    let transport = Transport {
        request_kib: args.request_kib,
        bulk: !args.grpc_only,
        tls: None,
    };
    let seconds = args.seconds.max(3.0);
    let dir = tempfile::tempdir()?;
    let config = config_args(
        &dir.path().join("shard.toml"),
        shard_config(args.dense_log_mib, &args.rocksdb, &args.server)?,
    )?;
    let config = config.as_slice();
    if args.only_restart {
        for &rows in args.restart_rows.iter().filter(|&&r| r > 0) {
            restart_case(dir.path(), rows, &transport, config).await?;
        }
        return Ok(());
    }
    // Every row the runs touch fits the first cache (4096-id pushes, four in flight, at most a
    // few million distinct ids in a run of seconds).
    let big = args.cache_mib.unwrap_or(4096);
    let data = dir.path().join("zipf");
    let shard = ShardProcess::start(&data, big, config).await?;
    let endpoints = [shard.endpoint.clone()];
    // The first run fills the table; the second is timed with the hot set in the cache.
    sparse_case(&endpoints, seconds, &transport, args.keys).await?;
    let threads = |svc: &ps_launch::Service| -> anyhow::Result<[f64; 2]> {
        Ok([
            svc.threads_cpu_seconds("ps-writer")?,
            svc.threads_cpu_seconds("rocksdb:")?,
        ])
    };
    let (cpu0, threads0, t0) = (
        shard.svc.cpu_seconds()?,
        threads(&shard.svc)?,
        Instant::now(),
    );
    let (keys, unique, per_write) = sparse_case(&endpoints, seconds, &transport, args.keys).await?;
    // Key updates per second of the shard's CPU (all its threads: gRPC, writer, RocksDB's).
    let cpu = shard.svc.cpu_seconds()? - cpu0;
    // Its writer thread's share, and RocksDB's flushes and compactions'.
    let [writer_cpu, rocksdb_cpu] = {
        let [w, r] = threads(&shard.svc)?;
        [w - threads0[0], r - threads0[1]]
    };
    let per_core = keys * t0.elapsed().as_secs_f64() / cpu.max(0.01);
    let ps = PsClient::connect(client_config(&endpoints, &transport)).await?;
    let stats = ps.stats().await?.remove(0);
    let rows = stats.tables.iter().map(|t| t.rows).sum::<u64>();
    println!(
        "{{\"case\":\"store_sparse_adagrad_dim64\",\"keys\":{},\"cache\":\"hot set\",\"cache_mib\":{big},\"rows\":{rows},\"key_updates_per_s\":{keys:.0},\"shard_cpu_s\":{cpu:.2},\"writer_cpu_s\":{writer_cpu:.2},\"rocksdb_cpu_s\":{rocksdb_cpu:.2},\"key_updates_per_shard_cpu_s\":{per_core:.0},\"unique_row_updates_per_s\":{unique:.0},\"pushes_per_write\":{per_write:.2},\"hit_ratio\":{:.3},\"rss_mib\":{}}}",
        args.keys,
        stats.cache_hits as f64 / (stats.cache_hits + stats.cache_misses).max(1) as f64,
        shard.rss() >> 20
    );
    pull_case(&shard, seconds, &transport, args.keys, "hot set").await?;
    drop(ps);
    // Killed in the middle of training: the rows updated since their last write-back are in
    // the log, replayed by the next process before it serves.
    let mut shard = shard;
    let killing = async {
        tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
        shard.svc.kill();
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    tokio::select! {
        _ = sparse_case(&endpoints, 5.0, &transport, args.keys) => {}
        () = killing => {}
    }
    let t0 = Instant::now();
    let shard = ShardProcess::start(&data, big, config).await?;
    let ps = PsClient::connect(client_config(
        std::slice::from_ref(&shard.endpoint),
        &transport,
    ))
    .await?;
    ps.pull_sparse("bench/sparse", &[1, 2, 3]).await?;
    println!(
        "{{\"case\":\"store_restart_after_kill_9\",\"rows\":{rows},\"while\":\"training the hot set\",\"serving_after_s\":{:.3},{}}}",
        t0.elapsed().as_secs_f64(),
        shard.start_up()
    );
    drop(ps);
    shard.svc.stop(std::time::Duration::from_secs(60)).await;
    // The same runs on an in-memory shard (no store, no log): the ceiling of the durable rate.
    let memory =
        ShardProcess::spawn(&dir.path().join("memory"), &["--in-memory".to_owned()]).await?;
    let mem_endpoints = [memory.endpoint.clone()];
    sparse_case(&mem_endpoints, seconds, &transport, args.keys).await?;
    let (cpu0, t0) = (memory.svc.cpu_seconds()?, Instant::now());
    let (mem_keys, _, _) = sparse_case(&mem_endpoints, seconds, &transport, args.keys).await?;
    let mem_cpu = memory.svc.cpu_seconds()? - cpu0;
    println!(
        "{{\"case\":\"store_sparse_adagrad_dim64\",\"keys\":{},\"cache\":\"in-memory shard\",\"key_updates_per_s\":{mem_keys:.0},\"shard_cpu_s\":{mem_cpu:.2},\"key_updates_per_shard_cpu_s\":{:.0},\"durable_over_memory\":{:.3}}}",
        args.keys,
        mem_keys * t0.elapsed().as_secs_f64() / mem_cpu.max(0.01),
        keys / mem_keys
    );
    pull_case(&memory, seconds, &transport, args.keys, "in-memory shard").await?;
    memory.svc.stop(std::time::Duration::from_secs(60)).await;
    // The same table with a cache a tenth of its size.
    let small = ((rows * ROW_BYTES / 10) >> 20).max(1);
    let shard = ShardProcess::start(&data, small, config).await?;
    let endpoints = [shard.endpoint.clone()];
    // Warms the cache (rows come back from the store), then timed.
    sparse_case(&endpoints, seconds, &transport, args.keys).await?;
    let ps = PsClient::connect(client_config(&endpoints, &transport)).await?;
    let before = ps.stats().await?.remove(0);
    let (keys, unique, per_write) = sparse_case(&endpoints, seconds, &transport, args.keys).await?;
    let stats = ps.stats().await?.remove(0);
    let (hits, misses) = (
        stats.cache_hits - before.cache_hits,
        stats.cache_misses - before.cache_misses,
    );
    println!(
        "{{\"case\":\"store_sparse_adagrad_dim64\",\"keys\":{},\"cache\":\"a tenth of the table\",\"cache_mib\":{small},\"rows\":{},\"key_updates_per_s\":{keys:.0},\"unique_row_updates_per_s\":{unique:.0},\"pushes_per_write\":{per_write:.2},\"hit_ratio\":{:.3},\"rss_mib\":{}}}",
        args.keys,
        stats.tables.iter().map(|t| t.rows).sum::<u64>(),
        hits as f64 / (hits + misses).max(1) as f64,
        shard.rss() >> 20
    );
    drop(ps);
    drop(shard);
    // The hot-set run again on a table that evicts: the cost of stamping rows with their last
    // push (TTL of a day, nothing expires) and of a cap the run keeps passing.
    let data = dir.path().join("zipf-evict");
    let shard = ShardProcess::start(&data, big, config).await?;
    let endpoints = [shard.endpoint.clone()];
    let spec = sparse_table(86_400, args.evict_cap)?;
    sparse_case_on(&endpoints, seconds, &transport, args.keys, spec.clone()).await?;
    let (keys, unique, per_write) =
        sparse_case_on(&endpoints, seconds, &transport, args.keys, spec).await?;
    let ps = PsClient::connect(client_config(&endpoints, &transport)).await?;
    let stats = ps.stats().await?.remove(0);
    let table = stats.tables.iter().find(|t| t.name == "bench/sparse");
    println!(
        "{{\"case\":\"store_sparse_adagrad_dim64\",\"keys\":{},\"cache\":\"hot set\",\"policy\":\"ttl_seconds 86400, max_rows {}\",\"cache_mib\":{big},\"rows\":{},\"rows_capped\":{},\"key_updates_per_s\":{keys:.0},\"unique_row_updates_per_s\":{unique:.0},\"pushes_per_write\":{per_write:.2},\"rss_mib\":{}}}",
        args.keys,
        args.evict_cap,
        table.map_or(0, |t| t.rows),
        table.map_or(0, |t| t.rows_capped),
        shard.rss() >> 20
    );
    drop(ps);
    drop(shard);
    for &rows in args.restart_rows.iter().filter(|&&r| r > 0) {
        restart_case(dir.path(), rows, &transport, config).await?;
    }
    Ok(())
}

/// Stores `rows` rows (dim 64, Adagrad) in a fresh shard process, kills it (-9) right after
/// the last acknowledged push, and times a new process on the same data until it answers a
/// pull of rows it stored.
async fn restart_case(
    root: &std::path::Path,
    rows: u64,
    t: &Transport,
    config: &[String],
) -> anyhow::Result<()> {
    let data = root.join(format!("restart-{rows}"));
    let mut shard = ShardProcess::start(&data, 256, config).await?;
    let endpoints = [shard.endpoint.clone()];
    let ps = PsClient::connect(client_config(&endpoints, t)).await?;
    ps.create_table(TableSpec::sparse("bench/rows", 64)?.with_optimizer(Optimizer::adagrad(0.05))?)
        .await?;
    let batch = 16_384u64;
    let grads = vec![0.01f32; batch as usize * 64];
    let fill = Instant::now();
    let mut next = 0u64;
    while next < rows {
        let round: Vec<_> = (0..4)
            .filter_map(|k| {
                let from = next + k * batch;
                (from < rows).then(|| (from..(from + batch).min(rows)).collect::<Vec<u64>>())
            })
            .collect();
        next += 4 * batch;
        let pushes = round
            .iter()
            .map(|ids| ps.push_sparse("bench/rows", ids, &grads[..ids.len() * 64]));
        for r in futures::future::join_all(pushes).await {
            r?;
        }
    }
    let fill_s = fill.elapsed().as_secs_f64();
    let stored = ps.stats().await?.remove(0).tables[0].rows;
    // What the filled shard holds in memory with its 256 MiB row cache: the budget plus a
    // margin (RocksDB's memtables and block cache, buffers) that should not grow with the rows.
    let fill_rss = shard.rss();
    drop(ps);
    shard.svc.kill();
    let probe: Vec<u64> = (0..1000).map(|k| k * 7919 % rows).collect();
    let t0 = Instant::now();
    let shard = ShardProcess::start(&data, 256, config).await?;
    let ready_s = t0.elapsed().as_secs_f64();
    let ps = PsClient::connect(client_config(std::slice::from_ref(&shard.endpoint), t)).await?;
    let got = ps.pull_sparse("bench/rows", &probe).await?;
    let serve_s = t0.elapsed().as_secs_f64();
    anyhow::ensure!(got.len() == probe.len() * 64, "a short answer");
    let disk = dir_bytes(&data);
    println!(
        "{{\"case\":\"store_restart_after_kill_9\",\"rows\":{stored},\"fill_rows_per_s\":{:.0},\"serving_after_s\":{serve_s:.3},\"ready_after_s\":{ready_s:.3},\"disk_mib\":{},\"filled_rss_mib\":{},\"rss_mib\":{},{}}}",
        rows as f64 / fill_s,
        disk >> 20,
        fill_rss >> 20,
        shard.rss() >> 20,
        shard.start_up()
    );
    if std::env::var_os("PS_BENCH_LOG").is_some() {
        let log = std::fs::read_to_string(shard.svc.log()).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        eprintln!("{}", lines[lines.len().saturating_sub(25)..].join("\n"));
    }
    export_case(&ps, stored, &grads).await?;
    drop(ps);
    drop(shard);
    std::fs::remove_dir_all(&data)?;
    Ok(())
}

/// The export of the restart case's table (`bench/rows`, `rows` rows on shard 0): a checkpoint,
/// one push to 1% of the rows, a second checkpoint; then the full export of the second and its
/// incremental export against the first, each timed to the last part received.
async fn export_case(ps: &PsClient, rows: u64, grads: &[f32]) -> anyhow::Result<()> {
    ps.checkpoint("before").await?;
    let changed: Vec<u64> = (0..rows).step_by(100).collect();
    for ids in changed.chunks(grads.len() / 64) {
        ps.push_sparse("bench/rows", ids, &grads[..ids.len() * 64])
            .await?;
    }
    ps.checkpoint("after").await?;
    let tables = ["bench/rows".to_owned()];
    let mut timed = Vec::new();
    for since in [None, Some("before")] {
        let t0 = Instant::now();
        let mut stream = ps.export_checkpoint(0, "after", since, &tables).await?;
        let (mut sent, mut deleted, mut bytes) = (0u64, 0u64, 0u64);
        while let Some(part) = stream.next().await? {
            match part {
                ps_core::ExportPart::Rows { keys, values } => {
                    sent += keys.len() as u64;
                    bytes += keys.len() as u64 * 8 + values.len() as u64 * 4;
                }
                ps_core::ExportPart::Deleted { keys } => deleted += keys.len() as u64,
                _ => {}
            }
        }
        timed.push((t0.elapsed().as_secs_f64(), sent, deleted, bytes));
    }
    let [
        (full_s, full_rows, _, full_bytes),
        (inc_s, inc_rows, inc_deleted, _),
    ] = timed[..]
    else {
        anyhow::bail!("two exports");
    };
    anyhow::ensure!(
        full_rows == rows && inc_rows == changed.len() as u64 && inc_deleted == 0,
        "the exports hold {full_rows} and {inc_rows} rows"
    );
    println!(
        "{{\"case\":\"store_export\",\"rows\":{rows},\"full_s\":{full_s:.3},\"full_rows_per_s\":{:.0},\"full_mb_per_s\":{:.0},\"incremental_rows\":{inc_rows},\"incremental_s\":{inc_s:.3},\"incremental_rows_compared_per_s\":{:.0}}}",
        rows as f64 / full_s,
        full_bytes as f64 / full_s / 1e6,
        rows as f64 / inc_s
    );
    Ok(())
}

/// Bytes of the files under `dir`.
fn dir_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir).map_or(0, |entries| {
        entries
            .filter_map(Result::ok)
            .map(|e| match e.file_type() {
                Ok(t) if t.is_dir() => dir_bytes(&e.path()),
                _ => e.metadata().map_or(0, |m| m.len()),
            })
            .sum()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--server`, `--rocksdb` and `--dense-log-mib` make one config file that `ps-server`
    /// reads as given: the top-level keys before the `[rocksdb]` table.
    #[test]
    fn shard_config_is_read_by_the_server() {
        let dir = tempfile::tempdir().unwrap();
        let toml = shard_config(
            Some(256),
            &["dense_body_mib=8".to_owned()],
            &[
                "writer_spin_us=0".to_owned(),
                "inline_push_bytes = 0".to_owned(),
            ],
        )
        .unwrap();
        let mut args = vec!["ps-server".to_owned(), "--data-dir".to_owned()];
        args.push(dir.path().join("data").display().to_string());
        args.extend(config_args(&dir.path().join("s.toml"), toml).unwrap());
        let cfg = ServerConfig::resolve(ps_server::Args::parse_from(args)).unwrap();
        assert!(cfg.writer_spin.is_zero());
        assert_eq!(cfg.inline_push_bytes, 0);
        assert_eq!(cfg.rocksdb.dense_log_mib, 256);
        assert_eq!(cfg.rocksdb.dense_body_mib, Some(8));
        assert_eq!(shard_config(None, &[], &[]).unwrap(), None);
        assert!(shard_config(None, &[], &["writer_spin_us".to_owned()]).is_err());
    }
}
