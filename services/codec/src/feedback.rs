//! Error feedback: the sender keeps what a lossy codec dropped and adds it to the next gradient,
//! so that over any run the sum of what was sent plus what is still kept equals the sum of the
//! gradients. This is what lets top-k and sign compression train as well as dense SGD.

use std::ops::Range;

use crate::{CodecError, Encoded, Encoder, IdMap};

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
///
/// The residuals live in one arena (`dim` values a slot, freed slots reused), found by id
/// through one [`IdMap`]: a push looks its rows up once, together (their cache misses
/// overlap), and allocates nothing per row.
///
/// The arena holds at most `max_rows` rows. A table's rows can far outnumber what a worker
/// should keep (a residual for every row it ever pushed), so when a row needs a slot and none
/// is free, a CLOCK sweep drops the residual of a row not used since the hand last passed it
/// (what it owed is lost: [`RowErrorFeedback::evicted`] counts such rows). A row enters
/// idle and is marked used when pushed again, so rows pushed once go first. The rows of the
/// push being encoded are never the ones dropped; a push with more rows than `max_rows` keeps
/// the residuals of those it finds room for.
#[derive(Debug, Clone)]
pub struct RowErrorFeedback {
    dim: usize,
    max_rows: usize,
    /// Row id to its slot in `values`.
    slots: IdMap,
    values: Vec<f32>,
    /// Per slot: the row it holds and its CLOCK state (`FREE`, `IDLE`, `USED`, `PINNED`).
    owner: Vec<u64>,
    state: Vec<u8>,
    free: Vec<u32>,
    hand: usize,
    evicted: u64,
    /// Set when a sweep found every slot pinned: the rest of this push looks for no room.
    full: bool,
    /// What each dropped residual owed, for the tests' conservation check.
    #[cfg(test)]
    pub(crate) dropped: Vec<(u64, Vec<f32>)>,
}

/// A slot's CLOCK states: free; holding a row the hand may drop; holding a row used since the
/// hand last passed (the hand makes it idle); holding a row of the push being encoded.
const FREE: u8 = 0;
const IDLE: u8 = 1;
const USED: u8 = 2;
const PINNED: u8 = 3;

impl RowErrorFeedback {
    /// Residuals for rows of `dim` values, as many rows as there are.
    pub fn new(dim: usize) -> Self {
        Self::bounded(dim, usize::MAX)
    }

    /// Residuals for at most `max_rows` rows of `dim` values (at least one).
    pub fn bounded(dim: usize, max_rows: usize) -> Self {
        Self {
            dim,
            max_rows: max_rows.clamp(1, u32::MAX as usize),
            slots: IdMap::new(),
            values: Vec::new(),
            owner: Vec::new(),
            state: Vec::new(),
            free: Vec::new(),
            hand: 0,
            evicted: 0,
            full: false,
            #[cfg(test)]
            dropped: Vec::new(),
        }
    }

    /// How many rows of `dim` values fit in `bytes`: each takes its values, its id and state
    /// and its bucket in the map (with the map's spare room, at most [`IdMap::BYTES_PER_ID`]'s
    /// larger figure).
    pub fn rows_in(bytes: usize, dim: usize) -> usize {
        bytes / (dim * 4 + 8 + 1 + IdMap::BYTES_PER_ID.1)
    }

    /// Rows that hold a residual.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Rows whose residual was dropped to make room for another's.
    pub fn evicted(&self) -> u64 {
        self.evicted
    }

    /// The residual of row `id`, if it has one.
    pub fn residual(&self, id: u64) -> Option<&[f32]> {
        self.slots.get(id).map(|s| self.slot(s))
    }

    fn slot(&self, s: u32) -> &[f32] {
        let at = s as usize * self.dim;
        &self.values[at..at + self.dim]
    }

