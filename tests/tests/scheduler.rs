//! A real scheduler with real `ps-server` child processes registered with it, and workers
//! (test clients on the SDK) under BSP, SSP(2) and ASP: staleness bounds observed in the
//! parameters themselves, a worker killed and a worker joining late, a scheduler restart, a
//! coordinated checkpoint and resume, a checkpoint attempt's leftovers on a shard, checkpoints
//! exported for serving (`psctl export`, read back by the reader in docs/), a shard lost
//! and back at a new address, a stale shard-map epoch, and a shard that learns a newer one from
//! the first request bringing it.
//!
//! Needs the workspace's binaries (`cargo build --release` builds `ps-server` next to the test).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ps_client::scheduler::{ClockDone, SchedulerClient, WorkerSession};
use ps_client::{ClientConfig, PsClient};
use ps_core::JobSpec;
use ps_core::status::JobState;
use ps_launch::Service;
use ps_scheduler::Config;
use ps_tests::{Seen, max_clock, psctl, wait_for_clocks};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

async fn spawn_shard(data: &Path, index: u32, n: u32, scheduler: &str) -> Service {
    ps_tests::shard_process(data, index, n, scheduler).await
}

struct Sched {
    url: String,
    addr: std::net::SocketAddr,
    data: PathBuf,
    stop: CancellationToken,
    task: JoinHandle<anyhow::Result<()>>,
}

async fn start_scheduler(data: &Path, addr: Option<std::net::SocketAddr>) -> Sched {
    start_scheduler_with_lease(data, addr, Duration::from_millis(1500)).await
}

async fn start_scheduler_with_lease(
    data: &Path,
    addr: Option<std::net::SocketAddr>,
    lease: Duration,
) -> Sched {
    let mut cfg = Config::local(Some(data.to_owned()));
    cfg.scheduler.lease = lease;
    cfg.scheduler.tick = Duration::from_millis(50);
    // A checkpoint or resume that cannot reach its boundary fails the test in a minute, not
    // after the default five.
    cfg.scheduler.checkpoint_timeout = Duration::from_secs(60);
    let listener = TcpListener::bind(addr.unwrap_or(([127, 0, 0, 1], 0).into()))
        .await
        .expect("bind");
    let addr = listener.local_addr().unwrap();
    let stop = CancellationToken::new();
    let task = tokio::spawn(ps_scheduler::run(cfg, listener, None, stop.clone()));
    Sched {
        url: format!("http://{addr}"),
        addr,
        data: data.to_owned(),
        stop,
        task,
    }
}

impl Sched {
    async fn restart(self) -> Sched {
        self.stop.cancel();
        self.task.await.unwrap().unwrap();
        start_scheduler(&self.data, Some(self.addr)).await
    }
}

/// A scheduler and `n` shards registered with it.
struct Cluster {
    sched: Sched,
    shards: Vec<Service>,
    dir: tempfile::TempDir,
}

async fn cluster(n: u32) -> Cluster {
    cluster_with_lease(n, Duration::from_millis(1500)).await
}

