//! The shard's metric names, in one place.

use std::time::Duration;

use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram};

/// Describes every metric (for HELP lines); call once at start-up.
pub fn describe() {
    describe_counter!(
        "ps_push_requests_total",
        "Pushes by table, kind and outcome (applied, duplicate, error)."
    );
    describe_counter!("ps_push_values_total", "Gradient values applied, by table.");
    describe_counter!(
        "ps_bulk_push_bodies_total",
        "Push bodies read from the bulk stream, by where they went: into the push log's body \
         ring (received once, logged in place) or into memory (copied into the log)."
    );
    describe_counter!(
        "ps_sparse_rows_total",
        "Sparse rows stored (outcome admitted), and pushes of an id not yet stored held back by admission (outcome held_back), by table."
    );
    describe_counter!(
        "ps_push_skipped_non_finite_total",
        "Rows or chunks skipped for NaN or infinity, by table."
    );
    describe_counter!("ps_pull_requests_total", "Pulls by table and kind.");
    describe_counter!(
        "ps_wire_bytes_total",
        "Payload bytes received (push) and sent (pull), by table and encoding."
    );
    describe_counter!(
        "ps_wire_payloads_total",
        "Payloads received (push) and sent (pull), by table and encoding."
    );
    describe_counter!("ps_pull_values_total", "Values served by pulls, by table.");
    describe_counter!(
        "ps_request_errors_total",
        "Requests refused, by method and gRPC code."
    );
    describe_histogram!("ps_group_commit_size", "Pushes made durable by one write.");
    describe_counter!(
        "ps_pushes_inline_total",
        "Dense pushes committed from the combining queue (the writer thread idle when they \
         came), without a hand-off to the writer."
    );
    describe_histogram!(
        "ps_group_commit_bytes",
        "Bytes of one group-commit write batch."
    );
    describe_histogram!(
        "ps_apply_seconds",
        "Time to apply one group of pushes to the hot layer."
    );
    describe_histogram!(
        "ps_dense_snapshot_seconds",
        "Time to write every dense cell into the store, freeing the push log."
    );
    describe_counter!(
        "ps_dense_snapshot_bytes_total",
        "Bytes of dense cells written by snapshots of the push log."
    );
    describe_histogram!(
        "ps_dense_image_seconds",
        "Time to write an image of every dense cell into the push log, freeing the records \
         before it."
    );
    describe_counter!(
        "ps_dense_image_bytes_total",
        "Bytes of dense-cell images written into the push log."
    );
    describe_histogram!(
        "ps_rows_write_back_seconds",
        "Time to write one batch of dirty sparse rows back into the store (the log needed \
         their room, the cache evicted them, a checkpoint or a stop)."
    );
    describe_counter!(
        "ps_rows_written_back_total",
        "Dirty sparse rows written back into the store."
    );
    describe_counter!(
        "ps_rows_written_back_bytes_total",
        "Bytes of the batches that wrote dirty sparse rows back."
    );
    describe_counter!(
        "ps_rows_relogged_total",
        "Dirty sparse rows still being updated written into the push log as images, instead of \
         back into the store, when the log needed the room their older updates took."
    );
    describe_counter!(
        "ps_rows_relogged_bytes_total",
        "Bytes of the push-log records holding relogged sparse rows."
    );
    describe_gauge!(
        "ps_sparse_rows_dirty",
        "Sparse rows updated in memory and in the log whose latest updates the store lacks \
         (written back later)."
    );
    describe_gauge!(
        "ps_sparse_rows_pending",
        "Sparse rows a restart found updates of in the log, not yet brought up to date."
    );
    describe_counter!(
        "ps_bulk_connections_total",
        "Connections accepted on the bulk stream."
    );
    describe_histogram!(
        "ps_store_write_seconds",
        "Time of one durable write (WAL, and fsync with --sync)."
    );
    describe_counter!(
        "ps_store_row_reads_total",
        "Sparse rows missing from memory looked up in the store (a table none of whose rows \
         has left memory answers misses without it)."
    );
    // The families without labels exist from start-up.
    for h in [
        "ps_group_commit_size",
        "ps_group_commit_bytes",
        "ps_apply_seconds",
        "ps_store_write_seconds",
        "ps_dense_snapshot_seconds",
        "ps_dense_image_seconds",
        "ps_rows_write_back_seconds",
    ] {
        let _ = histogram!(h);
    }
    rows_state(0, 0);
    for c in [
        "ps_dense_snapshot_bytes_total",
        "ps_dense_image_bytes_total",
        "ps_rows_written_back_total",
        "ps_rows_written_back_bytes_total",
        "ps_rows_relogged_total",
        "ps_rows_relogged_bytes_total",
        "ps_bulk_connections_total",
        "ps_store_row_reads_total",
        "ps_pushes_inline_total",
    ] {
        counter!(c).absolute(0);
    }
}

/// `n` sparse rows looked up in the store.
pub fn store_row_reads(n: u64) {
    counter!("ps_store_row_reads_total").increment(n);
}

