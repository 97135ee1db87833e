//! The run directory: what a training run leaves behind.
//!
//! ```text
//! <run>/
//!   job.json                 the job spec the run trained (written by the evaluating worker)
//!   steps-<worker>.jsonl     one line per clock of each worker (StepRecord), appended to
//!                            by a worker that restarts into the same directory
//!   eval.jsonl               one line per evaluation on the test set (EvalRecord), appended
//!   final.json               the last evaluation and the run's totals (FinalRecord)
//!   curves.svg               training loss and test accuracy against examples seen
//!   model.safetensors        the trained parameters, one f32 tensor per table (dense tables
//!                            whole; sparse tables are not exported, their rows stay on the
//!                            shards and in their checkpoints)
//! ```
//!
//! `model.safetensors` is the safetensors format (an 8-byte little-endian header length, a JSON
//! header naming each tensor's dtype, shape and byte range, then the raw little-endian data);
//! PyTorch, NumPy and most tools read it. Tensor names are the table names.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::Context;
use ps_client::PsClient;
use ps_core::{JobSpec, TableKind};
use serde::{Deserialize, Serialize};

use crate::backend::Backend;
use crate::model::Net;

/// What a worker did: its totals, kept by its run directory from the records it writes.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    pub clocks: u64,
    pub examples: u64,
    pub wire_bytes: u64,
    pub raw_bytes: u64,
    /// Bytes the training steps pulled, on the wire and as f32 (evaluations left out).
    pub pull_wire_bytes: u64,
    pub pull_raw_bytes: u64,
    /// Bytes of the training steps' pull requests (ids, digests; evaluations left out).
    pub pull_request_bytes: u64,
    /// Milliseconds of the steps, summed, by phase.
    pub phases: PhaseMs,
    pub dense_pulls: u64,
    pub final_eval: Option<EvalRecord>,
}

/// One clock of one worker.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StepRecord {
    pub worker: String,
    pub clock: u64,
    pub epoch: u64,
    pub examples: usize,
    /// Mean training loss and accuracy of the clock's batch.
    pub loss: f64,
    pub accuracy: f64,
    pub compute_ms: f64,
    /// Time the clock report waited for the scheduler (the consistency bound).
    pub wait_ms: f64,
    /// Time the trainer waited for the prefetcher.
    pub data_wait_ms: f64,
    /// Pulling the dense tables and the batch's rows.
    #[serde(default)]
    pub pull_ms: f64,
    /// Encoding the gradients (codec and error feedback).
    #[serde(default)]
    pub encode_ms: f64,
    /// Sending the pushes, encoding aside.
    #[serde(default)]
    pub push_ms: f64,
    /// Pushed bytes on the wire and as f32.
    pub wire_bytes: u64,
    pub raw_bytes: u64,
    /// Pulled bytes on the wire and as f32.
    #[serde(default)]
    pub pull_wire_bytes: u64,
    #[serde(default)]
    pub pull_raw_bytes: u64,
    /// Bytes of the clock's pull requests: what asking sent up (ids, held rows' digests).
    #[serde(default)]
    pub pull_request_bytes: u64,
    /// Embedding rows holding an error-feedback residual after the clock, and rows that gave
    /// theirs up over the run (every sparse table).
    #[serde(default)]
    pub row_residual_rows: usize,
    #[serde(default)]
    pub row_residuals_evicted: u64,
    pub elapsed_s: f64,
}

/// Milliseconds by phase of a step (summed over steps, or their mean).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct PhaseMs {
    pub pull: f64,
    pub data: f64,
    pub compute: f64,
    pub encode: f64,
    pub push: f64,
    pub wait: f64,
}

impl PhaseMs {
    fn add(&mut self, r: &StepRecord) {
        self.pull += r.pull_ms;
        self.data += r.data_wait_ms;
        self.compute += r.compute_ms;
        self.encode += r.encode_ms;
        self.push += r.push_ms;
        self.wait += r.wait_ms;
    }

    fn scaled(self, by: f64) -> Self {
        Self {
            pull: self.pull * by,
            data: self.data * by,
            compute: self.compute * by,
            encode: self.encode * by,
            push: self.push * by,
            wait: self.wait * by,
        }
    }
}

