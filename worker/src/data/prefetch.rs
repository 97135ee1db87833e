//! The prefetching reader: a thread that assembles the next batches into a bounded queue while
//! the trainer computes, so compute never waits on gathering or parsing.
//!
//! The trainer steers it through [`PrefetchControl`]: the batch size and the data shards the
//! scheduler assigned (both may change between clocks; at most `depth` batches already queued
//! use the old values).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use crossbeam_channel::{Receiver, bounded};
use parking_lot::Mutex;

use super::{Batch, Dataset, EpochOrder, ShardPlan};

#[derive(Debug)]
pub struct PrefetchControl {
    batch: AtomicUsize,
    shards: Mutex<Vec<u32>>,
    generation: AtomicU64,
    stop: AtomicBool,
}

impl PrefetchControl {
    /// Sets the batch size of the batches assembled from now on.
    pub fn set_batch(&self, n: usize) {
        self.batch.store(n.max(1), Ordering::Relaxed);
    }

    /// Sets the data shards to read; a change starts a walk over the new set.
    pub fn set_shards(&self, shards: &[u32]) {
        let mut s = self.shards.lock();
        if *s != shards {
            *s = shards.to_vec();
            self.generation.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Batches assembled on their own thread.
pub struct Prefetcher {
    rx: Receiver<Batch>,
    control: Arc<PrefetchControl>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for Prefetcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prefetcher")
            .field("queued", &self.rx.len())
            .finish()
    }
}

impl Prefetcher {
    /// Starts the reader over `data` cut by `plan`, reading `shards` in batches of `batch`,
    /// with `depth` batches queued ahead.
    pub fn start(
        data: Arc<dyn Dataset>,
        plan: ShardPlan,
        shards: &[u32],
        batch: usize,
        depth: usize,
        seed: u64,
    ) -> Self {
        let control = Arc::new(PrefetchControl {
            batch: AtomicUsize::new(batch.max(1)),
            shards: Mutex::new(shards.to_vec()),
            generation: AtomicU64::new(0),
            stop: AtomicBool::new(false),
        });
        let (tx, rx) = bounded(depth.max(1));
        let c = control.clone();
        let thread = std::thread::Builder::new()
            .name("prefetch".into())
            .spawn(move || {
                let mut generation = u64::MAX;
                let mut walk = EpochOrder::new(Vec::new(), seed, 0);
                let mut idx = Vec::new();
                while !c.stop.load(Ordering::Relaxed) {
                    let g = c.generation.load(Ordering::Relaxed);
                    if g != generation {
                        generation = g;
                        let shards = c.shards.lock().clone();
                        // The new walk continues the epoch count.
                        walk = EpochOrder::new(plan.examples(&shards), seed, walk.epoch());
                    }
                    idx.clear();
                    let epoch = walk.take(c.batch.load(Ordering::Relaxed), &mut idx);
                    let mut b = Batch::empty(data.input());
                    data.gather(&idx, &mut b);
                    b.epoch = epoch;
                    if tx.send(b).is_err() {
                        return;
                    }
                }
            })
            .expect("spawn the prefetch thread");
        Self {
            rx,
            control,
            thread: Some(thread),
        }
    }

    pub fn control(&self) -> &PrefetchControl {
        &self.control
    }

    /// The next batch (waits for it). `None` only if the reader thread died (its end of the
    /// queue is dropped with it).
    pub fn next(&self) -> Option<Batch> {
        self.rx.recv().ok()
    }

    /// Batches waiting in the queue.
    pub fn queued(&self) -> usize {
        self.rx.len()
    }
}

impl Drop for Prefetcher {
    fn drop(&mut self) {
        self.control.stop.store(true, Ordering::Relaxed);
        // Dropping the queue's receiving end fails the thread's next (or blocked) send.
        drop(std::mem::replace(&mut self.rx, crossbeam_channel::never()));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::SyntheticDense;

    #[test]
    fn follows_batch_size_and_shard_changes() {
        let data: Arc<dyn Dataset> = Arc::new(SyntheticDense::new(100, 3, 2, 1, 0));
        let plan = ShardPlan::new(100, 2, 1);
        let p = Prefetcher::start(data, plan, &[0], 10, 2, 1);
        let first = p.next().unwrap();
        assert_eq!(first.len(), 10);
        p.control().set_batch(25);
        p.control().set_shards(&[0, 1]);
        // At most `depth` + 1 batches still have the old size.
        let sizes: Vec<usize> = (0..6).map(|_| p.next().unwrap().len()).collect();
        assert_eq!(*sizes.last().unwrap(), 25, "{sizes:?}");
        // 50 examples in shard 0: five batches of 10 fill epoch 0.
        drop(p);
    }
}
