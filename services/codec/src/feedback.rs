//! Error feedback: the sender keeps what a lossy codec dropped and adds it to the next gradient,
//! so that over any run the sum of what was sent plus what is still kept equals the sum of the
//! gradients. This is what lets top-k and sign compression train as well as dense SGD.

use std::collections::HashMap;
use std::ops::Range;

use crate::{CodecError, Encoded, Encoder};

/// Error feedback for one dense tensor (or any fixed-length vector).
#[derive(Debug, Clone, Default)]
pub struct ErrorFeedback {
    residual: Vec<f32>,
}

impl ErrorFeedback {
    pub fn new(len: usize) -> Self {
        Self {
            residual: vec![0.0; len],
        }
    }

    /// What is owed: gradient accumulated but not yet sent.
    pub fn residual(&self) -> &[f32] {
        &self.residual
    }

    /// Adds a gradient to what is owed. The first gradient sets the length.
    pub fn accumulate(&mut self, grad: &[f32]) -> Result<(), CodecError> {
        if self.residual.is_empty() {
            self.residual.resize(grad.len(), 0.0);
        }
        if grad.len() != self.residual.len() {
            return Err(CodecError::Header(format!(
                "a gradient of {} values for a residual of {}",
                grad.len(),
                self.residual.len()
            )));
        }
        for (r, g) in self.residual.iter_mut().zip(grad) {
            *r += g;
        }
        Ok(())
    }

    /// Adds `grad` to what is owed at `start..` of a vector of `len` values (a residual of
    /// another length is reset: the vector changed shape).
    pub fn accumulate_at(
        &mut self,
        len: usize,
        start: usize,
        grad: &[f32],
    ) -> Result<(), CodecError> {
        if self.residual.len() != len {
            self.residual = vec![0.0; len];
        }
        let end = start.saturating_add(grad.len());
        for (r, g) in self.range(start..end)?.iter_mut().zip(grad) {
            *r += g;
        }
        Ok(())
    }

    fn range(&mut self, range: Range<usize>) -> Result<&mut [f32], CodecError> {
        let len = self.residual.len();
        self.residual.get_mut(range.clone()).ok_or_else(|| {
            CodecError::Header(format!("range {range:?} is outside a residual of {len}"))
        })
    }

    /// Encodes what is owed in `range` and keeps only what the codec dropped.
    pub fn take(&mut self, enc: &mut Encoder, range: Range<usize>) -> Result<Encoded, CodecError> {
        let acc = self.range(range)?;
        let e = enc.encode(acc);
        if e.header.encoding.is_lossless() {
            acc.fill(0.0);
        } else {
            e.decode_add(acc, -1.0)?;
        }
        Ok(e)
    }

    /// Gives back what `take` sent from `range` when it was not delivered after all.
    pub fn restore(&mut self, range: Range<usize>, sent: &Encoded) -> Result<(), CodecError> {
        sent.decode_add(self.range(range)?, 1.0)
    }

    /// Accumulates `grad` and takes all of it: one step of error-fed compression.
    pub fn compress(&mut self, enc: &mut Encoder, grad: &[f32]) -> Result<Encoded, CodecError> {
        self.accumulate(grad)?;
        self.take(enc, 0..grad.len())
    }
}

/// Error feedback for the rows of an embedding table: one residual per row id, added to that
/// row's gradient the next time the row is pushed. Rows with nothing owed take no memory.
#[derive(Debug, Clone)]
pub struct RowErrorFeedback {
    dim: usize,
    rows: HashMap<u64, Vec<f32>>,
}

impl RowErrorFeedback {
    pub fn new(dim: usize) -> Self {
        Self {
            dim,
            rows: HashMap::new(),
        }
    }

    /// Rows that hold a residual.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The residual of row `id`, if it has one.
    pub fn residual(&self, id: u64) -> Option<&[f32]> {
        self.rows.get(&id).map(Vec::as_slice)
    }

    fn check(&self, ids: &[u64], values: usize) -> Result<(), CodecError> {
        if ids.len().checked_mul(self.dim) != Some(values) {
            return Err(CodecError::Header(format!(
                "{} ids of dim {} need {} values, got {values}",
                ids.len(),
                self.dim,
                ids.len().saturating_mul(self.dim)
            )));
        }
        Ok(())
    }

    /// Adds `rows` (row after row, for `ids`) into the residuals, summing duplicate ids.
    fn add_rows(&mut self, ids: &[u64], rows: &[f32]) {
        for (&id, row) in ids.iter().zip(rows.chunks_exact(self.dim.max(1))) {
            let r = self.rows.entry(id).or_insert_with(|| vec![0.0; self.dim]);
            for (a, b) in r.iter_mut().zip(row) {
                *a += b;
            }
        }
        self.rows.retain(|_, r| r.iter().any(|v| *v != 0.0));
    }

    /// Encodes the gradient rows of `ids` (each row plus its residual; a duplicate id gets its
    /// residual once) and keeps per row what the codec dropped.
    pub fn compress(
        &mut self,
        enc: &mut Encoder,
        ids: &[u64],
        grads: &[f32],
    ) -> Result<Encoded, CodecError> {
        self.check(ids, grads.len())?;
        let dim = self.dim;
        let mut acc = grads.to_vec();
        for (p, id) in ids.iter().enumerate() {
            if let Some(r) = self.rows.remove(id) {
                for (a, b) in acc[p * dim..(p + 1) * dim].iter_mut().zip(&r) {
                    *a += b;
                }
            }
        }
        let e = enc.encode(&acc);
        if !e.header.encoding.is_lossless() {
            e.decode_add(&mut acc, -1.0)?;
            self.add_rows(ids, &acc);
        }
        Ok(e)
    }

    /// Gives back what `compress` sent for `ids` when it was not delivered after all.
    pub fn restore(&mut self, ids: &[u64], sent: &Encoded) -> Result<(), CodecError> {
        self.check(ids, sent.header.num_values as usize)?;
        let decoded = sent.to_vec()?;
        self.add_rows(ids, &decoded);
        Ok(())
    }
}
