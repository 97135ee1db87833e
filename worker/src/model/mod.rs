//! Models, written once against [`Backend`]: softmax regression and an MLP on dense inputs;
//! sparse logistic regression with an optional embedding bag and MLP head on hashed sparse
//! inputs (a "wide and deep" model).
//!
//! A model is named by a string (the job spec's `model`):
//!
//! | name | what | tables (under the job's prefix) |
//! | --- | --- | --- |
//! | `softmax` | softmax regression | `w0` `[in, classes]`, `b0` `[classes]` |
//! | `mlp:256,128` | ReLU MLP with those hidden widths | `w0`, `b0`, `w1`, `b1`, ... |
//! | `sparse-lr` | logistic regression on sparse ids | `wide` (sparse, dim 1), `wide_bias` `[1]` |
//! | `wide-deep:8:64` | `sparse-lr` plus an embedding bag of dim 8 into a ReLU MLP (64) | also `emb` (sparse, dim 8; `wide` is placed with it), `w0`, `b0`, ... |
//! | `counter:4096:10` | a witness, not a model: every clock pushes a gradient of -1 into each of 4096 values (SGD, learning rate 1), after 10 ms of "compute" | `count` `[4096]`, in 8 chunks |
//!
//! Dense inputs train with softmax cross-entropy over the classes; sparse inputs with the
//! logistic loss on a binary label.
//!
//! The counter makes a stored value count the pushes applied to it, whatever the data: the
//! fault drills (`scripts/compose-test.sh`) compare it with the pushes the workers saw
//! acknowledged. Its compute time paces the job so that faults land during training.

use ps_codec::IdMap;
use ps_core::{Initializer, Optimizer, TableSpec, ValidationError};

use crate::backend::{Backend, BackendError, Bags, LossSum, Trans};
use crate::data::{Batch, Features, Input};

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("bad model name `{name}`: {detail}")]
    Spec { name: String, detail: String },
    #[error("model `{model}` cannot train on this data: {detail}")]
    Mismatch { model: String, detail: String },
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error(transparent)]
    Table(#[from] ValidationError),
}

pub type Result<T, E = ModelError> = std::result::Result<T, E>;

/// A model by name (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelSpec {
    /// A ReLU MLP; no hidden layers is softmax regression.
    Mlp { hidden: Vec<usize> },
    /// Sparse logistic regression, plus an embedding bag of `dim` into an MLP when `dim > 0`.
    WideDeep { dim: usize, hidden: Vec<usize> },
    /// The push counter: `len` values, each clock a gradient of -1 after `step_ms` of sleep.
    Counter { len: usize, step_ms: u64 },
}

/// Chunks of the counter's table: enough for every value's chunk to land on either of a few
/// shards (dense chunks go round-robin).
const COUNTER_CHUNKS: u64 = 8;

fn counter(name: &str, rest: &str) -> Result<ModelSpec> {
    let bad = |detail: &str| ModelError::Spec {
        name: name.into(),
        detail: detail.into(),
    };
    let (len, ms) = rest.split_once(':').unwrap_or((rest, "0"));
    let len = len
        .parse::<usize>()
        .ok()
        .filter(|l| (1..=1 << 24).contains(l))
        .ok_or_else(|| bad("counter:LEN[:MS] needs LEN in 1..=16777216"))?;
    let step_ms = ms
        .parse::<u64>()
        .ok()
        .filter(|&m| m <= 60_000)
        .ok_or_else(|| bad("counter:LEN[:MS] needs MS (compute time per clock) in 0..=60000"))?;
    Ok(ModelSpec::Counter { len, step_ms })
}

fn widths(name: &str, s: &str) -> Result<Vec<usize>> {
    s.split(',')
        .filter(|w| !w.is_empty())
        .map(|w| {
            w.parse::<usize>()
                .ok()
                .filter(|&w| (1..=65_536).contains(&w))
                .ok_or_else(|| ModelError::Spec {
                    name: name.into(),
                    detail: format!("`{w}` is not a layer width in 1..=65536"),
                })
        })
        .collect()
}

