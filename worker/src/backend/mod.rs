//! The compute backend: where a model's tensors live and the few operations training needs.
//!
//! A model is written once against [`Backend`]; the CPU implementation ([`Cpu`]) runs
//! everywhere, and the CUDA one ([`Cuda`], loaded at run time, see [`cuda::select`]) plugs in
//! behind the same trait. Buffers are opaque
//! ([`Backend::Buf`]): data crosses between host and device only through [`Backend::upload`]
//! and [`Backend::download`], so a device backend keeps activations and gradients on the device
//! for a whole step. Index and label arrays are passed as host slices; a device backend copies
//! them over with the launch.
//!
//! Matrices are row-major f32. Every operation checks the sizes it is given against its buffers
//! and returns [`BackendError::Shape`] rather than reading out of bounds.

mod cpu;
pub mod cuda;
#[cfg(test)]
mod tests;

pub use cpu::Cpu;
pub use cuda::{Cuda, DeviceChoice, Selected};

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("shape mismatch in {op}: {detail}")]
    Shape { op: &'static str, detail: String },
    #[error("label {label} is out of range for {classes} classes")]
    Label { label: u32, classes: usize },
    #[error("device error: {0}")]
    Device(String),
}

pub type Result<T, E = BackendError> = std::result::Result<T, E>;

pub(crate) fn shape_err(op: &'static str, detail: impl Into<String>) -> BackendError {
    BackendError::Shape {
        op,
        detail: detail.into(),
    }
}

/// Two lengths that must be equal.
pub(crate) fn same_len(op: &'static str, a: usize, b: usize) -> Result<()> {
    if a == b {
        Ok(())
    } else {
        Err(shape_err(op, format!("lengths {a} and {b} differ")))
    }
}

/// `len` values as rows of `cols`: the number of rows.
pub(crate) fn rows_of(op: &'static str, len: usize, cols: usize) -> Result<usize> {
    if cols == 0 || !len.is_multiple_of(cols) {
        return Err(shape_err(
            op,
            format!("{len} values are not rows of {cols}"),
        ));
    }
    Ok(len / cols)
}

/// A GEMM's buffer lengths against its `m`, `n`, `k`.
pub(crate) fn check_gemm(m: usize, n: usize, k: usize, a: usize, b: usize, c: usize) -> Result<()> {
    if a != m * k || b != k * n || c != m * n {
        return Err(shape_err(
            "gemm",
            format!(
                "m={m} n={n} k={k} needs a={} b={} c={}, got {a} {b} {c}",
                m * k,
                k * n,
                m * n
            ),
        ));
    }
    Ok(())
}

/// Softmax cross-entropy's arguments, every label included, before anything is computed:
/// the number of rows.
pub(crate) fn check_softmax(
    logits: usize,
    labels: &[u32],
    classes: usize,
    grad: Option<usize>,
) -> Result<usize> {
    let rows = rows_of("softmax_xent", logits, classes)?;
    same_len("softmax_xent labels", labels.len(), rows)?;
    if let Some(g) = grad {
        same_len("softmax_xent grad", g, logits)?;
    }
    if let Some(&label) = labels.iter().find(|&&l| l as usize >= classes) {
        return Err(BackendError::Label { label, classes });
    }
    Ok(rows)
}

/// The logistic loss's arguments: one 0/1 label per logit.
pub(crate) fn check_sigmoid(logits: usize, labels: &[u32], grad: Option<usize>) -> Result<()> {
    same_len("sigmoid_xent labels", labels.len(), logits)?;
    if let Some(g) = grad {
        same_len("sigmoid_xent grad", g, logits)?;
    }
    if let Some(&label) = labels.iter().find(|&&l| l > 1) {
        return Err(BackendError::Label { label, classes: 2 });
    }
    Ok(())
}

/// An embedding bag's arguments: a table of `table` values in rows of `dim`, well-formed bags
/// over it, and `bagged` values (`bags x dim`) on the other side.
pub(crate) fn check_bags(
    op: &'static str,
    table: usize,
    dim: usize,
    bags: &Bags,
    bagged: usize,
) -> Result<()> {
    bags.check(rows_of(op, table, dim)?)?;
    same_len(op, bagged, bags.len() * dim)
}

/// Which operand of a GEMM is transposed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trans {
    N,
    T,
}

/// Bags of rows for an embedding bag: bag `b` is the weighted sum of rows
/// `rows[offsets[b]..offsets[b+1]]` (indices into a table of gathered rows) with `weights` at the
/// same positions.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Bags {
    pub offsets: Vec<u32>,
    pub rows: Vec<u32>,
    pub weights: Vec<f32>,
}

impl Bags {
    pub fn len(&self) -> usize {
        self.offsets.len().saturating_sub(1)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bag `b`'s (row, weight) pairs.
    pub fn bag(&self, b: usize) -> impl Iterator<Item = (usize, f32)> + '_ {
        let (s, e) = (self.offsets[b] as usize, self.offsets[b + 1] as usize);
        self.rows[s..e]
            .iter()
            .zip(&self.weights[s..e])
            .map(|(&r, &w)| (r as usize, w))
    }