/// One evaluation on the test set.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EvalRecord {
    /// The evaluating worker's clock.
    pub clock: u64,
    pub epoch: u64,
    pub test_loss: f64,
    pub test_accuracy: f64,
    /// Area under the ROC curve (binary tasks).
    pub auc: Option<f64>,
    /// Training loss and accuracy of the evaluating worker since the last evaluation.
    pub train_loss: f64,
    pub train_accuracy: f64,
    /// Examples the evaluating worker has trained on.
    pub examples: u64,
    /// Bytes the evaluating worker has pushed.
    pub wire_bytes: u64,
    pub elapsed_s: f64,
    /// `elapsed_s` less the time spent evaluating: the training time behind this model.
    pub train_s: f64,
}

/// The run's outcome.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FinalRecord {
    pub job: String,
    pub model: String,
    pub dataset: String,
    pub eval: EvalRecord,
    pub clocks: u64,
    pub wire_bytes: u64,
    pub raw_bytes: u64,
    /// Bytes the evaluating worker pushed per clock, on the wire and as f32.
    pub wire_bytes_per_step: f64,
    pub raw_bytes_per_step: f64,
    pub dense_pulls: u64,
    /// Bytes the evaluating worker's steps pulled per clock, on the wire and as f32.
    #[serde(default)]
    pub pull_wire_bytes_per_step: f64,
    #[serde(default)]
    pub pull_raw_bytes_per_step: f64,
    /// Bytes of the evaluating worker's pull requests per clock (ids, held rows' digests).
    #[serde(default)]
    pub pull_request_bytes_per_step: f64,
    /// Where the evaluating worker's step time went, mean milliseconds per clock.
    #[serde(default)]
    pub phase_ms_per_step: PhaseMs,
}

/// Writes a run directory (or nothing, without one), and keeps the worker's totals.
#[derive(Debug)]
pub struct RunDir {
    dir: Option<PathBuf>,
    steps: Option<BufWriter<File>>,
    evals: Option<BufWriter<File>>,
    summary: Summary,
}

/// A record file, appended to: a worker that restarts into the same run directory (after a
/// crash, or a restart of its container) goes on with the job's history rather than erasing it.
fn append(path: &Path) -> anyhow::Result<BufWriter<File>> {
    Ok(BufWriter::new(
        File::options()
            .create(true)
            .append(true)
            .open(path)
            .with_context(|| format!("opening {}", path.display()))?,
    ))
}

impl RunDir {
    pub fn open(dir: Option<&Path>, worker: &str, evaluator: bool) -> anyhow::Result<Self> {
        let Some(dir) = dir else {
            return Ok(Self {
                dir: None,
                steps: None,
                evals: None,
                summary: Summary::default(),
            });
        };
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(Self {
            dir: Some(dir.to_owned()),
            steps: Some(append(&dir.join(format!("steps-{worker}.jsonl")))?),
            evals: evaluator
                .then(|| append(&dir.join("eval.jsonl")))
                .transpose()?,
            summary: Summary::default(),
        })
    }

    /// The worker's totals so far.
    pub fn summary(&self) -> &Summary {
        &self.summary
    }

    /// The worker's totals, with the final evaluation, once it is done.
    pub fn into_summary(mut self, final_eval: Option<EvalRecord>) -> Summary {
        self.summary.final_eval = final_eval;
        self.summary
    }

    /// Counts a pull of the dense tables.
    pub fn dense_pull(&mut self) {
        self.summary.dense_pulls += 1;
    }

    /// Records one clock (and adds it to the totals). The line is written through at once: a
    /// worker killed after it keeps the record of every clock it reported (the fault drills
    /// count acknowledged pushes from these lines).
    pub fn step(&mut self, r: &StepRecord) -> anyhow::Result<()> {
        let s = &mut self.summary;
        s.clocks += 1;
        s.examples += r.examples as u64;
        s.wire_bytes += r.wire_bytes;
        s.raw_bytes += r.raw_bytes;
        s.pull_wire_bytes += r.pull_wire_bytes;
        s.pull_raw_bytes += r.pull_raw_bytes;
        s.pull_request_bytes += r.pull_request_bytes;
        s.phases.add(r);
        if let Some(w) = &mut self.steps {
            serde_json::to_writer(&mut *w, r)?;
            w.write_all(b"\n")?;
            w.flush()?;
        }
        Ok(())
    }