impl ModelSpec {
    pub fn parse(name: &str) -> Result<Self> {
        let (kind, rest) = name.split_once(':').unwrap_or((name, ""));
        let spec = match kind {
            "softmax" | "logreg" if rest.is_empty() => Self::Mlp { hidden: Vec::new() },
            "mlp" => Self::Mlp {
                hidden: widths(name, rest)?,
            },
            "counter" => counter(name, rest)?,
            "sparse-lr" if rest.is_empty() => Self::WideDeep {
                dim: 0,
                hidden: Vec::new(),
            },
            "wide-deep" => {
                let (dim, hidden) = rest.split_once(':').unwrap_or((rest, ""));
                let dim = widths(name, dim)?;
                if dim.len() != 1 {
                    return Err(ModelError::Spec {
                        name: name.into(),
                        detail: "wide-deep:DIM[:H1,H2,...] needs one embedding dim".into(),
                    });
                }
                Self::WideDeep {
                    dim: dim[0],
                    hidden: widths(name, hidden)?,
                }
            }
            _ => {
                return Err(ModelError::Spec {
                    name: name.into(),
                    detail: "use softmax, mlp:H1,H2,..., sparse-lr, wide-deep:DIM[:H1,...] or \
                             counter:LEN[:MS]"
                        .into(),
                });
            }
        };
        Ok(spec)
    }

    pub fn name(&self) -> String {
        let join = |h: &[usize]| {
            h.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(",")
        };
        match self {
            Self::Mlp { hidden } if hidden.is_empty() => "softmax".into(),
            Self::Mlp { hidden } => format!("mlp:{}", join(hidden)),
            Self::WideDeep { dim: 0, .. } => "sparse-lr".into(),
            Self::WideDeep { dim, hidden } if hidden.is_empty() => format!("wide-deep:{dim}"),
            Self::WideDeep { dim, hidden } => format!("wide-deep:{dim}:{}", join(hidden)),
            Self::Counter { len, step_ms: 0 } => format!("counter:{len}"),
            Self::Counter { len, step_ms } => format!("counter:{len}:{step_ms}"),
        }
    }

    /// The widths of the dense layers, input first, output last; empty when there are none.
    fn layer_widths(&self, input: Input, classes: usize) -> Result<Vec<usize>> {
        match (self, input) {
            // The counter has no layers: its one table is not a layer's.
            (Self::Counter { .. }, _) => Ok(Vec::new()),
            (Self::Mlp { hidden }, Input::Dense { dim }) => {
                let mut w = vec![dim];
                w.extend(hidden);
                w.push(classes);
                Ok(w)
            }
            (Self::WideDeep { dim: 0, .. }, Input::Sparse) => Ok(Vec::new()),
            (Self::WideDeep { dim, hidden }, Input::Sparse) => {
                let mut w = vec![*dim];
                w.extend(hidden);
                w.push(1);
                Ok(w)
            }
            (Self::Mlp { .. }, Input::Sparse) => Err(ModelError::Mismatch {
                model: self.name(),
                detail:
                    "dense models need dense inputs; use sparse-lr or wide-deep for sparse data"
                        .into(),
            }),
            (Self::WideDeep { .. }, Input::Dense { .. }) => Err(ModelError::Mismatch {
                model: self.name(),
                detail: "sparse models need sparse (id) inputs; use softmax or mlp for dense data"
                    .into(),
            }),
        }
    }

