//! A cell: one chunk of a dense table or one row of a sparse table, its parameters followed by
//! its optimizer state, and how a cell is read back from its stored form.

use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use bytes::Bytes;
use ps_core::TableSpec;

use crate::optim;

/// One chunk of a dense table or one row of a sparse table: parameters, then optimizer state.
#[derive(Debug)]
pub(super) struct Cell {
    pub(super) step: u64,
    /// `n` parameters followed by `n * state_slots` optimizer values.
    pub(super) data: Values,
}

/// A cell's values, shared copy-on-write: a pull's answer holds them ([`Values::params`]) until
/// the socket has taken them, without the cell's lock and without a copy, and an update of the
/// cell meanwhile writes into a copy of its own (the first mutable borrow copies them; an
/// unshared cell, the usual case, is updated in place).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Values(Arc<[f32]>);

impl Values {
    /// `len` zeros, allocated once (with the shared count in the same allocation).
    pub(super) fn zeroed(len: usize) -> Self {
        Self(std::iter::repeat_n(0.0, len).collect())
    }

    /// The bytes of the first `n` values (the parameters), sharing the cell's memory: what a
    /// plain f32 pull answers (`Payload::encode_plain_shared`).
    pub(super) fn params(&self, n: usize) -> Bytes {
        Bytes::from_owner(Params {
            values: Arc::clone(&self.0),
            n: n.min(self.0.len()),
        })
    }
}

impl From<Vec<f32>> for Values {
    fn from(v: Vec<f32>) -> Self {
        Self(v.into())
    }
}

impl Deref for Values {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        &self.0
    }
}

impl DerefMut for Values {
    /// The values to update: in place when nothing else holds them, else a copy of them that
    /// this cell then holds alone (what held them keeps the values as they were).
    fn deref_mut(&mut self) -> &mut [f32] {
        Arc::make_mut(&mut self.0)
    }
}

/// The parameters a pull's answer holds: the bytes of `values[..n]` (see [`Values::params`]).
struct Params {
    values: Arc<[f32]>,
    n: usize,
}

impl AsRef<[u8]> for Params {
    fn as_ref(&self) -> &[u8] {
        bytemuck::cast_slice(&self.values[..self.n])
    }
}

impl Cell {
    /// A cell of `n` values read from the store, and its stamp: its parameters, then (when
    /// its optimizer keeps state) the step and the state values; `None` for the state of an
    /// SGD cell. A sparse row's parameters may carry its step, state and stamp after them
    /// (one entry per row, [`super::table::Table::put_row`]); `state` is then not read.
    pub(super) fn stored(
        spec: &TableSpec,
        n: usize,
        params: &[u8],
        state: Option<&[u8]>,
    ) -> Result<(Self, u64), crate::store::StoreError> {
        let slots = spec.optimizer.state_slots();
        let mut data = Values::zeroed(n * (1 + slots));
        let (params, whole, stamp) = split_stamped(params, n, slots);
        let state = whole.or(state);
        super::keys::read_f32s(params, &mut data[..n])?;
        let step = match state {
            // An SGD row stored with its stamp carries its step too.
            Some(state) if slots > 0 || whole.is_some() => read_state(state, &mut data[n..])?,
            None if slots > 0 => {
                return Err(crate::store::StoreError::Corrupt(
                    "a stored row without its optimizer state".into(),
                ));
            }
            _ => 0,
        };
        Ok((Self { step, data }, stamp))
    }

    /// Sets the cell's step and optimizer state (after its `n` parameters) from their stored
    /// form.
    pub(super) fn load_state(
        &mut self,
        n: usize,
        stored: &[u8],
    ) -> Result<(), crate::store::StoreError> {
        self.step = read_state(stored, &mut self.data[n..])?;
        Ok(())
    }

    pub(super) fn fresh(spec: &TableSpec, table_hash: u64, key: u64, n: usize) -> Self {
        let mut data = Values::zeroed(n * (1 + spec.optimizer.state_slots()));
        spec.initializer.fill(table_hash, key, &mut data[..n]);
        data[n..].copy_from_slice(&optim::initial_state(&spec.optimizer, n));
        Self { step: 0, data }
    }