    pub fn eval(&mut self, r: &EvalRecord) -> anyhow::Result<()> {
        if let Some(w) = &mut self.evals {
            serde_json::to_writer(&mut *w, r)?;
            w.write_all(b"\n")?;
            w.flush()?;
        }
        if let Some(w) = &mut self.steps {
            w.flush()?;
        }
        Ok(())
    }

    pub fn flush(&mut self) -> anyhow::Result<()> {
        for w in [&mut self.steps, &mut self.evals].into_iter().flatten() {
            w.flush()?;
        }
        Ok(())
    }

    /// Writes the final record, the curves and the model.
    pub async fn finish<B: Backend + Clone>(
        &mut self,
        eval: &EvalRecord,
        ps: &PsClient,
        net: &Net<B>,
        spec: &JobSpec,
    ) -> anyhow::Result<()> {
        self.flush()?;
        let Some(dir) = self.dir.clone() else {
            return Ok(());
        };
        let summary = &self.summary;
        let clocks = summary.clocks.max(1) as f64;
        let fin = FinalRecord {
            job: spec.name.clone(),
            model: spec.model.clone(),
            dataset: spec.dataset.clone(),
            eval: eval.clone(),
            clocks: summary.clocks,
            wire_bytes: summary.wire_bytes,
            raw_bytes: summary.raw_bytes,
            wire_bytes_per_step: summary.wire_bytes as f64 / clocks,
            raw_bytes_per_step: summary.raw_bytes as f64 / clocks,
            dense_pulls: summary.dense_pulls,
            pull_wire_bytes_per_step: summary.pull_wire_bytes as f64 / clocks,
            pull_raw_bytes_per_step: summary.pull_raw_bytes as f64 / clocks,
            pull_request_bytes_per_step: summary.pull_request_bytes as f64 / clocks,
            phase_ms_per_step: summary.phases.scaled(1.0 / clocks),
        };
        std::fs::write(dir.join("job.json"), serde_json::to_vec_pretty(spec)?)?;
        export_model(&dir.join("model.safetensors"), ps, net, spec).await?;
        plot_curves(&dir)?;
        ps_runtime::config::write_atomic(
            &dir.join("final.json"),
            &serde_json::to_vec_pretty(&fin)?,
        )?;
        Ok(())
    }
}

/// Writes the dense tables of `net`, as the shards hold them now, to a safetensors file.
pub async fn export_model<B: Backend + Clone>(
    path: &Path,
    ps: &PsClient,
    net: &Net<B>,
    spec: &JobSpec,
) -> anyhow::Result<()> {
    let mut tensors = Vec::new();
    for (name, _) in net.dense_tables() {
        let shape: Vec<usize> = match spec.table(name).map(|t| &t.spec.kind) {
            Some(TableKind::Dense(d)) => d.shape.iter().map(|&x| x as usize).collect(),
            _ => continue,
        };
        let values = ps.pull_dense_f32(name).await?;
        tensors.push((name.clone(), shape, values));
    }
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .map(|(n, shape, v)| {
            // f32 as little-endian bytes (every machine this runs on is little-endian).
            let bytes: &[u8] = bytemuck::cast_slice(v);
            safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), bytes)
                .map(|t| (n.clone(), t))
                .map_err(|e| anyhow::anyhow!("tensor {n}: {e}"))
        })
        .collect::<anyhow::Result<_>>()?;
    let meta = std::collections::HashMap::from([
        ("job".to_string(), spec.name.clone()),
        ("model".to_string(), spec.model.clone()),
        ("dataset".to_string(), spec.dataset.clone()),
    ]);
    let bytes = safetensors::tensor::serialize(views, Some(meta))
        .map_err(|e| anyhow::anyhow!("serializing the model: {e}"))?;
    ps_runtime::config::write_atomic(path, &bytes)?;
    Ok(())
}

/// Draws `curves.svg` from the run's `eval.jsonl`: training and test loss, training and test
/// accuracy, against the examples the evaluating worker has seen. Plain SVG, no fonts needed.
pub fn plot_curves(dir: &Path) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(dir.join("eval.jsonl")).unwrap_or_default();
    let evals: Vec<EvalRecord> = text
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    if evals.is_empty() {
        return Ok(());
    }
    let series = |name: &str, colour: &'static str, y: fn(&EvalRecord) -> f64| Series {
        name: name.to_owned(),
        colour,
        points: evals.iter().map(|e| (e.examples as f64, y(e))).collect(),
    };
    let x_label = "examples seen (evaluating worker)";
    let panels = [
        Panel {
            title: "loss".into(),
            x_label,
            series: vec![
                series("train", "#1f77b4", |e| e.train_loss),
                series("test", "#d62728", |e| e.test_loss),
            ],
        },
        Panel {
            title: "accuracy".into(),
            x_label,
            series: vec![
                series("train", "#1f77b4", |e| e.train_accuracy),
                series("test", "#d62728", |e| e.test_accuracy),
            ],
        },
    ];
    std::fs::write(dir.join("curves.svg"), svg(&panels))?;
    Ok(())
}