async fn cluster_with_lease(n: u32, lease: Duration) -> Cluster {
    let dir = tempfile::tempdir().unwrap();
    let sched = start_scheduler_with_lease(&dir.path().join("scheduler"), None, lease).await;
    let mut shards = Vec::new();
    for i in 0..n {
        shards.push(spawn_shard(&dir.path().join(format!("shard-{i}")), i, n, &sched.url).await);
    }
    let c = SchedulerClient::connect(&sched.url).await.unwrap();
    for _ in 0..300 {
        if c.shard_map().await.is_ok_and(|m| m.complete) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(c.shard_map().await.unwrap().complete, "shards registered");
    Cluster { sched, shards, dir }
}

fn job(name: &str, consistency: &str, workers: u32, extra: &str) -> JobSpec {
    JobSpec::from_toml(&format!(
        r#"
name = "{name}"
consistency = "{consistency}"
staleness = {s}
num_shards = 2
num_workers = {workers}
lease_ms = 1500
{extra}

[[tables]]
name = "{name}/progress"
shape = [{workers}]
optimizer = "sgd"
learning_rate = 1.0
"#,
        s = if consistency == "ssp" { 2 } else { 0 }
    ))
    .unwrap()
}

fn client_cfg() -> ClientConfig {
    let mut c = ClientConfig::new(Vec::<String>::new());
    c.max_attempts = 60;
    c.max_backoff = Duration::from_millis(300);
    c
}

/// A worker: each clock it pulls the progress table, records it, pushes +1 at its own index
/// (after `delay`), and reports the clock. Runs `clocks` clocks, or until told to stop.
async fn worker(
    url: String,
    job: String,
    index: usize,
    clocks: u64,
    delay: Duration,
    seen: Seen,
) -> anyhow::Result<u64> {
    let sched = SchedulerClient::connect(&url).await?;
    let mut me = WorkerSession::join(sched, &job, &format!("w{index}")).await?;
    let ps = me.ps_client(client_cfg()).await?;
    let table = format!("{job}/progress");
    let n = me.spec().num_workers as usize;
    let mut g = me.start().await?;
    let mut done = 0;
    while !g.stop && done < clocks {
        let params = ps.pull_dense(&table).await?;
        seen.lock().push((index, g.clock, params));
        tokio::time::sleep(delay).await;
        let mut grad = vec![0.0; n];
        grad[index] = -1.0;
        ps.push_dense(&table, &grad).await?;
        done += 1;
        g = me
            .advance(ClockDone {
                examples: 10,
                ..Default::default()
            })
            .await?;
    }
    Ok(g.clock)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn staleness_stays_within_the_bound_under_bsp_ssp_and_asp() {
    let c = cluster(2).await;
    let sched = SchedulerClient::connect(&c.sched.url).await.unwrap();
    const W: usize = 3;
    const CLOCKS: u64 = 12;
    for (name, model, bound) in [
        ("bsp", "bsp", Some(0u64)),
        ("ssp", "ssp", Some(2)),
        ("asp", "asp", None),
    ] {
        sched.submit(&job(name, model, W as u32, "")).await.unwrap();
        let seen: Seen = Arc::default();
        let tasks: Vec<_> = (0..W)
            .map(|i| {
                // Worker 0 is slow.
                let delay = Duration::from_millis(if i == 0 { 40 } else { 1 });
                tokio::spawn(worker(
                    c.sched.url.clone(),
                    name.into(),
                    i,
                    CLOCKS,
                    delay,
                    seen.clone(),
                ))
            })
            .collect();
        for t in tasks {
            t.await.unwrap().unwrap();
        }
        let seen = std::mem::take(&mut *seen.lock());
        assert_eq!(seen.len(), W * CLOCKS as usize);
        let mut max_gap = 0;
        for (w, clock, params) in seen.iter() {
            for (o, p) in params.iter().enumerate() {
                // The parameters hold every update the policy promises: each other worker has
                // finished at least clock - s clocks.
                let progress = *p as u64;
                if let Some(s) = bound {
                    assert!(
                        progress + s >= *clock,
                        "{name}: worker {w} started clock {clock} with worker {o} at {progress}"
                    );
                }
                max_gap = max_gap.max(clock.saturating_sub(progress));
            }
        }
        let status = sched.job(name).await.unwrap();
        let st = status.staleness;
        eprintln!(
            "{name}: max gap seen {max_gap}, scheduler max gap {}, wait total {:.0} ms",
            st.max_gap, st.wait_ms_total
        );
        match bound {
            Some(s) => assert!(
                st.max_gap <= s,
                "{name}: scheduler measured gap {} > {s}",
                st.max_gap
            ),
            None => assert!(
                max_gap > 2,
                "ASP never held the fast workers back (gap {max_gap})"
            ),
        }
        assert_eq!(
            st.advances as usize,
            W * (CLOCKS as usize + 1),
            "{name}: every grant counted"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_worker_is_dropped_and_a_late_joiner_is_served() {
    let c = cluster(2).await;
    let sched = SchedulerClient::connect(&c.sched.url).await.unwrap();
    sched.submit(&job("elastic", "bsp", 2, "")).await.unwrap();
    let seen: Seen = Arc::default();
    let survivor = tokio::spawn(worker(
        c.sched.url.clone(),
        "elastic".into(),
        0,
        u64::MAX,
        Duration::from_millis(5),
        seen.clone(),
    ));
    let victim = tokio::spawn(worker(
        c.sched.url.clone(),
        "elastic".into(),
        1,
        1000,
        Duration::from_millis(5),
        seen.clone(),
    ));
    // Let both run a few clocks, then kill the victim (its heartbeats stop with it).
    wait_for_clocks(&seen, &[0, 1], 3).await;
    victim.abort();
    // Within the lease the survivor proceeds alone and owns both data shards.
    let mut reassigned = false;
    for _ in 0..200 {
        let st = sched.job("elastic").await.unwrap();
        let live: Vec<_> = st.live().collect();
        if live.len() == 1 && live[0].data_shards == vec![0, 1] {
            reassigned = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        reassigned,
        "the dead worker's data shard went to the survivor"
    );
    // The survivor trains on alone: three more clocks than it had.
    let alone_at = max_clock(&seen, 0);
    wait_for_clocks(&seen, &[0], alone_at + 3).await;
    assert!(!survivor.is_finished(), "the survivor still trains");
    // A worker joining now starts at the minimum clock (the survivor's: under BSP the
    // survivor cannot pass it until the joiner advances), takes a data shard and is served.
    let min_before = sched.job("elastic").await.unwrap().min_clock;
    let mut late = WorkerSession::join(
        SchedulerClient::connect(&c.sched.url).await.unwrap(),
        "elastic",
        "late",
    )
    .await
    .unwrap();
    let min_after = sched.job("elastic").await.unwrap().min_clock;
    assert!(
        late.clock() >= min_before,
        "joined at {} < {min_before}",
        late.clock()
    );
    assert_eq!(
        late.clock(),
        min_after,
        "the joiner is the job's minimum clock"
    );
    let g = tokio::time::timeout(Duration::from_secs(10), late.start())
        .await
        .expect("served")
        .unwrap();
    assert_eq!(g.clock, late.clock());
    assert_eq!(g.data_shards.len(), 1, "{g:?}");
    late.leave().await.unwrap();
    survivor.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoint_resume_and_scheduler_restart() {
    let c = cluster(2).await;
    let mut sched_proc = c.sched;
    let sched = SchedulerClient::connect(&sched_proc.url).await.unwrap();
    sched.submit(&job("ckpt", "bsp", 2, "")).await.unwrap();
    let seen: Seen = Arc::default();
    let run = |i: usize, url: String, seen: Seen| {
        tokio::spawn(async move {
            let sched = SchedulerClient::connect(&url).await?;
            let mut me = WorkerSession::join(sched, "ckpt", &format!("w{i}")).await?;
            let ps = me.ps_client(client_cfg()).await?;
            let mut g = me.start().await?;
            let mut restarted = 0;
            let mut after_restart = 0;
            // Until three clocks after the resume restarted this worker.
            while !g.stop && after_restart < 3 && g.clock < 5000 {
                let params = ps.pull_dense("ckpt/progress").await?;
                seen.lock().push((i, g.clock, params));
                tokio::time::sleep(Duration::from_millis(15)).await;
                let mut grad = vec![0.0; 2];
                grad[i] = -1.0;
                ps.push_dense("ckpt/progress", &grad).await?;
                g = me.advance(ClockDone::default()).await?;
                restarted += u64::from(g.restarted);
                if restarted > 0 {
                    after_restart += 1;
                }
            }
            me.leave().await?;
            anyhow::Ok(restarted)
        })
    };
    let w0 = run(0, sched_proc.url.clone(), seen.clone());
    let w1 = run(1, sched_proc.url.clone(), seen.clone());
    wait_for_clocks(&seen, &[0, 1], 3).await;

    // A coordinated checkpoint at a clock boundary: every update below its clock, none above
    // (checked below through what the workers see after the resume).
    let ckpt = sched.checkpoint("ckpt").await.unwrap();
    assert!(ckpt.clock >= 3, "{ckpt:?}");
    assert_eq!(
        ckpt.shards
            .iter()
            .map(|s| s.shard_index)
            .collect::<Vec<_>>(),
        [0, 1]
    );
    // The job manifest on disk is the checkpoint the scheduler answered, and each shard's
    // checkpoint it names is there with its own manifest.
    let manifest = sched_proc
        .data
        .join("jobs/ckpt/checkpoints")
        .join(format!("{}.json", ckpt.name));
    let on_disk: ps_core::status::JobCheckpoint =
        serde_json::from_slice(&std::fs::read(&manifest).unwrap()).unwrap();
    assert_eq!(on_disk, ckpt);
    for shard in &ckpt.shards {
        let dir = std::path::Path::new(&shard.path);
        assert!(dir.join("MANIFEST.json").exists(), "{}", dir.display());
        assert!(shard.files > 0 && shard.bytes > 0, "{shard:?}");
    }

    // The scheduler restarts mid-job; the workers ride it out and the job goes on.
    wait_for_clocks(&seen, &[0, 1], ckpt.clock + 2).await;
    let before = sched.job("ckpt").await.unwrap().min_clock;
    sched_proc = sched_proc.restart().await;
    let sched = SchedulerClient::connect(&sched_proc.url)
        .await
        .unwrap()
        .with_retries(50);
    let mut after = 0;
    for _ in 0..100 {
        after = sched.job("ckpt").await.unwrap().min_clock;
        if after > before + 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        after > before + 3,
        "clocks advanced after the restart ({before} -> {after})"
    );
    assert_eq!(
        sched.checkpoints("ckpt").await.unwrap().len(),
        1,
        "checkpoints survive the restart"
    );

    // Resume: the shards hold exactly the checkpoint's parameters and the workers restart at
    // its clock.
    let st = sched.resume("ckpt", Some(&ckpt.name)).await.unwrap();
    assert_eq!(st.min_clock, ckpt.clock, "{st:?}");
    let restarted = w0.await.unwrap().unwrap() + w1.await.unwrap().unwrap();
    assert_eq!(
        restarted, 2,
        "both workers were restarted at the checkpoint's clock"
    );
    let seen = seen.lock();
    let starts = seen.iter().filter(|(_, c, _)| *c == ckpt.clock).count();
    assert_eq!(
        starts, 4,
        "clock {} was computed twice by each worker",
        ckpt.clock
    );
    // At the start of clock c each worker has pushed its own progress exactly c times (after
    // the resume too: the restored state holds every update below the checkpoint's clock and
    // none at or above it), and under BSP the other worker has pushed c or c + 1 times.
    for (w, clock, params) in seen.iter() {
        for (i, p) in params.iter().enumerate() {
            let p = *p as u64;
            let ok = if i == *w {
                p == *clock
            } else {
                p == *clock || p == clock + 1
            };
            assert!(ok, "worker {w} at clock {clock} saw {params:?}");
        }
    }
}

/// What a checkpoint attempt leaves on a shard when it reached that shard but was never recorded
/// (another shard failed, or the scheduler died before saving it): a checkpoint by the name the
/// next attempt at the same clock would take. The scheduled checkpoint fails once on it, is taken
/// again under a name of its own after a short back-off, and the job goes on past the boundary;
/// what the failed attempt left on either shard is deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_left_on_a_shard_by_an_unrecorded_attempt_does_not_block_the_job() {
    let c = cluster(2).await;
    let sched = SchedulerClient::connect(&c.sched.url).await.unwrap();
    let left = c.dir.path().join("shard-1/checkpoints/left-c4-0");
    std::fs::create_dir_all(&left).unwrap();
    sched
        .submit(&job("left", "bsp", 1, "checkpoint_every = 4"))
        .await
        .unwrap();
    assert_eq!(one_worker(&c, "left", 10).await, 10);
    let ckpts = sched.checkpoints("left").await.unwrap();
    let got: Vec<(u64, &str)> = ckpts.iter().map(|c| (c.clock, c.name.as_str())).collect();
    assert_eq!(got, [(4, "left-c4-1"), (8, "left-c8-2")], "{ckpts:?}");
    // The recorded checkpoints are whole on both shards; what the failed attempt left is gone.
    for ck in &ckpts {
        for s in &ck.shards {
            assert!(
                std::path::Path::new(&s.path).join("MANIFEST.json").exists(),
                "{s:?}"
            );
        }
    }
    let want = ["left-c4-1", "left-c8-2"];
    let on_disk = checkpoints_on_disk(&c, "left", &want).await;
    assert!(on_disk.iter().all(|d| d == &want), "{on_disk:?}");
}

/// Runs one worker of job `name` for `clocks` clocks (a minute at most); its last clock.
async fn one_worker(c: &Cluster, name: &str, clocks: u64) -> u64 {
    let w = tokio::spawn(worker(
        c.sched.url.clone(),
        name.into(),
        0,
        clocks,
        Duration::from_millis(10),
        Seen::default(),
    ));
    tokio::time::timeout(Duration::from_secs(60), w)
        .await
        .expect("the job went past its checkpoint boundaries")
        .unwrap()
        .unwrap()
}

/// Shard directories under `checkpoints/` and job manifests, once they settle on `want`.
async fn checkpoints_on_disk(c: &Cluster, job: &str, want: &[&str]) -> Vec<Vec<String>> {
    let list = |dir: PathBuf, strip: &str| {
        let mut names: Vec<String> = std::fs::read_dir(&dir)
            .map(|d| {
                d.map(|e| {
                    let n = e.unwrap().file_name().to_string_lossy().into_owned();
                    n.strip_suffix(strip).unwrap_or(&n).to_owned()
                })
                .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    };
    let mut got = Vec::new();
    for _ in 0..100 {
        got = vec![
            list(c.dir.path().join("shard-0/checkpoints"), ""),
            list(c.dir.path().join("shard-1/checkpoints"), ""),
            list(
                c.sched.data.join("jobs").join(job).join("checkpoints"),
                ".json",
            ),
        ];
        if got.iter().all(|g| g == want) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    got
}

/// `keep_checkpoints`: only the newest checkpoints stay, on the shards and in the job's list;
/// `psctl delete-checkpoint` deletes one more (freeing bytes), a second time says it is not
/// found; the one left still resumes the job, and a scheduler restart keeps the list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_checkpoints_are_deleted_past_keep_checkpoints_and_on_demand() {
    let c = cluster(2).await;
    let sched = SchedulerClient::connect(&c.sched.url).await.unwrap();
    sched
        .submit(&job(
            "keep",
            "bsp",
            1,
            "checkpoint_every = 2\nkeep_checkpoints = 2",
        ))
        .await
        .unwrap();
    assert_eq!(one_worker(&c, "keep", 9).await, 9);
    // Checkpoints at clocks 2, 4, 6 and 8; the two oldest deleted.
    let kept = ["keep-c6-2", "keep-c8-3"];
    let ckpts = sched.checkpoints("keep").await.unwrap();
    let names: Vec<&str> = ckpts.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, kept, "{ckpts:?}");
    let on_disk = checkpoints_on_disk(&c, "keep", &kept).await;
    assert!(on_disk.iter().all(|d| d == &kept), "{on_disk:?}");

    let (code, out) = psctl(&c.sched.url, &["delete-checkpoint", "keep", "keep-c6-2"]);
    assert_eq!(code, Some(0), "{out}");
    let freed: u64 = out
        .split(" bytes freed")
        .next()
        .and_then(|s| s.rsplit('(').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{out}"));
    assert!(freed > 0, "{out}");
    let on_disk = checkpoints_on_disk(&c, "keep", &["keep-c8-3"]).await;
    assert!(on_disk.iter().all(|d| d == &["keep-c8-3"]), "{on_disk:?}");
    let (code, out) = psctl(&c.sched.url, &["delete-checkpoint", "keep", "keep-c6-2"]);
    assert_eq!(code, Some(4), "{out}");

    let restarted = Cluster {
        sched: c.sched.restart().await,
        ..c
    };
    let sched = SchedulerClient::connect(&restarted.sched.url)
        .await
        .unwrap();
    let names: Vec<String> = sched
        .checkpoints("keep")
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.name)
        .collect();
    assert_eq!(names, ["keep-c8-3"]);
    let mut ps = None;
    for _ in 0..100 {
        match sched.ps_client(client_cfg()).await {
            Ok(p) => {
                ps = Some(p);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    let ps = ps.expect("the shards registered again");
    assert_eq!(ps.pull_dense("keep/progress").await.unwrap(), [9.0]);
    let mut resumed = None;
    for _ in 0..100 {
        match sched.resume("keep", None).await {
            Ok(st) => {
                resumed = Some(st);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    let st = resumed.expect("the job resumes from the checkpoint left");
    assert_eq!(st.latest_checkpoint.as_deref(), Some("keep-c8-3"));
    // Eight clocks of +1: the state at the checkpoint, not the ninth clock's.
    assert_eq!(ps.pull_dense("keep/progress").await.unwrap(), [8.0]);
}

/// What the export reader in docs/ (Python, standard library only) reads from `dir`, with the
/// incremental export `apply` applied when given.
fn read_export(dir: &Path, apply: Option<&Path>) -> serde_json::Value {
    let mut cmd = std::process::Command::new("python3");
    cmd.arg(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/read_export.py"
    ))
    .arg(dir);
    if let Some(inc) = apply {
        cmd.arg("--apply").arg(inc);
    }
    let out = cmd.output().expect("python3 runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `psctl export`: a job's scheduled checkpoints exported whole and incrementally, and read back
/// by the reader in docs/ that uses nothing of ours. Each full export holds exactly what the
/// shards held at its checkpoint (dense tables whole across both shards, sparse rows by key);
/// the incremental one carries only the rows changed since the earlier checkpoint, and applied
/// to that checkpoint's full export it equals the later full export.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn psctl_exports_checkpoints_whole_and_incrementally_in_files_any_reader_reads() {
    let c = cluster(2).await;
    let sched = SchedulerClient::connect(&c.sched.url).await.unwrap();
    let spec = JobSpec::from_toml(
        r#"
name = "exp"
consistency = "bsp"
num_shards = 2
num_workers = 1
checkpoint_every = 4

[[tables]]
name = "exp/w"
shape = [3, 5]
chunk_elems = 4
optimizer = "sgd"
learning_rate = 1.0

[[tables]]
name = "exp/emb"
dim = 3
optimizer = "sgd"
learning_rate = 1.0
"#,
    )
    .unwrap();
    sched.submit(&spec).await.unwrap();
    // At clock c the worker pushes 1 to element c of `exp/w` and c + 1 to every value of rows
    // 7c..7c+9 of `exp/emb` (overlapping the next clock's rows); checkpoints at clocks 4 and 8.
    const CLOCKS: u64 = 8;
    let rows_of = |c: u64| (7 * c..7 * c + 10).collect::<Vec<u64>>();
    let url = c.sched.url.clone();
    let w = tokio::spawn(async move {
        let sched = SchedulerClient::connect(&url).await?;
        let mut me = WorkerSession::join(sched, "exp", "w0").await?;
        let ps = me.ps_client(client_cfg()).await?;
        let mut g = me.start().await?;
        while g.clock < CLOCKS {
            let mut grad = vec![0.0; 15];
            grad[g.clock as usize] = 1.0;
            ps.push_dense("exp/w", &grad).await?;
            let ids = (7 * g.clock..7 * g.clock + 10).collect::<Vec<u64>>();
            let grads = vec![(g.clock + 1) as f32; ids.len() * 3];
            ps.push_sparse("exp/emb", &ids, &grads).await?;
            g = me.advance(ClockDone::default()).await?;
        }
        me.leave().await?;
        anyhow::Ok(g.clock)
    });
    assert_eq!(w.await.unwrap().unwrap(), CLOCKS);
    let mut cks = Vec::new();
    for _ in 0..200 {
        cks = sched.checkpoints("exp").await.unwrap();
        if cks.len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let clocks: Vec<u64> = cks.iter().map(|c| c.clock).collect();
    assert_eq!(clocks, [4, 8], "{cks:?}");

    // What the shards held at a checkpoint of clock k: the pushes of clocks 0..k.
    let expected = |k: u64| {
        let mut w = vec![0.0f64; 15];
        let mut rows = std::collections::BTreeMap::<u64, f64>::new();
        for c in 0..k {
            w[c as usize] -= 1.0;
            for id in rows_of(c) {
                *rows.entry(id).or_default() -= (c + 1) as f64;
            }
        }
        serde_json::json!({
            "checkpoint": cks.iter().find(|x| x.clock == k).unwrap().name,
            "dense": {"exp/w": {"shape": [3, 5], "values": w}},
            "sparse": {"exp/emb": rows
                .iter()
                .map(|(k, v)| (k.to_string(), serde_json::json!([v, v, v])))
                .collect::<serde_json::Map<_, _>>()},
        })
    };
    let root = c.dir.path().join("exports");
    let (a, b, inc) = (root.join("c4"), root.join("c8"), root.join("c4-c8"));
    let url = &c.sched.url;
    let (code, out) = psctl(
        url,
        &[
            "export",
            "exp",
            a.to_str().unwrap(),
            "--checkpoint",
            &cks[0].name,
        ],
    );
    assert_eq!(code, Some(0), "{out}");
    let (code, out) = psctl(url, &["export", "exp", b.to_str().unwrap()]);
    assert!(
        code == Some(0) && out.contains(&cks[1].name),
        "the latest by default: {out}"
    );
    let (code, out) = psctl(
        url,
        &[
            "export",
            "exp",
            inc.to_str().unwrap(),
            "--since",
            &cks[0].name,
        ],
    );
    assert!(code == Some(0) && out.contains("incremental"), "{out}");

    assert_eq!(read_export(&a, None), expected(4));
    assert_eq!(read_export(&b, None), expected(8));
    assert_eq!(read_export(&a, Some(&inc)), read_export(&b, None));
    // The incremental export holds the rows clocks 4..8 pushed (28..=58), no other.
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(inc.join("manifest.json")).unwrap()).unwrap();
    let rows: u64 = m["sparse"][0]["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["rows"].as_u64().unwrap())
        .sum();
    assert_eq!(rows, 31, "{m}");
    assert_eq!(m["since"]["name"], cks[0].name.as_str());

    // Refusals change nothing: an existing export, a --since after the checkpoint, a
    // checkpoint the job does not have.
    let before = std::fs::read(b.join("manifest.json")).unwrap();
    let (code, out) = psctl(url, &["export", "exp", b.to_str().unwrap()]);
    assert!(code == Some(1) && out.contains("not empty"), "{out}");
    assert_eq!(std::fs::read(b.join("manifest.json")).unwrap(), before);
    let bad = root.join("bad");
    let (code, out) = psctl(
        url,
        &[
            "export",
            "exp",
            bad.to_str().unwrap(),
            "--checkpoint",
            &cks[0].name,
            "--since",
            &cks[1].name,
        ],
    );
    assert!(code == Some(1) && out.contains("after"), "{out}");
    let (code, out) = psctl(
        url,
        &[
            "export",
            "exp",
            bad.to_str().unwrap(),
            "--checkpoint",
            "nope",
        ],
    );
    assert!(
        code == Some(4) && out.contains("no checkpoint `nope`"),
        "{out}"
    );
    assert!(!bad.join("manifest.json").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_shard_pauses_the_job_until_it_returns_and_nothing_is_lost() {
    let mut c = cluster(2).await;
    let sched = SchedulerClient::connect(&c.sched.url).await.unwrap();
    sched.submit(&job("pause", "bsp", 2, "")).await.unwrap();
    const CLOCKS: u64 = 40;
    let seen: Seen = Arc::default();
    let workers: Vec<_> = (0..2)
        .map(|i| {
            tokio::spawn(worker(
                c.sched.url.clone(),
                "pause".into(),
                i,
                CLOCKS,
                Duration::from_millis(20),
                seen.clone(),
            ))
        })
        .collect();
    // Kill the shard that holds the workers' table, mid-job.
    let mut cfg = client_cfg();
    let map = sched.shard_map().await.unwrap();
    cfg.endpoints = map.endpoints.clone();
    let ps = PsClient::connect(cfg).await.unwrap();
    let owner = ps.partitioner().shard_for_chunk(
        ps_core::TableName::try_from("pause/progress")
            .unwrap()
            .hash64(),
        0,
    );
    wait_for_clocks(&seen, &[0, 1], 3).await;
    drop(c.shards.remove(owner as usize));
    // Within the lease the job pauses and no clock advances.
    let mut paused = None;
    for _ in 0..100 {
        let st = sched.job("pause").await.unwrap();
        if st.state == JobState::Paused {
            paused = Some(st);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let paused = paused.expect("the job paused when its shard disappeared");
    assert!(
        paused.message.contains("not registered"),
        "{}",
        paused.message
    );
    assert!(paused.min_clock < CLOCKS, "the workers were still training");
    // Nothing may happen for a while: watch for half a lease.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let still = sched.job("pause").await.unwrap();
    assert_eq!(
        still.min_clock, paused.min_clock,
        "no clock was granted while paused"
    );
    // The shard comes back on its data, at a new address: a new map epoch, which the workers'
    // clients follow on their own.
    let dir = c.dir.path().join(format!("shard-{owner}"));
    c.shards
        .push(spawn_shard(&dir, owner, 2, &c.sched.url).await);
    for w in workers {
        let clock = tokio::time::timeout(Duration::from_secs(60), w)
            .await
            .expect("the workers finished after the shard returned")
            .unwrap()
            .unwrap();
        assert_eq!(clock, CLOCKS);
    }
    let after = sched.shard_map().await.unwrap();
    assert!(after.epoch > map.epoch, "the new address is a new epoch");
    let st = sched.job("pause").await.unwrap();
    assert_eq!(st.state, JobState::Running, "{}", st.message);
    // Every acknowledged push survived the kill and none was applied twice.
    let mut cfg = client_cfg();
    cfg.endpoints = after.endpoints;
    cfg.map_epoch = after.epoch;
    let ps = PsClient::connect(cfg).await.unwrap();
    assert_eq!(
        ps.pull_dense("pause/progress").await.unwrap(),
        vec![CLOCKS as f32; 2]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_a_clear_status_and_changes_nothing() {
    let c = cluster(2).await;
    let sched = SchedulerClient::connect(&c.sched.url).await.unwrap();
    let e = sched.job("nope").await.unwrap_err();
    assert_eq!(e.code(), Some(tonic::Code::NotFound));
    let e = sched.checkpoint("nope").await.unwrap_err();
    assert_eq!(e.code(), Some(tonic::Code::NotFound));

    // Invalid specs, sent raw (the SDK's JobSpec could not even hold them).
    let good = ps_proto::v1::JobSpec::from(&job("good", "ssp", 2, ""));
    let mut raw = ps_proto::v1::scheduler_client::SchedulerClient::connect(c.sched.url.clone())
        .await
        .unwrap();
    for (tweak, want) in [
        (
            Box::new(|s: &mut ps_proto::v1::JobSpec| s.staleness = -1) as Box<dyn Fn(&mut _)>,
            "staleness",
        ),
        (
            Box::new(|s: &mut ps_proto::v1::JobSpec| s.num_shards = 0),
            "num_shards",
        ),
        (
            Box::new(|s: &mut ps_proto::v1::JobSpec| {
                s.tables[0].spec.as_mut().unwrap().optimizer = None
            }),
            "optimizer",
        ),
        (
            Box::new(|s: &mut ps_proto::v1::JobSpec| s.tables[0].codec = "zip".into()),
            "codec",
        ),
    ] {
        let mut s = good.clone();
        tweak(&mut s);
        let e = raw
            .submit_job(ps_proto::v1::SubmitJobRequest { spec: Some(s) })
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
        assert!(
            e.message().contains(want),
            "{} should name {want}",
            e.message()
        );
    }
    assert!(sched.jobs().await.unwrap().is_empty(), "nothing was stored");

    // A stale shard-map epoch is refused by the shards.
    sched.submit(&job("epochs", "bsp", 1, "")).await.unwrap();
    let map = sched.shard_map().await.unwrap();
    assert_eq!(map.epoch, 2, "one epoch per shard address");
    let mut cfg = client_cfg();
    cfg.endpoints = map.endpoints.clone();
    cfg.map_epoch = map.epoch;
    let ps = PsClient::connect(cfg).await.unwrap();
    // Shards learn the newest epoch from their next heartbeat.
    let mut learnt = false;
    for _ in 0..100 {
        if ps
            .create_table(ps_core::TableSpec::dense("epoch-probe", &[4]).unwrap())
            .await
            .is_ok()
            && ps.push_dense("epoch-probe", &[0.0; 4]).await.is_ok()
        {
            learnt = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(learnt);
    ps.set_map_epoch(map.epoch - 1);
    let e = ps.push_dense("epoch-probe", &[1.0; 4]).await.unwrap_err();
    assert_eq!(e.code(), Some(tonic::Code::FailedPrecondition), "{e}");
    assert!(e.to_string().contains("stale shard map"), "{e}");
    // Any client can tell it from the error details, without reading the message.
    assert_eq!(e.reason(), Some(ps_core::wire::reason::STALE_MAP), "{e}");
    ps.set_map_epoch(map.epoch);
    assert_eq!(
        ps.pull_dense("epoch-probe").await.unwrap(),
        vec![0.0; 4],
        "the refused push changed nothing"
    );
}

/// The shard that registered first holds map epoch 1 when the second registers (epoch 2). With a
/// one-minute lease its next heartbeat is 20 s away; the first request routed with epoch 2 is
/// refused as `unavailable` and makes it heartbeat at once, so the client's retry, well within
/// a few backoffs, finds it current.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_behind_the_map_learns_the_epoch_from_the_first_request() {
    let c = cluster_with_lease(2, Duration::from_secs(60)).await;
    let sched = SchedulerClient::connect(&c.sched.url).await.unwrap();
    let map = sched.shard_map().await.unwrap();
    assert_eq!(map.epoch, 2, "one epoch per shard address");
    let mut cfg = ClientConfig::new(map.endpoints.clone());
    cfg.map_epoch = map.epoch;
    // At most about 2 s of retries (50 ms doubling to 300 ms, jittered): far less than the 20 s
    // to the next heartbeat.
    cfg.max_attempts = 10;
    cfg.max_backoff = Duration::from_millis(300);
    let ps = PsClient::connect(cfg).await.unwrap();
    // 64 chunks: both shards own some (all on one: a chance of 2^-63).
    let spec = ps_core::TableSpec::dense("behind", &[64 * 256])
        .unwrap()
        .with_chunk_elems(256)
        .unwrap();
    ps.create_table(spec).await.unwrap();
    ps.push_dense("behind", &[1.0; 64 * 256]).await.unwrap();
    assert_eq!(
        ps.pull_dense("behind").await.unwrap(),
        vec![-0.01; 64 * 256],
        "SGD at 0.01 applied once"
    );
    drop(c);
}