    fn slot_mut(&mut self, s: u32) -> &mut [f32] {
        let at = s as usize * self.dim;
        &mut self.values[at..at + self.dim]
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

    /// Gives slot `s` (holding `id`) back.
    fn release(&mut self, id: u64, s: u32) {
        if self.slots.remove(id).is_some() {
            self.state[s as usize] = FREE;
            self.free.push(s);
        }
    }

    /// A slot nobody holds: a free one, a new one while under `max_rows`, or one whose idle row
    /// the CLOCK hand drops. `None` when every slot holds a row of this push.
    fn vacant(&mut self) -> Option<u32> {
        if let Some(s) = self.free.pop() {
            self.slot_mut(s).fill(0.0);
            return Some(s);
        }
        let n = self.state.len();
        if self.full {
            return None;
        }
        if n < self.max_rows {
            self.values.resize(self.values.len() + self.dim, 0.0);
            self.owner.push(0);
            self.state.push(FREE);
            return Some(n as u32);
        }
        // Two turns find an idle row unless every slot is pinned (the first makes used ones
        // idle).
        for _ in 0..2 * n {
            let s = self.hand;
            self.hand = (self.hand + 1) % n;
            match self.state[s] {
                USED => self.state[s] = IDLE,
                IDLE => {
                    let id = self.owner[s];
                    self.slots.remove(id);
                    self.evicted += 1;
                    #[cfg(test)]
                    self.dropped.push((id, self.slot(s as u32).to_vec()));
                    self.slot_mut(s as u32).fill(0.0);
                    return Some(s as u32);
                }
                _ => {}
            }
        }
        // Every slot holds a row of this push; until it ends, none will free up.
        self.full = true;
        None
    }

    /// The slot of row `id`, pinned for this push, and whether it is new: a zeroed one made
    /// for it when it has none.
    fn slot_for(&mut self, id: u64) -> Option<(u32, bool)> {
        if let Some(s) = self.slots.get(id) {
            self.state[s as usize] = PINNED;
            return Some((s, false));
        }
        let s = self.vacant()?;
        self.slots.insert(id, s);
        self.owner[s as usize] = id;
        self.state[s as usize] = PINNED;
        Some((s, true))
    }

    /// Adds `rows` (row after row, for `ids`, whose slots are `known` where already found and
    /// pinned) into the residuals, summing duplicate ids. A row whose residual comes to zero
    /// gives its slot back; only the rows of `ids` are looked at, so the cost is that of the
    /// push, however many rows hold a residual. A row that finds no slot (every one holds a
    /// row of this push) keeps nothing, and counts as evicted.
    fn add_rows(&mut self, ids: &[u64], rows: &[f32], known: Option<&[Option<u32>]>) {
        let dim = self.dim.max(1);
        self.full = false;
        let mut touched = Vec::with_capacity(ids.len());
        for (p, (&id, row)) in ids.iter().zip(rows.chunks_exact(dim)).enumerate() {
            let (s, fresh) = match known.and_then(|k| k[p]) {
                Some(s) => (s, false),
                None => match self.slot_for(id) {
                    Some(found) => found,
                    None => {
                        if row.iter().any(|v| *v != 0.0) {
                            self.evicted += 1;
                            #[cfg(test)]
                            self.dropped.push((id, row.to_vec()));
                        }
                        continue;
                    }
                },
            };
            for (a, b) in self.slot_mut(s).iter_mut().zip(row) {
                *a += b;
            }
            touched.push((id, s, fresh));
        }
        // A row new to the residuals starts idle, so the hand drops a row pushed once before
        // one pushed again (the tail of a skewed id law before its head). A duplicate id is
        // touched twice: found the second time, so used.
        for (id, s, fresh) in touched {
            if self.slot(s).iter().all(|v| *v == 0.0) {
                self.release(id, s);
            } else {
                self.state[s as usize] = if fresh { IDLE } else { USED };
            }
        }
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
        // The rows are found first, and their residuals' cache lines asked for, before any is
        // used: the lookups do not depend on each other, so their cache misses (the map's,
        // the residual's) overlap. A worker's table of residuals grows with the rows it has
        // pushed, far past the processor's caches; one lookup after another, each waiting
        // for its misses, was most of a push's encoding.
        let mut known = Vec::new();
        let (state, values) = (&mut self.state, &self.values);
        self.slots.get_many(ids, &mut known, |s| {
            state[s as usize] = PINNED;
            let at = s as usize * dim;
            for line in values[at..at + dim].iter().step_by(16) {
                crate::prefetch(line);
            }
        });
        for (p, s) in known.iter().enumerate() {
            if let Some(s) = *s {
                // Taken into this push: the slot is emptied (a duplicate id adds nothing more)
                // and refilled below with what the codec drops.
                let at = s as usize * dim;
                for (a, r) in acc[p * dim..(p + 1) * dim]
                    .iter_mut()
                    .zip(&mut self.values[at..at + dim])
                {
                    *a += *r;
                    *r = 0.0;
                }
            }
        }
        let e = enc.encode(&acc);
        if e.header.encoding.is_lossless() {
            // Everything went: the emptied slots are free again.
            for (&id, s) in ids.iter().zip(&known) {
                if let Some(s) = *s {
                    self.release(id, s);
                }
            }
        } else {
            // Should the encoding not decode, the rows keep all they owe (and are unpinned).
            let decoded = e.decode_add(&mut acc, -1.0);
            self.add_rows(ids, &acc, Some(&known));
            decoded?;
        }
        Ok(e)
    }

    /// Gives back what `compress` sent for `ids` when it was not delivered after all.
    pub fn restore(&mut self, ids: &[u64], sent: &Encoded) -> Result<(), CodecError> {
        self.check(ids, sent.header.num_values as usize)?;
        let decoded = sent.to_vec()?;
        self.add_rows(ids, &decoded, None);
        Ok(())
    }
}