/// Colours for series, in order.
pub const PALETTE: [&str; 10] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf",
];

/// One line of a chart.
#[derive(Debug, Clone)]
pub struct Series {
    pub name: String,
    pub colour: &'static str,
    pub points: Vec<(f64, f64)>,
}

/// One chart of a few series.
#[derive(Debug, Clone)]
pub struct Panel {
    pub title: String,
    pub x_label: &'static str,
    pub series: Vec<Series>,
}

/// Panels side by side as one SVG document.
pub fn svg(panels: &[Panel]) -> String {
    let (w, h) = (480.0, 400.0);
    let width = w * panels.len().max(1) as f64;
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{h}\" \
         font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"{width}\" height=\"{h}\" fill=\"white\"/>\n",
    );
    for (i, p) in panels.iter().enumerate() {
        p.draw(&mut out, w * i as f64, w, h);
    }
    out.push_str("</svg>\n");
    out
}

impl Panel {
    fn draw(&self, svg: &mut String, left: f64, w: f64, h: f64) {
        use std::fmt::Write as _;
        let pad = 50.0;
        let points = || self.series.iter().flat_map(|s| s.points.iter().copied());
        let (x0, x1) = (0.0, points().map(|p| p.0).fold(1e-9, f64::max));
        let (mut y0, mut y1) =
            points().fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.1), b.max(p.1)));
        if y1 - y0 < 1e-9 {
            (y0, y1) = (y0 - 0.5, y1 + 0.5);
        }
        let margin = (y1 - y0) * 0.05;
        let (y0, y1) = (y0 - margin, y1 + margin);
        let px = |x: f64| left + pad + (x - x0) / (x1 - x0) * (w - 1.5 * pad);
        let py = |y: f64| h - pad - (y - y0) / (y1 - y0) * (h - 2.0 * pad);
        let _ = writeln!(
            svg,
            "<text x=\"{:.0}\" y=\"24\" font-size=\"16\" text-anchor=\"middle\">{}</text>",
            left + w / 2.0,
            self.title
        );
        let _ = writeln!(
            svg,
            "<rect x=\"{:.1}\" y=\"{pad}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"none\" stroke=\"#888\"/>",
            left + pad,
            w - 1.5 * pad,
            h - 2.0 * pad
        );
        for i in 0..=4 {
            let y = y0 + (y1 - y0) * f64::from(i) / 4.0;
            let _ = writeln!(
                svg,
                "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{y:.3}</text>",
                left + pad - 4.0,
                py(y) + 4.0
            );
            let x = x0 + (x1 - x0) * f64::from(i) / 4.0;
            let label = if x1 >= 100.0 {
                format!("{x:.0}")
            } else {
                format!("{x:.1}")
            };
            let _ = writeln!(
                svg,
                "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{label}</text>",
                px(x),
                h - pad + 16.0
            );
        }
        let _ = writeln!(
            svg,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
            left + w / 2.0,
            h - 12.0,
            self.x_label
        );
        for (k, s) in self.series.iter().enumerate() {
            let points: Vec<String> = s
                .points
                .iter()
                .map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y)))
                .collect();
            let _ = writeln!(
                svg,
                "<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"2\" points=\"{}\"/>",
                s.colour,
                points.join(" ")
            );
            let ly = pad + 16.0 + 16.0 * k as f64;
            let lx = left + w - 1.5 * pad - 130.0;
            let _ = writeln!(
                svg,
                "<line x1=\"{lx:.1}\" y1=\"{ly:.1}\" x2=\"{:.1}\" y2=\"{ly:.1}\" stroke=\"{}\" stroke-width=\"2\"/><text x=\"{:.1}\" y=\"{:.1}\">{}</text>",
                lx + 16.0,
                s.colour,
                lx + 20.0,
                ly + 4.0,
                s.name
            );
        }
    }
}
