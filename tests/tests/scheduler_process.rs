//! The `scheduler` binary as a real child process: kill -9 mid-job and a restart on its data
//! dir lose no job, checkpoint or map, while workers (SDK sessions) ride the restart out; a
//! SIGTERM answers held long polls at once and exits 0, and the held worker rides that stop
//! out too; `psctl`'s exit codes say what went
//! wrong, for scripts; `psctl pull` reads a table through the scheduler's map.
//!
//! Needs the workspace's binaries (`cargo build --release` puts them next to the test).

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use ps_client::ClientConfig;
use ps_client::scheduler::{ClockDone, SchedulerClient, WorkerSession};
use ps_core::JobSpec;
use ps_core::status::JobState;
use ps_tests::{Seen, max_clock, psctl, scheduler_process, shard_process, wait_for_clocks};

fn job(name: &str, workers: u32) -> JobSpec {
    JobSpec::from_toml(&format!(
        "name = \"{name}\"\nconsistency = \"bsp\"\nnum_shards = 1\nnum_workers = {workers}\n\
         lease_ms = 3000\n\n[[tables]]\nname = \"{name}/progress\"\nshape = [{workers}]\n\
         optimizer = \"sgd\"\nlearning_rate = 1.0\n"
    ))
    .unwrap()
}

/// A worker that pushes +1 at its index every clock until the job ends; returns the clocks it
/// finished. Each clock's pull is recorded in `seen`.
async fn worker(url: String, job: String, index: usize, seen: Seen) -> anyhow::Result<u64> {
    let sched = SchedulerClient::connect(&url).await?;
    let mut me = WorkerSession::join(sched, &job, &format!("w{index}")).await?;
    let mut cfg = ClientConfig::new(Vec::<String>::new());
    cfg.max_attempts = 100;
    cfg.max_backoff = Duration::from_millis(300);
    let ps = me.ps_client(cfg).await?;
    let table = format!("{job}/progress");
    let n = me.spec().num_workers as usize;
    let mut g = me.start().await?;
    let mut done = 0;
    while !g.stop {
        let params = ps.pull_dense(&table).await?;
        seen.lock().push((index, g.clock, params));
        let mut grad = vec![0.0; n];
        grad[index] = -1.0;
        ps.push_dense(&table, &grad).await?;
        done += 1;
        g = me.advance(ClockDone::default()).await?;
    }
    Ok(done)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_the_scheduler_loses_nothing_and_workers_ride_it_out() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("scheduler");
    let (mut sched_proc, url) = scheduler_process(&data, "127.0.0.1:0", &[]).await;
    let _shard = shard_process(&dir.path().join("shard-0"), 0, 1, &url).await;
    let sched = SchedulerClient::connect(&url).await.unwrap();
    sched.submit(&job("crash", 2)).await.unwrap();
    let seen: Seen = Arc::default();
    let workers: Vec<_> = (0..2)
        .map(|i| tokio::spawn(worker(url.clone(), "crash".into(), i, seen.clone())))
        .collect();
    wait_for_clocks(&seen, &[0, 1], 3).await;
    let ckpt = sched.checkpoint("crash").await.unwrap();
    wait_for_clocks(&seen, &[0, 1], ckpt.clock + 2).await;
    let map = sched.shard_map().await.unwrap();

    // kill -9 while both workers are long-polling or computing, and a restart on the same
    // data dir and address.
    sched_proc.kill();
    let listen = url.trim_start_matches("http://").to_owned();
    let killed_at = max_clock(&seen, 0);
    let (_sched_proc, url2) = scheduler_process(&data, &listen, &[]).await;
    assert_eq!(url2, url);
    let sched = SchedulerClient::connect(&url)
        .await
        .unwrap()
        .with_retries(50);
    // The job, its checkpoint and the map came back from the state file.
    let st = sched.job("crash").await.unwrap();
    assert_eq!(st.spec, job("crash", 2));
    assert_eq!(sched.checkpoints("crash").await.unwrap(), vec![ckpt]);
    assert_eq!(sched.shard_map().await.unwrap().epoch, map.epoch);
    // The workers go on: past where they were at the kill, then cancel ends them cleanly.
    wait_for_clocks(&seen, &[0, 1], killed_at + 5).await;
    let st = sched.job("crash").await.unwrap();
    assert_eq!(st.state, JobState::Running, "{}", st.message);
    assert_eq!(st.live().count(), 2, "{st:?}");
    sched.cancel("crash").await.unwrap();
    for w in workers {
        let done = tokio::time::timeout(Duration::from_secs(60), w)
            .await
            .expect("the worker ended with the job")
            .unwrap()
            .expect("the worker rode out the restart");
        assert!(done > killed_at, "{done} clocks");
    }
    // Nothing applied twice or lost: each worker's own progress is its clock at every pull.
    for (w, clock, params) in seen.lock().iter() {
        assert_eq!(params[*w] as u64, *clock, "worker {w}: {params:?}");
    }
}

