//! The worker's metric names, in one place: what a training step spends its time on, how fast
//! examples go through, the loss and accuracy, and what the pushes cost on the wire. Every
//! series carries `ps_job` and `worker`, and exists with zeros from start-up.

use std::time::Duration;

use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram};

/// The parts of a step, as `phase` of `ps_worker_step_seconds`.
pub const PHASES: [&str; 6] = ["pull", "data", "compute", "encode", "push", "wait"];

/// Where one step's time went.
#[derive(Debug, Clone, Copy, Default)]
pub struct StepTimes {
    /// Pulling dense tables and sparse rows.
    pub pull: Duration,
    /// Waiting for the prefetch thread's batch.
    pub data: Duration,
    /// Forward and backward (with any emulated slowness).
    pub compute: Duration,
    /// Encoding the gradients (codec and error feedback).
    pub encode: Duration,
    /// Sending the pushes, encoding aside.
    pub push: Duration,
    /// Waiting for the scheduler to grant the next clock.
    pub wait: Duration,
}

impl StepTimes {
    fn by_phase(&self) -> [Duration; 6] {
        [
            self.pull,
            self.data,
            self.compute,
            self.encode,
            self.push,
            self.wait,
        ]
    }
}

/// One step's figures.
#[derive(Debug, Clone, Copy)]
pub struct StepFigures {
    pub clock: u64,
    pub examples: usize,
    /// Mean loss over the batch.
    pub loss: f64,
    pub accuracy: f64,
    pub wire_bytes: u64,
    pub raw_bytes: u64,
    /// What the step's pulls brought, on the wire and as f32.
    pub pull_wire_bytes: u64,
    pub pull_raw_bytes: u64,
    /// Rows holding a residual now, and rows that gave theirs up over the run (every sparse
    /// table together).
    pub row_residuals: (usize, u64),
    pub times: StepTimes,
}

/// The worker's series, labelled once.
#[derive(Debug, Clone)]
pub struct WorkerMetrics {
    labels: [(&'static str, String); 2],
}

impl WorkerMetrics {
    /// Describes every family and registers this worker's series with zeros.
    pub fn new(job: &str, worker: &str) -> Self {
        describe_histogram!(
            "ps_worker_step_seconds",
            "Time of each part of a training step (phase: pull, data, compute, encode, push, wait)."
        );
        describe_counter!("ps_worker_steps_total", "Training steps done.");
        describe_counter!("ps_worker_examples_total", "Training examples computed.");
        describe_gauge!(
            "ps_worker_examples_per_second",
            "Examples per second over the last step, waits included."
        );
        describe_gauge!(
            "ps_worker_loss",
            "Mean training loss of the last step's batch."
        );
        describe_gauge!(
            "ps_worker_train_accuracy",
            "Accuracy on the last step's batch."
        );
        describe_gauge!(
            "ps_worker_test_accuracy",
            "Test accuracy at the last evaluation (evaluating workers only)."
        );
        describe_gauge!("ps_worker_test_loss", "Test loss at the last evaluation.");
        describe_gauge!("ps_worker_clock", "The last clock this worker finished.");
        describe_counter!(
            "ps_worker_push_wire_bytes_total",
            "Bytes the worker's pushes put on the wire (after compression)."
        );
        describe_counter!(
            "ps_worker_push_raw_bytes_total",
            "Bytes the worker's pushes would be as plain f32."
        );
        describe_counter!(
            "ps_worker_pull_wire_bytes_total",
            "Bytes the worker's training pulls took on the wire (after the pull codec)."
        );
        describe_counter!(
            "ps_worker_pull_raw_bytes_total",
            "Bytes the worker's training pulls would be as plain f32."
        );
        describe_gauge!(
            "ps_worker_step_wire_bytes",
            "Bytes the last step's pushes put on the wire."
        );
        describe_gauge!(
            "ps_worker_compression_ratio",
            "Plain f32 bytes over wire bytes of the last step's pushes (1: uncompressed)."
        );
        describe_gauge!(
            "ps_worker_row_residual_rows",
            "Embedding rows holding an error-feedback residual (lossy codecs; bounded by --row-residual-mib per table)."
        );
        describe_counter!(
            "ps_worker_row_residuals_evicted_total",
            "Embedding rows whose residual was dropped to make room for another row's."
        );
        let m = Self {
            labels: [("ps_job", job.to_owned()), ("worker", worker.to_owned())],
        };
        for phase in PHASES {
            let _ = histogram!("ps_worker_step_seconds", &m.with_phase(phase));
        }
        for name in [
            "ps_worker_steps_total",
            "ps_worker_examples_total",
            "ps_worker_push_wire_bytes_total",
            "ps_worker_push_raw_bytes_total",
            "ps_worker_pull_wire_bytes_total",
            "ps_worker_pull_raw_bytes_total",
            "ps_worker_row_residuals_evicted_total",
        ] {
            counter!(name, &m.labels).absolute(0);
        }
        for name in [
            "ps_worker_examples_per_second",
            "ps_worker_loss",
            "ps_worker_train_accuracy",
            "ps_worker_test_accuracy",
            "ps_worker_test_loss",
            "ps_worker_clock",
            "ps_worker_step_wire_bytes",
            "ps_worker_row_residual_rows",
        ] {
            gauge!(name, &m.labels).set(0.0);
        }
        gauge!("ps_worker_compression_ratio", &m.labels).set(1.0);
        m
    }

    fn with_phase(&self, phase: &'static str) -> [(&'static str, String); 3] {
        let [a, b] = self.labels.clone();
        [a, b, ("phase", phase.to_owned())]
    }

    pub fn step(&self, f: &StepFigures) {
        let l = &self.labels;
        let times = f.times.by_phase();
        for (phase, t) in PHASES.into_iter().zip(times) {
            histogram!("ps_worker_step_seconds", &self.with_phase(phase)).record(t.as_secs_f64());
        }
        let total: Duration = times.iter().sum();
        counter!("ps_worker_steps_total", l).increment(1);
        counter!("ps_worker_examples_total", l).increment(f.examples as u64);
        if !total.is_zero() {
            gauge!("ps_worker_examples_per_second", l).set(f.examples as f64 / total.as_secs_f64());
        }
        gauge!("ps_worker_loss", l).set(f.loss);
        gauge!("ps_worker_train_accuracy", l).set(f.accuracy);
        gauge!("ps_worker_clock", l).set(f.clock as f64);
        counter!("ps_worker_push_wire_bytes_total", l).increment(f.wire_bytes);
        counter!("ps_worker_push_raw_bytes_total", l).increment(f.raw_bytes);
        counter!("ps_worker_pull_wire_bytes_total", l).increment(f.pull_wire_bytes);
        counter!("ps_worker_pull_raw_bytes_total", l).increment(f.pull_raw_bytes);
        gauge!("ps_worker_row_residual_rows", l).set(f.row_residuals.0 as f64);
        counter!("ps_worker_row_residuals_evicted_total", l).absolute(f.row_residuals.1);
        gauge!("ps_worker_step_wire_bytes", l).set(f.wire_bytes as f64);
        if f.wire_bytes > 0 {
            gauge!("ps_worker_compression_ratio", l).set(f.raw_bytes as f64 / f.wire_bytes as f64);
        }
    }

    pub fn evaluated(&self, test_accuracy: f64, test_loss: f64) {
        gauge!("ps_worker_test_accuracy", &self.labels).set(test_accuracy);
        gauge!("ps_worker_test_loss", &self.labels).set(test_loss);
    }
}
