//! How `psctl` shows what the scheduler reports: tables for people, JSON for scripts.

use std::io::Write as _;

use ps_core::status::{JobCheckpoint, JobStatus};

/// `println!` for psctl's output: a reader that went away (`psctl status | head`) ends psctl
/// quietly, as a closed pipe ends other command-line tools, instead of a panic.
#[macro_export]
macro_rules! outln {
    ($($t:tt)*) => {
        $crate::print::line(format_args!($($t)*))
    };
}

/// Writes one line to stdout (see [`outln!`]).
pub fn line(args: std::fmt::Arguments<'_>) {
    if let Err(e) = writeln!(std::io::stdout().lock(), "{args}") {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("psctl: writing the output: {e}");
        std::process::exit(1);
    }
}

/// A job, its figures and its members, as a table.
pub fn print_job(j: &JobStatus) {
    let st = &j.staleness;
    outln!(
        "job {}  {}  {}  shards {}  map epoch {}",
        j.spec.name,
        j.state,
        j.spec.consistency,
        j.spec.num_shards,
        j.map_epoch
    );
    if !j.message.is_empty() {
        outln!("  {}", j.message);
    }
    outln!(
        "  clocks {}..{}  {:.1} advances/s  gap max {} mean {:.2}  wait total {:.0} ms p99 {:.2} ms  param age {:.1} ms",
        j.min_clock,
        j.max_clock,
        j.advances_per_sec,
        st.max_gap,
        st.mean_gap,
        st.wait_ms_total,
        st.wait_ms_p99,
        st.param_age_ms_mean
    );
    if let Some(c) = &j.latest_checkpoint {
        outln!("  latest checkpoint {c}");
    }
    let c = &j.cost;
    outln!(
        "  cost  wall {:.1} s  CPU {:.1} s (workers {:.1}, shards {:.1})  moved {}  stored {}",
        c.wall_seconds,
        c.worker_cpu_seconds + c.shard_cpu_seconds,
        c.worker_cpu_seconds,
        c.shard_cpu_seconds,
        bytes(c.bytes_moved),
        bytes(c.bytes_stored)
    );
    outln!(
        "  {:>6} {:<16} {:<5} {:>7} {:>5} {:>6} {:>10} {:>7} {:>9} {:<12}",
        "ID",
        "NAME",
        "LIVE",
        "CLOCK",
        "GAP",
        "BATCH",
        "EX/S",
        "MAXGAP",
        "WAIT MS",
        "DATA"
    );
    for w in &j.workers {
        outln!(
            "  {:>6} {:<16} {:<5} {:>7} {:>5} {:>6} {:>10.0} {:>7} {:>9.1} {:<12}",
            w.worker_id,
            w.name,
            if w.live { "yes" } else { "no" },
            w.clock,
            if w.live {
                w.clock - j.min_clock.min(w.clock)
            } else {
                0
            },
            w.batch_size,
            w.examples_per_sec,
            w.staleness.max_gap,
            w.staleness.wait_ms_total,
            format!("{:?}", w.data_shards)
        );
    }
}

/// A job for scripts (`psctl --json status`).
pub fn job_json(j: &JobStatus) -> serde_json::Value {
    serde_json::json!({
        "job": j.spec.name,
        "state": j.state.name(),
        "message": j.message,
        "consistency": j.spec.consistency.to_string(),
        "min_clock": j.min_clock,
        "max_clock": j.max_clock,
        "map_epoch": j.map_epoch,
        "advances_per_sec": j.advances_per_sec,
        "latest_checkpoint": j.latest_checkpoint.clone().unwrap_or_default(),
        "staleness": j.staleness,
        "cost": j.cost,
        "workers": j.workers.iter().map(|w| serde_json::json!({
            "id": w.worker_id, "name": w.name, "live": w.live, "clock": w.clock,
            "data_shards": w.data_shards, "batch_size": w.batch_size,
            "examples_per_sec": w.examples_per_sec,
            "max_gap": w.staleness.max_gap,
        })).collect::<Vec<_>>(),
    })
}

/// A byte count in the largest binary unit that keeps it at or above 1.
fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

/// A checkpoint's manifest for scripts.
pub fn checkpoint_json(c: &JobCheckpoint) -> serde_json::Value {
    serde_json::json!({
        "job": c.job, "name": c.name, "clock": c.clock, "created_unix_ms": c.created_unix_ms,
        "map_epoch": c.map_epoch,
        "shards": c.shards.iter().map(|s| serde_json::json!({
            "shard": s.shard_index, "endpoint": s.endpoint, "name": s.name, "path": s.path,
            "files": s.files, "bytes": s.bytes, "sequence": s.sequence,
        })).collect::<Vec<_>>(),
    })
}

pub fn print_json(v: &serde_json::Value) {
    outln!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
}