    /// The tables the model keeps on the parameter servers, named `prefix/...`, with their
    /// initializers and a default optimizer (a job's own table settings take precedence).
    pub fn tables(
        &self,
        prefix: &str,
        input: Input,
        classes: usize,
        seed: u64,
    ) -> Result<Vec<TableSpec>> {
        if let Self::Counter { len, .. } = self {
            let len = *len as u64;
            return Ok(vec![
                TableSpec::dense(&format!("{prefix}/count"), &[len])?
                    .with_optimizer(Optimizer::sgd(1.0))?
                    .with_chunk_elems(len.div_ceil(COUNTER_CHUNKS))?,
            ]);
        }
        if matches!(input, Input::Sparse) && classes != 2 {
            return Err(ModelError::Mismatch {
                model: self.name(),
                detail: format!(
                    "sparse models predict a binary label, the data has {classes} classes"
                ),
            });
        }
        let widths = self.layer_widths(input, classes)?;
        let mut t = Vec::new();
        if let Self::WideDeep { dim, .. } = self {
            // The wide table's ids are placed as the embeddings', so that one pull per shard
            // reads both tables' rows of a batch and sends its ids once.
            let mut wide = TableSpec::sparse(&format!("{prefix}/wide"), 1)?
                .with_optimizer(Optimizer::adagrad(0.05))?;
            if *dim > 0 {
                wide = wide.placed_with(&format!("{prefix}/emb"))?;
            }
            t.push(wide);
            t.push(
                TableSpec::dense(&format!("{prefix}/wide_bias"), &[1])?
                    .with_optimizer(Optimizer::adagrad(0.05))?,
            );
            if *dim > 0 {
                t.push(
                    TableSpec::sparse(&format!("{prefix}/emb"), *dim as u32)?
                        .with_optimizer(Optimizer::adagrad(0.05))?
                        .with_initializer(Initializer::normal(0.0, 0.05, seed))?,
                );
            }
        }
        let softmax = widths.len() == 2 && matches!(self, Self::Mlp { .. });
        for (l, io) in widths.windows(2).enumerate() {
            let (fan_in, fan_out) = (io[0] as u64, io[1] as u64);
            // He initialization for ReLU layers; a linear model starts at zero.
            let init = if softmax {
                Initializer::ZEROS
            } else {
                Initializer::normal(
                    0.0,
                    (2.0 / fan_in as f32).sqrt(),
                    seed.wrapping_add(l as u64),
                )
            };
            t.push(
                TableSpec::dense(&format!("{prefix}/w{l}"), &[fan_in, fan_out])?
                    .with_optimizer(Optimizer::sgd(0.1))?
                    .with_initializer(init)?,
            );
            t.push(
                TableSpec::dense(&format!("{prefix}/b{l}"), &[fan_out])?
                    .with_optimizer(Optimizer::sgd(0.1))?,
            );
        }
        Ok(t)
    }
}

/// The rows of the sparse tables a batch touches, pulled for one clock: `ids` unique, and for
/// each table its rows in the same order.
#[derive(Debug, Clone, Default)]
pub struct SparseRows {
    pub ids: Vec<u64>,
    /// `ids.len()` weights of the `wide` table.
    pub wide: Vec<f32>,
    /// `ids.len() * dim` values of the `emb` table (empty without one).
    pub emb: Vec<f32>,
}

impl SparseRows {
    /// The unique ids of a batch's features, sorted.
    pub fn ids_of(batch: &Batch) -> Vec<u64> {
        match &batch.features {
            Features::Sparse { ids, .. } => {
                let mut v = ids.clone();
                v.sort_unstable();
                v.dedup();
                v
            }
            Features::Dense { .. } => Vec::new(),
        }
    }
}

/// Gradients of one clock, on the host, ready to push (sums scaled by the caller's `scale`).
#[derive(Debug, Clone, Default)]
pub struct Grads {
    /// (table, gradient of the whole tensor).
    pub dense: Vec<(String, Vec<f32>)>,
    /// (table, ids, rows).
    pub sparse: Vec<(String, Vec<u64>, Vec<f32>)>,
}

struct Layer<B: Backend> {
    w: B::Buf,
    b: B::Buf,
    dw: B::Buf,
    db: B::Buf,
    fan_in: usize,
    fan_out: usize,
}

/// A model's parameters and gradient buffers on a backend.
pub struct Net<B: Backend> {
    backend: B,
    spec: ModelSpec,
    prefix: String,
    input: Input,
    classes: usize,
    layers: Vec<Layer<B>>,
    /// The tables, as [`ModelSpec::tables`] names them: dense (wide_bias first for sparse
    /// models, then w0, b0, w1, ...) with their lengths, sparse (wide, then emb) with their dims.
    dense: Vec<(String, usize)>,
    sparse: Vec<(String, usize)>,
    /// Sparse part: the embedding dim (0 = none) and the bias of the wide part.
    emb_dim: Option<usize>,
    wide_bias: f32,
    /// The clock's sparse rows and their gradients, on the device.
    rows: Option<DeviceRows<B>>,
    dwide_bias: f64,
}

struct DeviceRows<B: Backend> {
    ids: Vec<u64>,
    /// Each id's place in `ids`.
    index: IdMap,
    wide: B::Buf,
    emb: Option<B::Buf>,
    dwide: B::Buf,
    demb: Option<B::Buf>,
}

impl<B: Backend> std::fmt::Debug for Net<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Net")
            .field("backend", &self.backend.name())
            .field("model", &self.spec.name())
            .field("prefix", &self.prefix)
            .finish()
    }
}

