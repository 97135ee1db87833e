//! The scheduler's metric names, in one place.

use std::time::Duration;

use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram};

/// Describes every metric (for HELP lines); call once at start-up.
pub fn describe() {
    describe_histogram!(
        "ps_sched_clock_gap_size",
        "Clocks a worker was ahead of the slowest live worker when it was granted a clock, by job and worker."
    );
    describe_histogram!(
        "ps_sched_wait_seconds",
        "Time a worker waited for the consistency model before a clock was granted, by job and worker."
    );
    describe_histogram!(
        "ps_sched_param_age_seconds",
        "Age of the parameters a clock trained on (pull to push), as workers report it, by job."
    );
    describe_counter!("ps_sched_clock_advances_total", "Clocks granted, by job.");
    describe_gauge!(
        "ps_sched_min_clock",
        "Smallest clock of a live worker, by job."
    );
    describe_gauge!("ps_sched_live_workers", "Live workers, by job.");
    describe_gauge!("ps_sched_map_epoch", "Current shard-map epoch.");
    describe_counter!(
        "ps_sched_checkpoints_total",
        "Coordinated checkpoints, by job and outcome."
    );
}

pub fn granted(job: &str, worker: u64, gap: u64, waited: Duration) {
    let job = job.to_owned();
    let worker = worker.to_string();
    counter!("ps_sched_clock_advances_total", "job" => job.clone()).increment(1);
    histogram!("ps_sched_clock_gap_size", "job" => job.clone(), "worker" => worker.clone())
        .record(gap as f64);
    histogram!("ps_sched_wait_seconds", "job" => job, "worker" => worker)
        .record(waited.as_secs_f64());
}

pub fn param_age(job: &str, age: Duration) {
    histogram!("ps_sched_param_age_seconds", "job" => job.to_owned()).record(age.as_secs_f64());
}

pub fn min_clock(job: &str, clock: u64) {
    gauge!("ps_sched_min_clock", "job" => job.to_owned()).set(clock as f64);
}

pub fn live_workers(job: &str, n: usize) {
    gauge!("ps_sched_live_workers", "job" => job.to_owned()).set(n as f64);
}

pub fn map_epoch(epoch: u64) {
    gauge!("ps_sched_map_epoch").set(epoch as f64);
}

pub fn checkpoint(job: &str, ok: bool) {
    let outcome = if ok { "ok" } else { "error" };
    counter!("ps_sched_checkpoints_total", "job" => job.to_owned(), "outcome" => outcome)
        .increment(1);
}