    /// Checks that the bags are well formed for a table of `num_rows` rows.
    pub fn check(&self, num_rows: usize) -> Result<()> {
        let n = self.rows.len();
        if self.weights.len() != n
            || self.offsets.first() != Some(&0)
            || self.offsets.last().map(|&o| o as usize) != Some(n)
            || self.offsets.windows(2).any(|w| w[0] > w[1])
        {
            return Err(shape_err(
                "bags",
                format!(
                    "offsets must rise from 0 to {n} and weights match rows ({} weights)",
                    self.weights.len()
                ),
            ));
        }
        if let Some(r) = self.rows.iter().find(|&&r| r as usize >= num_rows) {
            return Err(shape_err(
                "bags",
                format!("row {r} of a table of {num_rows} rows"),
            ));
        }
        Ok(())
    }
}

/// Loss and correct predictions of a batch (sums over its rows, not means).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LossSum {
    pub loss: f64,
    pub correct: usize,
}

/// The operations a model needs, on buffers that live where the backend computes.
pub trait Backend: Send + Sync + 'static {
    /// A buffer of f32 on the device.
    type Buf: Send + Sync;

    fn name(&self) -> &'static str;

    /// A buffer of `len` zeros.
    fn zeros(&self, len: usize) -> Result<Self::Buf>;
    /// A device copy of `host`.
    fn upload(&self, host: &[f32]) -> Result<Self::Buf>;
    /// Overwrites `dst` with `host` (same length).
    fn write(&self, dst: &mut Self::Buf, host: &[f32]) -> Result<()>;
    /// Copies `src` into `host` (same length).
    fn download(&self, src: &Self::Buf, host: &mut [f32]) -> Result<()>;
    fn len(&self, buf: &Self::Buf) -> usize;

    /// `c = alpha * op(a) * op(b) + beta * c`, where `op(a)` is `m x k`, `op(b)` is `k x n` and
    /// `c` is `m x n`.
    #[allow(clippy::too_many_arguments)]
    fn gemm(
        &self,
        ta: Trans,
        tb: Trans,
        m: usize,
        n: usize,
        k: usize,
        alpha: f32,
        a: &Self::Buf,
        b: &Self::Buf,
        beta: f32,
        c: &mut Self::Buf,
    ) -> Result<()>;

    /// Adds `bias` (length `cols`) to every row of `x` (`rows x cols`).
    fn add_row_bias(&self, x: &mut Self::Buf, bias: &Self::Buf, cols: usize) -> Result<()>;
    /// `out += ` the column sums of `x` (`rows x cols`; `out` has length `cols`).
    fn sum_rows_into(&self, x: &Self::Buf, cols: usize, out: &mut Self::Buf) -> Result<()>;
    /// `x = max(x, 0)`.
    fn relu(&self, x: &mut Self::Buf) -> Result<()>;
    /// `dy = 0` where the ReLU output `y` is 0.
    fn relu_backward(&self, y: &Self::Buf, dy: &mut Self::Buf) -> Result<()>;
    /// `x += y`.
    fn add(&self, x: &mut Self::Buf, y: &Self::Buf) -> Result<()>;
    /// `x *= alpha`.
    fn scale(&self, x: &mut Self::Buf, alpha: f32) -> Result<()>;

    /// Softmax cross-entropy of `logits` (`rows x classes`) against `labels`: the summed loss
    /// and the rows whose arg-max is the label. With `grad`, writes `scale * (softmax - onehot)`
    /// into it.
    fn softmax_xent(
        &self,
        logits: &Self::Buf,
        labels: &[u32],
        classes: usize,
        scale: f32,
        grad: Option<&mut Self::Buf>,
    ) -> Result<LossSum>;

    /// Logistic loss of `logits` (one per row) against 0/1 `labels`; with `grad`, writes
    /// `scale * (sigmoid - label)` into it. Also returns the probabilities (for AUC).
    fn sigmoid_xent(
        &self,
        logits: &Self::Buf,
        labels: &[u32],
        scale: f32,
        grad: Option<&mut Self::Buf>,
        probs: &mut Vec<f32>,
    ) -> Result<LossSum>;

    /// Embedding bag: `out[b] = sum_j weights[j] * table[rows[j]]` over bag `b`'s positions `j`
    /// (`table` is `num_rows x dim`, `out` is `bags x dim`).
    fn bag_forward(
        &self,
        table: &Self::Buf,
        dim: usize,
        bags: &Bags,
        out: &mut Self::Buf,
    ) -> Result<()>;

    /// The bag's backward, a scatter-add: `dtable[rows[j]] += weights[j] * dout[b]`.
    fn bag_backward(
        &self,
        dout: &Self::Buf,
        dim: usize,
        bags: &Bags,
        dtable: &mut Self::Buf,
    ) -> Result<()>;
}