impl<B: Backend + Clone> Net<B> {
    /// A model for `input` and `classes` whose tables live under `prefix`; parameters start
    /// at zero until [`Net::set_dense`] loads them.
    pub fn new(
        backend: B,
        spec: ModelSpec,
        prefix: &str,
        input: Input,
        classes: usize,
    ) -> Result<Self> {
        let widths = spec.layer_widths(input, classes)?;
        let layers = widths
            .windows(2)
            .map(|io| {
                Ok(Layer {
                    w: backend.zeros(io[0] * io[1])?,
                    b: backend.zeros(io[1])?,
                    dw: backend.zeros(io[0] * io[1])?,
                    db: backend.zeros(io[1])?,
                    fan_in: io[0],
                    fan_out: io[1],
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let emb_dim = match &spec {
            ModelSpec::WideDeep { dim, .. } => Some(*dim),
            ModelSpec::Mlp { .. } | ModelSpec::Counter { .. } => None,
        };
        let tables = spec.tables(prefix, input, classes, 0)?;
        let dense = tables
            .iter()
            .filter_map(|t| Some((t.name.to_string(), t.dense_shape()?.len() as usize)))
            .collect();
        let sparse = tables
            .iter()
            .filter(|t| t.dense_shape().is_none())
            .map(|t| (t.name.to_string(), t.row_dim()))
            .collect();
        Ok(Self {
            backend,
            spec,
            prefix: prefix.to_owned(),
            input,
            classes,
            layers,
            dense,
            sparse,
            emb_dim,
            wide_bias: 0.0,
            rows: None,
            dwide_bias: 0.0,
        })
    }

    pub fn spec(&self) -> &ModelSpec {
        &self.spec
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The dense tables and their lengths, in a fixed order.
    pub fn dense_tables(&self) -> &[(String, usize)] {
        &self.dense
    }

    /// The sparse tables and their dims: `wide`, then `emb` when the model has one.
    pub fn sparse_tables(&self) -> &[(String, usize)] {
        &self.sparse
    }

    /// Loads dense table `name` (as pulled).
    pub fn set_dense(&mut self, name: &str, values: &[f32]) -> Result<()> {
        let (i, want) = self
            .dense
            .iter()
            .position(|(n, _)| n == name)
            .map(|i| (i, self.dense[i].1))
            .ok_or_else(|| ModelError::Mismatch {
                model: self.spec.name(),
                detail: format!("no dense table `{name}` in this model"),
            })?;
        if values.len() != want {
            return Err(ModelError::Backend(BackendError::Shape {
                op: "set_dense",
                detail: format!(
                    "table `{name}` has {} values, the model wants {want}",
                    values.len()
                ),
            }));
        }
        if let ModelSpec::Counter { .. } = self.spec {
            // The counter's values are what it witnesses, not parameters it computes with.
            return Ok(());
        }
        // Sparse models list wide_bias before the layers' w and b.
        let i = match self.emb_dim {
            Some(_) if i == 0 => {
                self.wide_bias = values[0];
                return Ok(());
            }
            Some(_) => i - 1,
            None => i,
        };
        let layer = &mut self.layers[i / 2];
        let buf = if i % 2 == 0 {
            &mut layer.w
        } else {
            &mut layer.b
        };
        self.backend.write(buf, values)?;
        Ok(())
    }

    /// Loads the clock's sparse rows and zeroes their gradients.
    pub fn set_rows(&mut self, rows: &SparseRows) -> Result<()> {
        let Some(dim) = self.emb_dim else {
            return Ok(());
        };
        let u = rows.ids.len();
        if rows.wide.len() != u || rows.emb.len() != u * dim {
            return Err(ModelError::Backend(BackendError::Shape {
                op: "set_rows",
                detail: format!(
                    "{u} ids with {} wide and {} embedding values (dim {dim})",
                    rows.wide.len(),
                    rows.emb.len()
                ),
            }));
        }
        let b = &self.backend;
        let mut index = IdMap::new();
        for (i, &id) in rows.ids.iter().enumerate() {
            index.insert(id, i as u32);
        }
        self.rows = Some(DeviceRows {
            ids: rows.ids.clone(),
            index,
            wide: b.upload(&rows.wide)?,
            emb: (dim > 0).then(|| b.upload(&rows.emb)).transpose()?,
            dwide: b.zeros(u)?,
            demb: (dim > 0).then(|| b.zeros(u * dim)).transpose()?,
        });
        Ok(())
    }

    /// Zeroes the dense gradients (the start of a clock).
    pub fn zero_grads(&mut self) -> Result<()> {
        for l in &mut self.layers {
            l.dw = self.backend.zeros(l.fan_in * l.fan_out)?;
            l.db = self.backend.zeros(l.fan_out)?;
        }
        self.dwide_bias = 0.0;
        Ok(())
    }

    /// Bags of the batch's features over the loaded rows.
    fn bags(&self, batch: &Batch) -> Result<Bags> {
        let Features::Sparse {
            offsets,
            ids,
            values,
        } = &batch.features
        else {
            return Err(ModelError::Mismatch {
                model: self.spec.name(),
                detail: "a dense batch for a sparse model".into(),
            });
        };
        let rows = self.rows.as_ref().ok_or_else(|| ModelError::Mismatch {
            model: self.spec.name(),
            detail: "no sparse rows loaded for this batch".into(),
        })?;
        let mut found = Vec::new();
        rows.index.get_many(ids, &mut found, |_| {});
        let idx = ids
            .iter()
            .zip(found)
            .map(|(id, slot)| {
                slot.ok_or_else(|| ModelError::Mismatch {
                    model: self.spec.name(),
                    detail: format!("feature id {id} has no loaded row"),
                })
            })
            .collect::<Result<Vec<u32>>>()?;
        Ok(Bags {
            offsets: offsets.clone(),
            rows: idx,
            weights: values.clone(),
        })
    }

    /// Forward (and with `train`, backward, adding `scale *` the gradients of the summed
    /// loss into the gradient buffers). Returns the summed loss and hits; for binary models
    /// `probs` receives each row's probability of class 1.
    pub fn step(
        &mut self,
        batch: &Batch,
        scale: f32,
        train: bool,
        probs: &mut Vec<f32>,
    ) -> Result<LossSum> {
        let n = batch.len();
        probs.clear();
        if n == 0 {
            return Ok(LossSum::default());
        }
        if let ModelSpec::Counter { step_ms, .. } = self.spec {
            if train {
                std::thread::sleep(std::time::Duration::from_millis(step_ms));
            }
            return Ok(LossSum::default());
        }
        let b = self.backend.clone();
        let bags = match self.emb_dim {
            Some(_) => Some(self.bags(batch)?),
            None => None,
        };
        // The input of the dense layers.
        let x0 = match (&batch.features, self.emb_dim) {
            (Features::Dense { dim, values }, None) => {
                if (Input::Dense { dim: *dim }) != self.input {
                    return Err(ModelError::Mismatch {
                        model: self.spec.name(),
                        detail: format!("inputs of {dim} values, the model takes {:?}", self.input),
                    });
                }
                Some(b.upload(values)?)
            }
            (_, Some(d)) if d > 0 => {
                let rows = self.rows.as_ref().expect("bags checked the rows");
                let mut out = b.zeros(n * d)?;
                b.bag_forward(
                    rows.emb.as_ref().expect("dim > 0"),
                    d,
                    bags.as_ref().expect("sparse"),
                    &mut out,
                )?;
                Some(out)
            }
            (_, Some(_)) => None,
            (Features::Sparse { .. }, None) => {
                return Err(ModelError::Mismatch {
                    model: self.spec.name(),
                    detail: "a sparse batch for a dense model".into(),
                });
            }
        };
        // Activations: acts[l] is the input of layer l; the last is the dense part's output.
        let mut acts = Vec::with_capacity(self.layers.len() + 1);
        if let Some(x) = x0 {
            acts.push(x);
            let last = self.layers.len() - 1;
            for (l, layer) in self.layers.iter().enumerate() {
                let mut z = b.zeros(n * layer.fan_out)?;
                let a = acts.last().expect("input pushed");
                b.gemm(
                    Trans::N,
                    Trans::N,
                    n,
                    layer.fan_out,
                    layer.fan_in,
                    1.0,
                    a,
                    &layer.w,
                    0.0,
                    &mut z,
                )?;
                b.add_row_bias(&mut z, &layer.b, layer.fan_out)?;
                if l < last {
                    b.relu(&mut z)?;
                }
                acts.push(z);
            }
        }
        // Logits: the dense part's output, plus the wide part for sparse models.
        let mut logits = match (self.emb_dim, acts.len()) {
            (_, k) if k > 0 => acts.pop().expect("k > 0"),
            _ => b.zeros(n)?,
        };
        if self.emb_dim.is_some() {
            let rows = self.rows.as_ref().expect("bags checked the rows");
            let mut wide = b.zeros(n)?;
            b.bag_forward(&rows.wide, 1, bags.as_ref().expect("sparse"), &mut wide)?;
            let bias = b.upload(&[self.wide_bias])?;
            b.add_row_bias(&mut wide, &bias, 1)?;
            b.add(&mut logits, &wide)?;
        }
        let mut dz = if train {
            Some(b.zeros(b.len(&logits))?)
        } else {
            None
        };
        let sum = match self.emb_dim {
            None => b.softmax_xent(&logits, &batch.labels, self.classes, scale, dz.as_mut())?,
            Some(_) => b.sigmoid_xent(&logits, &batch.labels, scale, dz.as_mut(), probs)?,
        };
        let Some(mut dz) = dz else {
            return Ok(sum);
        };
        // Backward.
        if self.emb_dim.is_some() {
            let bags = bags.as_ref().expect("sparse");
            let rows = self.rows.as_mut().expect("bags checked the rows");
            b.bag_backward(&dz, 1, bags, &mut rows.dwide)?;
            let mut host = vec![0.0; n];
            b.download(&dz, &mut host)?;
            self.dwide_bias += host.iter().map(|&v| f64::from(v)).sum::<f64>();
        }
        for l in (0..self.layers.len()).rev() {
            let a = &acts[l];
            let layer = &mut self.layers[l];
            b.gemm(
                Trans::T,
                Trans::N,
                layer.fan_in,
                layer.fan_out,
                n,
                1.0,
                a,
                &dz,
                1.0,
                &mut layer.dw,
            )?;
            b.sum_rows_into(&dz, layer.fan_out, &mut layer.db)?;
            let needs_input_grad = l > 0 || self.emb_dim.is_some_and(|d| d > 0);
            if !needs_input_grad {
                break;
            }
            let mut da = b.zeros(n * layer.fan_in)?;
            b.gemm(
                Trans::N,
                Trans::T,
                n,
                layer.fan_in,
                layer.fan_out,
                1.0,
                &dz,
                &layer.w,
                0.0,
                &mut da,
            )?;
            if l > 0 {
                b.relu_backward(a, &mut da)?;
            }
            dz = da;
        }
        if let Some(d) = self.emb_dim.filter(|&d| d > 0) {
            let bags = bags.as_ref().expect("sparse");
            let rows = self.rows.as_mut().expect("bags checked the rows");
            b.bag_backward(&dz, d, bags, rows.demb.as_mut().expect("dim > 0"))?;
        }
        Ok(sum)
    }

    /// The dense layers' gradient buffers on the device, as (table, buffer) in table order
    /// (without a sparse model's wide bias, which lives on the host): what a device encoder
    /// compresses without downloading them.
    pub fn dense_grad_buffers(&self) -> Vec<(&str, &B::Buf)> {
        let skip = usize::from(self.emb_dim.is_some());
        let names = self.dense[skip..].iter().map(|(n, _)| n.as_str());
        let bufs = self.layers.iter().flat_map(|l| [&l.dw, &l.db]);
        names.zip(bufs).collect()
    }

    /// The clock's gradients, downloaded.
    pub fn grads(&self) -> Result<Grads> {
        let b = &self.backend;
        let mut g = Grads::default();
        if let ModelSpec::Counter { len, .. } = self.spec {
            g.dense.push((self.dense[0].0.clone(), vec![-1.0; len]));
            return Ok(g);
        }
        let mut names = self.dense.iter().map(|(n, _)| n.clone());
        let mut name = || names.next().expect("a name per dense table");
        if self.emb_dim.is_some() {
            g.dense.push((name(), vec![self.dwide_bias as f32]));
        }
        for layer in &self.layers {
            let mut dw = vec![0.0; layer.fan_in * layer.fan_out];
            b.download(&layer.dw, &mut dw)?;
            let mut db = vec![0.0; layer.fan_out];
            b.download(&layer.db, &mut db)?;
            g.dense.push((name(), dw));
            g.dense.push((name(), db));
        }
        if let Some(rows) = &self.rows {
            let mut dwide = vec![0.0; rows.ids.len()];
            b.download(&rows.dwide, &mut dwide)?;
            g.sparse
                .push((self.sparse[0].0.clone(), rows.ids.clone(), dwide));
            if let Some(demb) = &rows.demb {
                let mut host = vec![0.0; b.len(demb)];
                b.download(demb, &mut host)?;
                g.sparse
                    .push((self.sparse[1].0.clone(), rows.ids.clone(), host));
            }
        }
        Ok(g)
    }
}

#[cfg(test)]
mod tests;
