//! The link emulator's own cost: transfers of a few sizes through one [`ps_client::Link`], one
//! after another and from several tasks at once, timed against what the link's speed alone
//! allows. Whatever the emulator adds beyond that is added to every request and answer of a
//! run with `--link-mbps`, for every codec alike, and hides what compression saves.
//!
//! `cargo run --release --bin link-bench -- --mbps 1000` (one JSON line per transfer size)

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use ps_bench::pct;
use ps_client::Link;
use ps_runtime::metrics::cpu_seconds;

#[derive(Debug, Parser)]
struct Args {
    /// The link's speed, megabits per second each way.
    #[arg(long, default_value_t = 1000.0)]
    mbps: f64,
    /// Transfer sizes in bytes (repeatable).
    #[arg(long = "bytes", default_values_t = [3_000u64, 12_000, 60_000, 300_000])]
    bytes: Vec<u64>,
    /// Transfers timed per size and task.
    #[arg(long, default_value_t = 1000)]
    transfers: usize,
    /// Tasks sending at once through the one link (as a worker's requests to several shards
    /// do); each transfer then queues behind the others'.
    #[arg(long, default_value_t = 2)]
    tasks: usize,
}

/// Each transfer's time, one task sending after another, shortest first.
async fn one_task(link: &Link, bytes: u64, n: usize) -> Vec<Duration> {
    let mut took = Vec::with_capacity(n);
    for _ in 0..n {
        let t0 = Instant::now();
        link.send(bytes).await;
        took.push(t0.elapsed());
    }
    took.sort();
    took
}

/// Microseconds, to the nanosecond.
fn us(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e9).round() / 1e3
}

/// One JSON line per transfer size: the link's time for it; one task's transfers: the
/// shortest, the time added beyond the link's at the median, 99th percentile and on average,
/// and the CPU time a transfer took (the process's, both threads); `tasks` at once: the mean
/// time a transfer (the link carries them in turn) and what that adds.
#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    anyhow::ensure!(
        a.mbps > 0.0 && a.mbps.is_finite() && a.transfers > 0 && a.tasks > 0,
        "--mbps, --transfers and --tasks must be positive"
    );
    for &bytes in &a.bytes {
        let link = Arc::new(Link::mbps(a.mbps));
        let ideal = link.time_of(bytes);
        let cpu0 = cpu_seconds();
        let took = one_task(&link, bytes, a.transfers).await;
        let cpu = Duration::from_secs_f64((cpu_seconds() - cpu0).max(0.0)) / a.transfers as u32;
        let added: Vec<Duration> = took.iter().map(|t| t.saturating_sub(ideal)).collect();
        let mean = added.iter().sum::<Duration>() / added.len() as u32;
        let t0 = Instant::now();
        let tasks: Vec<_> = (0..a.tasks)
            .map(|_| {
                let link = link.clone();
                let n = a.transfers;
                tokio::spawn(async move {
                    for _ in 0..n {
                        link.send(bytes).await;
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await?;
        }
        let per = t0.elapsed() / (a.tasks * a.transfers) as u32;
        println!(
            "{}",
            serde_json::json!({
                "mbps": a.mbps,
                "bytes": bytes,
                "transfers": a.transfers,
                "link_us": us(ideal),
                "shortest_us": us(took[0]),
                "added_p50_us": us(pct(&added, 0.5)),
                "added_p99_us": us(pct(&added, 0.99)),
                "added_mean_us": us(mean),
                "cpu_us": us(cpu),
                "tasks": a.tasks,
                "tasks_per_transfer_us": us(per),
                "tasks_added_us": us(per.saturating_sub(ideal)),
            })
        );
    }
    Ok(())
}
