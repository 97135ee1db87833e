//! Clock-advance benchmark: N simulated workers (lightweight in-process clients sharing a few
//! HTTP/2 connections) advance clocks under SSP(s) against one scheduler process, with no
//! compute in between. Reports advance latency p50/p99/max, advances per second, and the
//! scheduler's CPU per advance (from /proc of its process).
//!
//! `cargo run --release --bin sched-bench -- --workers 1000 --clocks 50`
//! (runs the `scheduler` and `ps-server` binaries built next to it).

use std::time::{Duration, Instant};

use clap::Parser;
use ps_bench::pct;
use ps_client::scheduler::{ClockDone, SchedulerClient, WorkerSession};
use ps_core::JobSpec;
use ps_launch::{Service, binary};

#[derive(Debug, Parser)]
struct Args {
    #[arg(long, default_value_t = 1000)]
    workers: u32,
    /// Clocks each worker advances.
    #[arg(long, default_value_t = 50)]
    clocks: u64,
    #[arg(long, default_value_t = 3)]
    staleness: u64,
    /// HTTP/2 connections the workers share.
    #[arg(long, default_value_t = 8)]
    connections: usize,
    /// Offered load in advances per second over all workers, each worker paced and staggered
    /// so that the policy never needs to hold anyone (latency is the scheduler's own); 0 =
    /// closed loop, every worker as fast as it can (throughput at saturation, latency then
    /// includes queueing behind the other workers).
    #[arg(long, default_value_t = 5000.0)]
    rate: f64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    let dir = tempfile::tempdir()?;
    let logs = dir.path().join("logs");
    let mut sched = Service::spawn(
        &binary("scheduler")?,
        "scheduler",
        &[
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--data-dir".into(),
            dir.path().join("sched").display().to_string(),
            "--lease-ms".into(),
            "30000".into(),
        ],
        &logs,
        true,
    )?;
    let url = sched.ready(Duration::from_secs(60)).await?.url();
    let mut shard = Service::spawn(
        &binary("ps-server")?,
        "shard",
        &[
            "--in-memory".into(),
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--scheduler".into(),
            url.clone(),
        ],
        &logs,
        true,
    )?;
    shard.ready(Duration::from_secs(60)).await?;
    let mut clients = Vec::new();
    for _ in 0..a.connections {
        clients.push(SchedulerClient::connect(&url).await?.with_retries(100));
    }
    let spec = JobSpec::from_toml(&format!(
        "name = \"bench\"\nconsistency = \"ssp\"\nstaleness = {}\nnum_shards = 1\nnum_workers = {}\nlease_ms = 60000\n",
        a.staleness, a.workers
    ))?;
    clients[0].submit(&spec).await?;
    let mut sessions = Vec::new();
    for i in 0..a.workers {
        let c = clients[i as usize % clients.len()].clone();
        sessions.push(WorkerSession::join(c, "bench", &format!("w{i}")).await?);
    }
    for s in &mut sessions {
        s.start().await?;
    }
    let cpu0 = sched.cpu_seconds()?;
    let t0 = Instant::now();
    let tasks: Vec<_> = sessions
        .into_iter()
        .enumerate()
        .map(|(i, mut s)| {
            let clocks = a.clocks;
            let (rate, n) = (a.rate, f64::from(a.workers));
            tokio::spawn(async move {
                let mut lat = Vec::with_capacity(clocks as usize);
                for k in 0..clocks {
                    if rate > 0.0 {
                        let at = (k as f64 * n + i as f64) / rate;
                        tokio::time::sleep_until((t0 + Duration::from_secs_f64(at)).into()).await;
                    }
                    let t = Instant::now();
                    s.advance(ClockDone {
                        examples: 1,
                        compute: Some(Duration::from_micros(100)),
                        ..Default::default()
                    })
                    .await?;
                    lat.push(t.elapsed());
                }
                anyhow::Ok(lat)
            })
        })
        .collect();
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await??);
    }
    let wall = t0.elapsed();
    let cpu = sched.cpu_seconds()? - cpu0;
    lat.sort_unstable();
    let st = clients[0].job("bench").await?;
    let stale = st.staleness;
    let n = lat.len() as f64;
    println!(
        "{} workers, SSP({}), {}, {} advances in {:.2} s over {} connections",
        a.workers,
        a.staleness,
        if a.rate > 0.0 {
            format!("paced at {:.0} advances/s", a.rate)
        } else {
            "closed loop".into()
        },
        lat.len(),
        wall.as_secs_f64(),
        a.connections
    );
    println!(
        "advance latency: p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms",
        pct(&lat, 0.5).as_secs_f64() * 1e3,
        pct(&lat, 0.99).as_secs_f64() * 1e3,
        lat.last().copied().unwrap_or_default().as_secs_f64() * 1e3
    );
    println!(
        "throughput: {:.0} advances/s; scheduler CPU {:.1} µs per advance ({:.2} cores busy)",
        n / wall.as_secs_f64(),
        cpu / n * 1e6,
        cpu / wall.as_secs_f64()
    );
    println!(
        "policy waits: {:.1} ms in total, p99 {:.3} ms; max clock gap {} (bound {})",
        stale.wait_ms_total, stale.wait_ms_p99, stale.max_gap, a.staleness
    );
    Ok(())
}