    /// The stored form of the optimizer state: step count, then the state values.
    pub(super) fn encode_state<'a>(&self, n: usize, buf: &'a mut Vec<u8>) -> &'a [u8] {
        buf.clear();
        self.append_state(n, buf);
        buf
    }

    /// Appends the stored form of the optimizer state to `buf`.
    pub(super) fn append_state(&self, n: usize, buf: &mut Vec<u8>) {
        buf.extend_from_slice(&self.step.to_le_bytes());
        buf.extend_from_slice(bytemuck::cast_slice(&self.data[n..]));
    }
}

/// A stored row of `n` values: its parameters, and the step and state a row stored as one
/// entry ([`super::table::Table::put_row`]) carries after them.
pub(super) fn split_row(stored: &[u8], n: usize) -> (&[u8], Option<&[u8]>) {
    match stored.split_at_checked(n * 4) {
        Some((params, after)) if !after.is_empty() => (params, Some(after)),
        _ => (stored, None),
    }
}

/// A stored sparse row of `n` values with `slots` state slots: its parameters, its step and
/// state when it carries them, and its stamp: the log position (plus one) of the last logged
/// update it holds, 0 for rows stored without one. The forms, told apart by their length:
/// parameters alone (`n` floats, an SGD row or the first of two entries), parameters, step
/// and state (one entry, written before stamps), and parameters, step, state and stamp.
pub(super) fn split_stamped(stored: &[u8], n: usize, slots: usize) -> (&[u8], Option<&[u8]>, u64) {
    let stamped = n * 4 * (1 + slots) + 16;
    if stored.len() == stamped {
        let (row, stamp) = stored.split_at(stamped - 8);
        let stamp = u64::from_le_bytes(stamp.try_into().unwrap_or_default());
        let (params, state) = row.split_at(n * 4);
        return (params, Some(state), stamp);
    }
    let (params, state) = split_row(stored, n);
    (params, state, 0)
}

/// Reads a stored optimizer state (the step count, then the state values) into `state`;
/// returns the step.
fn read_state(stored: &[u8], state: &mut [f32]) -> Result<u64, crate::store::StoreError> {
    if stored.len() < 8 {
        return Err(crate::store::StoreError::Corrupt("optimizer state".into()));
    }
    super::keys::read_f32s(&stored[8..], state)?;
    super::keys::le_u64(&stored[..8])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn le(values: &[f32]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    #[test]
    fn a_pulls_bytes_keep_the_values_they_were_given_while_the_cell_is_updated() {
        // Parameters 1, 2, 3, then three optimizer values.
        let mut values = Values::from(vec![1.0, 2.0, 3.0, 10.0, 20.0, 30.0]);
        let pulled = values.params(3);
        assert_eq!(&pulled[..], &le(&[1.0, 2.0, 3.0])[..]);
        // Shared with the cell: no copy was made for the answer.
        assert_eq!(pulled.as_ptr(), values.as_ptr().cast::<u8>());
        let before = values.as_ptr();
        values[0] = 5.0;
        values[4] = 0.5;
        // The update wrote into a copy of its own; the answer still holds what was pulled.
        assert_ne!(values.as_ptr(), before);
        assert_eq!(&pulled[..], &le(&[1.0, 2.0, 3.0])[..]);
        assert_eq!(&values[..], &[5.0, 2.0, 3.0, 10.0, 0.5, 30.0]);
        // A later pull sees the update.
        assert_eq!(&values.params(3)[..], &le(&[5.0, 2.0, 3.0])[..]);
        // More than the cell holds is the whole cell, never past it.
        assert_eq!(values.params(99).len(), 6 * 4);
    }

    #[test]
    fn an_unshared_cell_is_updated_in_place() {
        let mut values = Values::from(vec![1.0; 4]);
        let pulled = values.params(2);
        drop(pulled);
        let at = values.as_ptr();
        values[1] = 7.0;
        assert_eq!(values.as_ptr(), at, "no pull holds the values: no copy");
        assert_eq!(&values[..], &[1.0, 7.0, 1.0, 1.0]);
    }
}
