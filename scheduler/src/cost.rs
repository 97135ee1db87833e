//! What a job costs: its workers' CPU time (each worker reports its process's total with its
//! clocks), the shards' CPU time and payload bytes for the job's tables (from the shards'
//! statistics, polled by the ticker), the bytes its tables hold now, and its wall time. Pure: no
//! I/O.
//!
//! Reports and statistics are running totals of a process, so the meter adds what each grew by
//! since it was last seen; a total that went down is a process that restarted, and counts from
//! zero. A job restored after a scheduler restart has seen nothing yet: the first figure of each
//! worker and shard table is a baseline, not an increase (what ran between the last save and the
//! restart is not counted).

use std::cell::Cell;
use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ps_core::status::{JobCost, TableStats};
use serde::{Deserialize, Serialize};

use crate::policy::WorkerId;

/// The saved part of a job's cost.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct SavedCost {
    pub worker_cpu_seconds: f64,
    pub shard_cpu_seconds: f64,
    pub bytes_moved: u64,
    pub bytes_stored: u64,
    pub started_unix_ms: u64,
    pub ended_unix_ms: Option<u64>,
}

/// A shard table's running totals, as last seen.
#[derive(Debug, Clone, Copy, Default)]
struct Seen {
    cpu_seconds: f64,
    bytes: u64,
}

#[derive(Debug)]
pub struct CostMeter {
    saved: SavedCost,
    /// When the job was first seen ended (by a status read or the ticker's, within a second
    /// of it): every later read gives the same wall time.
    ended: Cell<Option<u64>>,
    /// Whether figures seen for the first time count whole (a job this process started) or
    /// only as a baseline (a job restored after a restart).
    fresh: bool,
    workers: HashMap<WorkerId, Duration>,
    tables: HashMap<(u32, String), Seen>,
}

pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl CostMeter {
    /// The meter of a job submitted now.
    pub fn submitted_now() -> Self {
        Self::with(
            SavedCost {
                started_unix_ms: unix_ms(),
                ..SavedCost::default()
            },
            true,
        )
    }

    /// The meter of a job restored from its saved cost.
    pub fn restore(saved: SavedCost) -> Self {
        Self::with(saved, false)
    }

    fn with(saved: SavedCost, fresh: bool) -> Self {
        Self {
            ended: Cell::new(saved.ended_unix_ms),
            saved,
            fresh,
            workers: HashMap::new(),
            tables: HashMap::new(),
        }
    }

    pub fn save(&self) -> SavedCost {
        SavedCost {
            ended_unix_ms: self.ended.get(),
            ..self.saved
        }
    }

    /// A worker's process has used `cpu` so far.
    pub fn worker_cpu(&mut self, id: WorkerId, cpu: Duration) {
        if cpu.is_zero() {
            return;
        }
        let grew = match self.workers.insert(id, cpu) {
            Some(before) if cpu >= before => cpu - before,
            // A new process under the same worker id.
            Some(_) => cpu,
            None if self.fresh => cpu,
            None => Duration::ZERO,
        };
        self.saved.worker_cpu_seconds += grew.as_secs_f64();
    }

    /// Shard `shard`'s statistics of the job's tables: adds what their CPU time and bytes grew
    /// by.
    pub fn shard_tables(&mut self, shard: u32, tables: &[&TableStats]) {
        for t in tables {
            // A shard's figure is not trusted to be a number.
            let cpu = t.cpu_seconds;
            let now = Seen {
                cpu_seconds: if cpu.is_finite() && cpu >= 0.0 {
                    cpu
                } else {
                    0.0
                },
                bytes: t.bytes_received.saturating_add(t.bytes_sent),
            };
            let (cpu, bytes) = match self.tables.insert((shard, t.name.clone()), now) {
                Some(b) if now.cpu_seconds >= b.cpu_seconds && now.bytes >= b.bytes => {
                    (now.cpu_seconds - b.cpu_seconds, now.bytes - b.bytes)
                }
                // The shard restarted: its totals count from zero.
                Some(_) => (now.cpu_seconds, now.bytes),
                None if self.fresh => (now.cpu_seconds, now.bytes),
                None => (0.0, 0),
            };
            self.saved.shard_cpu_seconds += cpu;
            self.saved.bytes_moved = self.saved.bytes_moved.saturating_add(bytes);
        }
    }

    /// The bytes the job's tables take on all shards now.
    pub fn stored(&mut self, bytes: u64) {
        self.saved.bytes_stored = bytes;
    }

    /// The cost so far; the wall time stops at the first call that says the job has `ended`.
    pub fn cost(&self, ended: bool) -> JobCost {
        let end = match self.ended.get() {
            Some(t) => t,
            None if ended => {
                let t = unix_ms();
                self.ended.set(Some(t));
                t
            }
            None => unix_ms(),
        };
        JobCost {
            wall_seconds: end.saturating_sub(self.saved.started_unix_ms) as f64 / 1e3,
            worker_cpu_seconds: self.saved.worker_cpu_seconds,
            shard_cpu_seconds: self.saved.shard_cpu_seconds,
            bytes_moved: self.saved.bytes_moved,
            bytes_stored: self.saved.bytes_stored,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(name: &str, cpu: f64, received: u64, sent: u64, memory: u64) -> TableStats {
        TableStats {
            name: name.into(),
            cpu_seconds: cpu,
            bytes_received: received,
            bytes_sent: sent,
            memory_bytes: memory,
            ..TableStats::default()
        }
    }

    #[test]
    fn growth_is_added_and_a_restarted_process_counts_from_zero() {
        let mut m = CostMeter::submitted_now();
        m.worker_cpu(1, Duration::from_secs(2));
        m.worker_cpu(1, Duration::from_secs(5));
        m.worker_cpu(2, Duration::from_secs(1));
        // Worker 1 restarted: 1 s of a new process.
        m.worker_cpu(1, Duration::from_secs(1));
        assert_eq!(m.cost(false).worker_cpu_seconds, 7.0);

        m.shard_tables(0, &[&table("j/w", 1.0, 100, 50, 8)]);
        m.shard_tables(1, &[&table("j/w", 0.5, 10, 0, 8)]);
        m.shard_tables(0, &[&table("j/w", 1.5, 300, 50, 8)]);
        // Shard 1 restarted.
        m.shard_tables(1, &[&table("j/w", 0.25, 5, 5, 8)]);
        let c = m.cost(false);
        assert_eq!(c.shard_cpu_seconds, 2.25);
        assert_eq!(c.bytes_moved, 150 + 10 + 200 + 10);
        // Nonsense from a shard counts as nothing, and the totals stay numbers.
        m.shard_tables(2, &[&table("j/w", f64::NAN, 0, 0, 8)]);
        m.shard_tables(2, &[&table("j/w", f64::INFINITY, 0, 0, 8)]);
        m.shard_tables(2, &[&table("j/w", -1.0, 0, 0, 8)]);
        assert_eq!(m.cost(false).shard_cpu_seconds, 2.25);
    }

    #[test]
    fn a_restored_job_takes_first_figures_as_a_baseline() {
        let mut m = CostMeter::restore(SavedCost {
            worker_cpu_seconds: 10.0,
            shard_cpu_seconds: 1.0,
            bytes_moved: 1000,
            started_unix_ms: unix_ms() - 5000,
            ..SavedCost::default()
        });
        m.worker_cpu(1, Duration::from_secs(30));
        m.shard_tables(0, &[&table("j/w", 4.0, 500, 500, 8)]);
        assert_eq!(m.cost(false).worker_cpu_seconds, 10.0);
        assert_eq!(m.cost(false).bytes_moved, 1000);
        m.worker_cpu(1, Duration::from_secs(31));
        m.shard_tables(0, &[&table("j/w", 4.5, 600, 500, 8)]);
        let c = m.cost(false);
        assert_eq!(
            (c.worker_cpu_seconds, c.shard_cpu_seconds, c.bytes_moved),
            (11.0, 1.5, 1100)
        );
        assert!(c.wall_seconds >= 5.0);
        let ended = m.cost(true).wall_seconds;
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(
            m.cost(false).wall_seconds,
            ended,
            "the clock stops at the end"
        );
        assert_eq!(CostMeter::restore(m.save()).cost(false).wall_seconds, ended);
    }
}