/// A table this shard serves (created, or loaded at start-up): its series exist from now, with
/// zeros.
pub fn table_loaded(spec: &ps_core::TableSpec) {
    let table = spec.name.as_str().to_owned();
    let kind = match spec.kind {
        ps_core::TableKind::Dense(_) => "dense",
        ps_core::TableKind::Sparse { .. } => "sparse",
    };
    for outcome in ["applied", "duplicate", "error"] {
        counter!("ps_push_requests_total", "table" => table.clone(), "kind" => kind, "outcome" => outcome)
            .increment(0);
    }
    counter!("ps_push_values_total", "table" => table.clone()).increment(0);
    counter!("ps_push_skipped_non_finite_total", "table" => table.clone()).increment(0);
    counter!("ps_pull_requests_total", "table" => table.clone(), "kind" => kind).increment(0);
    if kind == "sparse" {
        for outcome in ["admitted", "held_back"] {
            counter!("ps_sparse_rows_total", "table" => table.clone(), "outcome" => outcome)
                .increment(0);
        }
        counter!("ps_pull_rows_unchanged_total", "table" => table.clone()).increment(0);
    }
    counter!("ps_pull_values_total", "table" => table).increment(0);
}

/// Counts sparse rows a push stored, and ids it held back for admission.
pub fn rows_admission(table: &str, admitted: u64, held_back: u64) {
    counter!("ps_sparse_rows_total", "table" => table.to_owned(), "outcome" => "admitted")
        .increment(admitted);
    counter!("ps_sparse_rows_total", "table" => table.to_owned(), "outcome" => "held_back")
        .increment(held_back);
}

/// Counts rows a sparse table evicted: by age (`expired`) or past its row cap (`capped`).
pub fn rows_evicted(table: &str, expired: u64, capped: u64) {
    counter!("ps_sparse_rows_total", "table" => table.to_owned(), "outcome" => "expired")
        .increment(expired);
    counter!("ps_sparse_rows_total", "table" => table.to_owned(), "outcome" => "capped")
        .increment(capped);
}

/// Counts a push the writer answered: applied or a duplicate, with its values.
pub fn push_done(table: &str, kind: &'static str, duplicate: bool, applied: u64, skipped: u64) {
    let outcome = if duplicate { "duplicate" } else { "applied" };
    counter!("ps_push_requests_total", "table" => table.to_owned(), "kind" => kind, "outcome" => outcome)
        .increment(1);
    counter!("ps_push_values_total", "table" => table.to_owned()).increment(applied);
    counter!("ps_push_skipped_non_finite_total", "table" => table.to_owned()).increment(skipped);
}

/// Counts a push the writer could not apply.
pub fn push_failed(table: &str, kind: &'static str) {
    counter!("ps_push_requests_total", "table" => table.to_owned(), "kind" => kind, "outcome" => "error")
        .increment(1);
}

pub fn pulled(table: &str, kind: &'static str, values: u64) {
    counter!("ps_pull_requests_total", "table" => table.to_owned(), "kind" => kind).increment(1);
    counter!("ps_pull_values_total", "table" => table.to_owned()).increment(values);
}

/// `n` rows of a sparse pull answered as unchanged since the client's copy (not sent).
pub fn pull_rows_unchanged(table: &str, n: u64) {
    counter!("ps_pull_rows_unchanged_total", "table" => table.to_owned()).increment(n);
}

pub fn wire_bytes(direction: &'static str, table: &str, encoding: ps_core::Encoding, bytes: usize) {
    let labels = [
        ("direction", direction.to_owned()),
        ("table", table.to_owned()),
        ("encoding", encoding.name().to_owned()),
    ];
    counter!("ps_wire_bytes_total", &labels).increment(bytes as u64);
    counter!("ps_wire_payloads_total", &labels).increment(1);
}

pub fn request_error(method: &'static str, code: tonic::Code) {
    counter!("ps_request_errors_total", "method" => method, "code" => format!("{code:?}"))
        .increment(1);
}

pub fn pushes_inline(n: usize) {
    counter!("ps_pushes_inline_total").increment(n as u64);
}

pub fn group_commit(pushes: usize, bytes: usize, apply: Duration, write: Duration) {
    histogram!("ps_group_commit_size").record(pushes as f64);
    histogram!("ps_group_commit_bytes").record(bytes as f64);
    histogram!("ps_apply_seconds").record(apply.as_secs_f64());
    histogram!("ps_store_write_seconds").record(write.as_secs_f64());
}

pub fn dense_snapshot(bytes: usize, took: Duration) {
    counter!("ps_dense_snapshot_bytes_total").increment(bytes as u64);
    histogram!("ps_dense_snapshot_seconds").record(took.as_secs_f64());
}

pub fn dense_image(bytes: u64, took: Duration) {
    counter!("ps_dense_image_bytes_total").increment(bytes);
    histogram!("ps_dense_image_seconds").record(took.as_secs_f64());
}

pub fn rows_written_back(rows: usize, bytes: usize, took: Duration) {
    counter!("ps_rows_written_back_total").increment(rows as u64);
    counter!("ps_rows_written_back_bytes_total").increment(bytes as u64);
    histogram!("ps_rows_write_back_seconds").record(took.as_secs_f64());
}

pub fn rows_relogged(rows: usize, bytes: u64) {
    counter!("ps_rows_relogged_total").increment(rows as u64);
    counter!("ps_rows_relogged_bytes_total").increment(bytes);
}

/// The sparse rows dirty in memory, and pending since a restart.
pub fn rows_state(dirty: u64, pending: u64) {
    gauge!("ps_sparse_rows_dirty").set(dirty as f64);
    gauge!("ps_sparse_rows_pending").set(pending as f64);
}

/// A push body read from the bulk stream: into the push log's body ring, or into memory.
pub fn bulk_body(into_ring: bool) {
    let into = if into_ring { "ring" } else { "memory" };
    counter!("ps_bulk_push_bodies_total", "into" => into).increment(1);
}

pub fn bulk_connection() {
    counter!("ps_bulk_connections_total").increment(1);
}