/// kill -9 of the scheduler while real worker processes hold long polls (BSP, one worker
/// twenty times slower, so the other spends nearly every clock waiting on it in a long poll),
/// and a restart 3 s later on the same address and data dir: every worker survives and the
/// job runs to its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_processes_ride_out_a_scheduler_killed_during_their_long_polls() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("scheduler");
    let (mut sched_proc, url) = scheduler_process(&data, "127.0.0.1:0", &[]).await;
    let _shard = shard_process(&dir.path().join("shard-0"), 0, 1, &url).await;
    let spec = ps_worker::job::job_from_toml(
        "name = \"ride\"\nconsistency = \"bsp\"\nnum_shards = 1\nnum_workers = 2\n\
         dataset = \"synthetic-dense:4000:256:10\"\nmodel = \"softmax\"\nglobal_batch = 512\n\
         max_clocks = 150\nlease_ms = 10000\n",
    )
    .unwrap();
    let sched = SchedulerClient::connect(&url).await.unwrap();
    sched.submit(&spec).await.unwrap();
    let bin = ps_launch::binary("worker").unwrap();
    let logs = dir.path().join("logs");
    let mut workers: Vec<ps_launch::Service> = [("w0", "20"), ("w1", "1")]
        .into_iter()
        .map(|(name, slowdown)| {
            let args: Vec<String> = [
                "--scheduler",
                &url,
                "--job",
                "ride",
                "--name",
                name,
                "--run-dir",
                &dir.path().join("run").display().to_string(),
                "--slowdown",
                slowdown,
            ]
            .map(str::to_owned)
            .into();
            ps_launch::Service::spawn(&bin, name, &args, &logs, false).unwrap()
        })
        .collect();
    // Well under way, then kill -9 while w1 waits on w0 in a long poll.
    let t0 = std::time::Instant::now();
    let killed_at = loop {
        let st = sched.job("ride").await.unwrap();
        if st.min_clock >= 10 {
            break st.min_clock;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "{st:?}\n{}",
            workers[0].tail()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    sched_proc.kill();
    assert!(
        killed_at < 100,
        "the job was nearly over at the kill: clock {killed_at}"
    );
    let listen = url.trim_start_matches("http://").to_owned();
    tokio::time::sleep(Duration::from_secs(3)).await;
    for w in &mut workers {
        assert!(
            w.check().is_ok(),
            "{} died with the scheduler:\n{}",
            w.name(),
            w.tail()
        );
    }
    let (_sched_proc, url2) = scheduler_process(&data, &listen, &[]).await;
    assert_eq!(url2, url);
    for w in &mut workers {
        let status = w
            .wait(Duration::from_secs(180))
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{} did not finish:\n{}", w.name(), w.tail()));
        assert!(status.success(), "{} failed:\n{}", w.name(), w.tail());
    }
    let sched = SchedulerClient::connect(&url)
        .await
        .unwrap()
        .with_retries(50);
    let st = sched.job("ride").await.unwrap();
    assert_eq!(st.state, JobState::Succeeded, "{}", st.message);
    assert_eq!(st.message, "every worker finished 150 clocks");
    // The restart lost no member: the job still has exactly the two workers that joined.
    assert_eq!(st.workers.len(), 2, "{st:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_answers_long_polls_at_once_and_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("scheduler");
    let config = dir.path().join("sched.toml");
    // A grace far longer than any test: a stop that waits for it is the bug.
    std::fs::write(&config, "grace_ms = 120000\nmax_wait_ms = 120000\n").unwrap();
    let (mut sched_proc, url) = scheduler_process(
        &data,
        "127.0.0.1:0",
        &["--config", config.to_str().unwrap()],
    )
    .await;
    let _shard = shard_process(&dir.path().join("shard-0"), 0, 1, &url).await;
    let sched = SchedulerClient::connect(&url).await.unwrap();
    sched.submit(&job("held", 2)).await.unwrap();
    // One member of a two-worker BSP job: its first clock is held until the second joins.
    let mut me = WorkerSession::join(sched.clone(), "held", "alone")
        .await
        .unwrap();
    let held = tokio::spawn(async move { me.start().await });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !std::fs::read_to_string(sched_proc.log())
        .unwrap()
        .contains("worker joined")
    {
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    drop(sched);
    sched_proc.terminate();
    let status = sched_proc
        .wait(Duration::from_secs(60))
        .await
        .unwrap()
        .expect("the scheduler exited long before its 120 s grace");
    assert_eq!(status.code(), Some(0), "{}", sched_proc.tail());
    let log = std::fs::read_to_string(sched_proc.log()).unwrap();
    assert!(
        !log.contains("did not finish within the grace period"),
        "{log}"
    );
    // The held worker rides the stop out: its call repeated against the stopping server (a
    // connection closed under it comes back as tonic's `internal`) and against no server at
    // all is retried until the scheduler is back; then the second member's join lets it start.
    let listen = url.trim_start_matches("http://").to_owned();
    let (_sched_proc, url2) = scheduler_process(&data, &listen, &[]).await;
    assert_eq!(url2, url);
    let sched = SchedulerClient::connect(&url).await.unwrap();
    let mut other = WorkerSession::join(sched, "held", "second").await.unwrap();
    let (mine, theirs) = tokio::join!(
        tokio::time::timeout(Duration::from_secs(60), held),
        other.start()
    );
    let grant = mine
        .expect("the held worker never started")
        .unwrap()
        .expect("the held worker gave up over the scheduler's stop");
    let theirs = theirs.unwrap();
    // Both start the job's first clock, each with its own data shard.
    assert!(!grant.stop && !theirs.stop, "{grant:?} {theirs:?}");
    assert_eq!((grant.clock, theirs.clock), (0, 0), "{grant:?} {theirs:?}");
    assert_eq!(grant.data_shards.len() + theirs.data_shards.len(), 2);
}

/// `psctl`'s exit codes: 0 done, 2 bad usage or job file, 3 scheduler unreachable, 4 no such
/// job or checkpoint, 5 refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn psctl_exit_codes_say_what_went_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let (_sched, url) = scheduler_process(&dir.path().join("scheduler"), "127.0.0.1:0", &[]).await;
    let file = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    };
    let good = file(
        "good.toml",
        "name = \"j\"\nconsistency = \"bsp\"\nnum_shards = 1\nnum_workers = 1\n\n[[tables]]\n\
         name = \"j/w\"\nshape = [4]\n",
    );
    let other = file(
        "other.toml",
        "name = \"j\"\nconsistency = \"asp\"\nnum_shards = 1\nnum_workers = 1\n\n[[tables]]\n\
         name = \"j/w\"\nshape = [4]\n",
    );
    let bad = file(
        "bad.toml",
        "name = \"j\"\nconsistency = \"sometimes\"\nnum_shards = 1\nnum_workers = 1\n",
    );
    // A closed loopback port: nothing listens there.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let cases: [(&[&str], &str, i32, &str); 8] = [
        (&["submit", &good], &url, 0, "submitted job `j`"),
        (&["status", "j"], &url, 0, "job j"),
        (&["submit", &bad], &url, 2, "consistency"),
        (&["submit", "/nonexistent.toml"], &url, 2, "reading"),
        (&["status", "nope"], &url, 4, "no job named `nope`"),
        (&["resume", "j"], &url, 4, "no complete checkpoint"),
        (&["submit", &other], &url, 5, "exists with another spec"),
        (&["status"], &closed, 3, "cannot reach the scheduler"),
    ];
    for (args, scheduler, code, words) in cases {
        let (got, text) = psctl(scheduler, args);
        assert_eq!(got, Some(code), "psctl {args:?}: {text}");
        assert!(text.contains(words), "psctl {args:?}: {text}");
    }
    // A reader that went away (`psctl status | head`): psctl ends quietly, no panic.
    let mut child = Command::new(ps_launch::binary("psctl").unwrap())
        .args(["--scheduler", &url, "status", "j"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.is_empty(), "{err}");
}

/// `psctl pull`: a dense table read through the scheduler's map, across both shards, as the
/// fault drills read their counter; a table that is not there, or not dense, is an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn psctl_pull_reads_a_dense_table_across_the_shards() {
    let dir = tempfile::tempdir().unwrap();
    let (_sched, url) = scheduler_process(&dir.path().join("scheduler"), "127.0.0.1:0", &[]).await;
    let pull = |args: &[&str]| psctl(&url, args);
    // No shard yet: said, not hung.
    let (code, text) = pull(&["pull", "t/w"]);
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("not every shard is registered"), "{text}");
    let _s0 = shard_process(&dir.path().join("s0"), 0, 2, &url).await;
    let _s1 = shard_process(&dir.path().join("s1"), 1, 2, &url).await;
    let sched = SchedulerClient::connect(&url).await.unwrap();
    let ps = sched
        .ps_client(ClientConfig::new(Vec::<String>::new()))
        .await
        .unwrap();
    // 10 chunks of 100 values: both shards hold some.
    ps.create_table(
        ps_core::TableSpec::dense("t/w", &[1000])
            .unwrap()
            .with_optimizer(ps_core::Optimizer::sgd(1.0))
            .unwrap()
            .with_chunk_elems(100)
            .unwrap(),
    )
    .await
    .unwrap();
    ps.create_table(ps_core::TableSpec::sparse("t/emb", 4).unwrap())
        .await
        .unwrap();
    let grad: Vec<f32> = (0..1000).map(|i| -(i as f32)).collect();
    ps.push_dense("t/w", &grad).await.unwrap();
    let (code, text) = pull(&["--json", "pull", "t/w", "--values"]);
    assert_eq!(code, Some(0), "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["len"], 1000);
    assert_eq!(
        (v["min"].as_f64(), v["max"].as_f64()),
        (Some(0.0), Some(999.0))
    );
    assert_eq!(v["sum"].as_f64(), Some(499_500.0));
    let values: Vec<f64> = v["values"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect();
    assert_eq!(values, (0..1000).map(f64::from).collect::<Vec<_>>());
    let (code, text) = pull(&["pull", "t/w"]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("1000 values, min 0, max 999"), "{text}");
    let (code, text) = pull(&["pull", "t/nope"]);
    assert_eq!(code, Some(4), "{text}");
    assert!(text.contains("t/nope"), "{text}");
    let (code, text) = pull(&["pull", "t/emb"]);
    assert_ne!(code, Some(0), "{text}");
    assert!(text.contains("sparse"), "{text}");
    // The services' logs, written to files, are plain text: no terminal colour codes.
    for log in ["scheduler", "shard-0", "shard-1"] {
        let text = std::fs::read_to_string(dir.path().join(format!("logs/{log}.log"))).unwrap();
        assert!(text.contains("INFO"), "{log}: {text}");
        assert!(
            !text.contains('\u{1b}'),
            "{log} holds escape codes: {text:?}"
        );
    }
}
