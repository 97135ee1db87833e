//! What moves over a job's clocks: the step size ([`LrSchedule`]), the share a sparse codec
//! sends during a sparsity warm-up ([`SparsityWarmup`]), and when an SSP worker refreshes its
//! copy of the model ([`SspRefresh`]).

use ps_client::PsClient;

/// When an SSP worker refreshes its copy of the dense tables. Either way the scheduler's clock
/// gate bounds how far ahead of the slowest worker any worker runs, and no copy is ever older
/// than the bound allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum SspRefresh {
    /// Pull at every clock (eager SSP): a worker computes on the freshest model the shards
    /// hold, and the bound only stops it from running ahead. The default: at the same epochs
    /// it trains as well as BSP (EXPERIMENTS.md).
    #[default]
    EveryClock,
    /// Pull only when the bound requires it (the SSP cache rule: at clock c, when the last
    /// pull was made while the slowest worker was below c - s), applying this worker's own
    /// pushes to the copy in between. Pulls up to s + 1 times less often, for links where the
    /// pulls dominate, and pays for it in accuracy.
    Bound,
}

impl std::fmt::Display for SspRefresh {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::EveryClock => "every-clock",
            Self::Bound => "bound",
        })
    }
}

/// How the step size moves over a job of a known number of clocks. The workers apply it by
/// scaling their gradients, which for SGD and momentum tables is exactly a learning-rate
/// schedule (the rate inside the velocity): the shards' optimizers need no change. Tables under
/// Adagrad, Adam or FTRL normalise the gradient's scale away, so a schedule is refused there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LrSchedule {
    /// The tables' learning rate throughout.
    #[default]
    Constant,
    /// Cosine decay from the tables' rate to 0 over the job's clocks: big steps early, small
    /// ones at the end, where a constant rate keeps the model bouncing around the optimum.
    Cosine,
}

impl LrSchedule {
    /// The factor on the learning rate at `clock` of a job of `clocks`.
    pub fn factor(self, clock: u64, clocks: u64) -> f32 {
        match self {
            Self::Constant => 1.0,
            Self::Cosine if clocks == 0 => 1.0,
            Self::Cosine => {
                let p = (clock as f64 / clocks as f64).clamp(0.0, 1.0);
                (0.5 * (1.0 + (std::f64::consts::PI * p).cos())) as f32
            }
        }
    }
}

impl std::fmt::Display for LrSchedule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Constant => "constant",
            Self::Cosine => "cosine",
        })
    }
}

/// The share of its values a top-k or random-k table pushes when a sparsity warm-up starts.
pub const WARMUP_START_RATIO: f64 = 0.25;

/// The ratio a sparsity warm-up of `warmup` epochs sets after `epochs` epochs of the job:
/// geometric from [`WARMUP_START_RATIO`] down to `target`, then `target`.
pub fn warmup_ratio(target: f64, epochs: f64, warmup: f64) -> f64 {
    if target >= WARMUP_START_RATIO || epochs >= warmup {
        return target;
    }
    WARMUP_START_RATIO * (target / WARMUP_START_RATIO).powf(epochs.max(0.0) / warmup)
}

/// A sparsity warm-up (Deep Gradient Compression): the top-k and random-k tables that keep a
/// residual push a share that falls geometrically from [`WARMUP_START_RATIO`] to their codec's
/// ratio over `epochs` epochs of the job, so the first, largest gradients are not held back in
/// the residual for long. Moving the ratio keeps the residual (`PsClient::set_push_ratio`).
#[derive(Debug)]
pub struct SparsityWarmup {
    epochs: f64,
    /// The tables it moves, with their codec's ratio; empty once it has ended.
    tables: Vec<(String, f64)>,
}

impl SparsityWarmup {
    /// A warm-up of `epochs` epochs over those of `tables` whose codec it moves.
    pub fn new(ps: &PsClient, tables: &[&str], epochs: f64) -> anyhow::Result<Self> {
        let mut moved = Vec::new();
        if epochs > 0.0 {
            for &t in tables {
                let push = ps.table_codec(t)?.push;
                if let ps_codec::Codec::TopK { ratio, .. } | ps_codec::Codec::RandomK { ratio, .. } =
                    push.codec
                    && push.keeps_residual()
                {
                    moved.push((t.to_owned(), ratio));
                }
            }
        }
        Ok(Self {
            epochs,
            tables: moved,
        })
    }

    /// Sets every table's ratio for a job `job_epochs` epochs in.
    pub fn apply(&mut self, ps: &PsClient, job_epochs: f64) -> anyhow::Result<()> {
        for (t, target) in &self.tables {
            ps.set_push_ratio(t, warmup_ratio(*target, job_epochs, self.epochs))?;
        }
        if job_epochs >= self.epochs {
            // The codecs' own ratios are set: nothing moves any more.
            self.tables.clear();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{LrSchedule, WARMUP_START_RATIO, warmup_ratio};

    #[test]
    fn a_cosine_schedule_falls_from_one_to_zero_over_the_job() {
        let close = |a: f32, b: f32| (a - b).abs() < 1e-6;
        let cos = LrSchedule::Cosine;
        assert!(close(cos.factor(0, 1000), 1.0));
        assert!(close(cos.factor(500, 1000), 0.5));
        assert!(close(cos.factor(250, 1000), 0.853_553_4));
        assert!(close(cos.factor(1000, 1000), 0.0));
        assert!(close(cos.factor(5000, 1000), 0.0));
        let mut last = f32::INFINITY;
        for c in 0..=100 {
            let f = cos.factor(c, 100);
            assert!(f <= last && f >= 0.0, "{f} after {last}");
            last = f;
        }
        // A job of unknown length, and the constant schedule, keep the tables' rate.
        assert_eq!(cos.factor(7, 0), 1.0);
        assert_eq!(LrSchedule::Constant.factor(999, 1000), 1.0);
    }

    #[test]
    fn a_sparsity_warmup_falls_geometrically_to_the_codec_ratio() {
        let close = |a: f64, b: f64| (a - b).abs() < 1e-12;
        assert!(close(warmup_ratio(0.01, 0.0, 1.0), WARMUP_START_RATIO));
        // Halfway in epochs is halfway in log-ratio: sqrt(0.25 * 0.01).
        assert!(close(warmup_ratio(0.01, 0.5, 1.0), 0.05));
        assert!(close(warmup_ratio(0.01, 1.0, 1.0), 0.01));
        assert!(close(warmup_ratio(0.01, 7.0, 1.0), 0.01));
        assert!(close(warmup_ratio(0.01, 1.0, 2.0), 0.05));
        // Falling all the way, and never below the target.
        let mut last = f64::INFINITY;
        for i in 0..=40 {
            let r = warmup_ratio(0.01, f64::from(i) * 0.05, 1.0);
            assert!(r <= last && r >= 0.01, "{r} after {last}");
            last = r;
        }
        // A codec that sends more than the start, or no warm-up at all, keeps its ratio.
        assert_eq!(warmup_ratio(0.5, 0.0, 1.0), 0.5);
        assert_eq!(warmup_ratio(0.01, 0.0, 0.0), 0.01);
    }
}
