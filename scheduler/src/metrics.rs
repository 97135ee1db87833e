//! The scheduler's metric names, in one place.

use std::time::Duration;

use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram};

/// Describes every metric (for HELP lines); call once at start-up.
pub fn describe() {
    describe_histogram!(
        "ps_sched_clock_gap_size",
        "Clocks a worker was ahead of the slowest live worker when it was granted a clock, by ps_job and worker."
    );
    describe_histogram!(
        "ps_sched_wait_seconds",
        "Time a worker waited for the consistency model before a clock was granted, by ps_job and worker."
    );
    describe_histogram!(
        "ps_sched_param_age_seconds",
        "Age of the parameters a clock trained on (pull to push), as workers report it, by ps_job."
    );
    describe_counter!(
        "ps_sched_clock_advances_total",
        "Clocks granted, by ps_job."
    );
    describe_gauge!(
        "ps_sched_min_clock",
        "Smallest clock of a live worker, by ps_job."
    );
    describe_gauge!("ps_sched_live_workers", "Live workers, by ps_job.");
    describe_gauge!("ps_sched_map_epoch", "Current shard-map epoch.");
    describe_counter!(
        "ps_sched_checkpoints_total",
        "Coordinated checkpoints, by ps_job and outcome."
    );
    describe_gauge!(
        "ps_sched_job_state",
        "1 for the state a job is in (waiting, running, paused, succeeded, canceled, failed), 0 for the others, by ps_job and state."
    );
    describe_gauge!(
        "ps_sched_max_clock",
        "Largest clock of a live worker, by ps_job."
    );
    describe_gauge!(
        "ps_sched_target_clocks",
        "Clocks a job trains for (0: no limit), by ps_job."
    );
    describe_gauge!(
        "ps_sched_expected_workers",
        "Workers a job asks for, by ps_job."
    );
    describe_gauge!(
        "ps_sched_staleness_max",
        "Largest clock gap to the slowest worker at a grant so far, by ps_job."
    );
    describe_gauge!(
        "ps_sched_staleness_bound",
        "The consistency model's staleness bound (BSP 0, SSP s, ASP -1: none), by ps_job."
    );
    describe_gauge!(
        "ps_sched_advances_per_second",
        "Clocks granted per second lately, by ps_job."
    );
    describe_gauge!(
        "ps_sched_job_cpu_seconds",
        "CPU time a job has cost, by ps_job and side (workers: their processes; shards: the work on its tables)."
    );
    describe_gauge!(
        "ps_sched_job_bytes_moved",
        "Payload bytes of a job's pushes and pulls, as the shards received and sent them, by ps_job."
    );
    describe_gauge!(
        "ps_sched_job_bytes_stored",
        "Bytes a job's tables take on the shards now, by ps_job."
    );
    describe_gauge!(
        "ps_sched_job_wall_seconds",
        "Time from a job's submission to now or to its end, by ps_job."
    );
    describe_gauge!("ps_sched_shards_registered", "Shards registered now.");
    describe_gauge!(
        "ps_sched_shards_expected",
        "Shards the cluster is configured for."
    );
    map_epoch(0);
    shards(0, 0);
}

/// Every job's progress and state, and the shards', as the ticker sees them.
pub fn job(st: &ps_core::status::JobStatus) {
    use ps_core::status::JobState;
    let job = st.spec.name.clone();
    for s in [
        JobState::Waiting,
        JobState::Running,
        JobState::Paused,
        JobState::Succeeded,
        JobState::Canceled,
        JobState::Failed,
    ] {
        gauge!("ps_sched_job_state", "ps_job" => job.clone(), "state" => s.name())
            .set(if s == st.state { 1.0 } else { 0.0 });
    }
    min_clock(&job, st.min_clock);
    live_workers(&job, st.live().count());
    gauge!("ps_sched_max_clock", "ps_job" => job.clone()).set(st.max_clock as f64);
    gauge!("ps_sched_target_clocks", "ps_job" => job.clone()).set(st.spec.max_clocks as f64);
    gauge!("ps_sched_expected_workers", "ps_job" => job.clone())
        .set(f64::from(st.spec.num_workers));
    gauge!("ps_sched_staleness_max", "ps_job" => job.clone()).set(st.staleness.max_gap as f64);
    gauge!("ps_sched_staleness_bound", "ps_job" => job.clone())
        .set(st.spec.consistency.bound().map_or(-1.0, |b| b as f64));
    gauge!("ps_sched_advances_per_second", "ps_job" => job.clone()).set(st.advances_per_sec);
    let c = &st.cost;
    gauge!("ps_sched_job_cpu_seconds", "ps_job" => job.clone(), "side" => "workers")
        .set(c.worker_cpu_seconds);
    gauge!("ps_sched_job_cpu_seconds", "ps_job" => job.clone(), "side" => "shards")
        .set(c.shard_cpu_seconds);
    gauge!("ps_sched_job_bytes_moved", "ps_job" => job.clone()).set(c.bytes_moved as f64);
    gauge!("ps_sched_job_bytes_stored", "ps_job" => job.clone()).set(c.bytes_stored as f64);
    gauge!("ps_sched_job_wall_seconds", "ps_job" => job.clone()).set(c.wall_seconds);
    counter!("ps_sched_clock_advances_total", "ps_job" => job.clone()).increment(0);
    // The histograms exist once their labels do: the job's, and each member's.
    let _ = histogram!("ps_sched_param_age_seconds", "ps_job" => job.clone());
    for w in &st.workers {
        let worker = w.worker_id.to_string();
        let _ = histogram!("ps_sched_clock_gap_size", "ps_job" => job.clone(), "worker" => worker.clone());
        let _ = histogram!("ps_sched_wait_seconds", "ps_job" => job.clone(), "worker" => worker);
    }
    for outcome in ["ok", "error"] {
        counter!("ps_sched_checkpoints_total", "ps_job" => job.clone(), "outcome" => outcome)
            .increment(0);
    }
}

pub fn shards(registered: usize, expected: u32) {
    gauge!("ps_sched_shards_registered").set(registered as f64);
    gauge!("ps_sched_shards_expected").set(f64::from(expected));
}

pub fn granted(job: &str, worker: u64, gap: u64, waited: Duration) {
    let job = job.to_owned();
    let worker = worker.to_string();
    counter!("ps_sched_clock_advances_total", "ps_job" => job.clone()).increment(1);
    histogram!("ps_sched_clock_gap_size", "ps_job" => job.clone(), "worker" => worker.clone())
        .record(gap as f64);
    histogram!("ps_sched_wait_seconds", "ps_job" => job, "worker" => worker)
        .record(waited.as_secs_f64());
}

pub fn param_age(job: &str, age: Duration) {
    histogram!("ps_sched_param_age_seconds", "ps_job" => job.to_owned()).record(age.as_secs_f64());
}

pub fn min_clock(job: &str, clock: u64) {
    gauge!("ps_sched_min_clock", "ps_job" => job.to_owned()).set(clock as f64);
}

pub fn live_workers(job: &str, n: usize) {
    gauge!("ps_sched_live_workers", "ps_job" => job.to_owned()).set(n as f64);
}

pub fn map_epoch(epoch: u64) {
    gauge!("ps_sched_map_epoch").set(epoch as f64);
}

pub fn checkpoint(job: &str, ok: bool) {
    let outcome = if ok { "ok" } else { "error" };
    counter!("ps_sched_checkpoints_total", "ps_job" => job.to_owned(), "outcome" => outcome)
        .increment(1);
}
