//! Rows a client holds from its earlier pulls of a sparse table, so that a pull asks the shards
//! only for the rows that changed since.
//!
//! A pull sends, beside its ids, a bit per id saying the client holds that row and the
//! [`row_digest`] of each held row's values as it last got them (under the table's pull codec).
//! The shard answers a held row whose values under that codec still have that digest as
//! unchanged, without its values; the client copies them from what it holds. The rule needs no
//! state on the shards and no clocks: it compares values, so it is exact under any consistency
//! model (two different rows share a 64-bit digest with a chance of about 2^-64).
//!
//! Only codecs whose rows are rounded each on its own qualify
//! ([`ps_codec::PullCodec::rows_stand_alone`]): under int8 with a row shorter than a block, a
//! row's scale depends on the rows sent beside it.
//!
//! The memory is bounded: at most `max_rows` rows; past it a CLOCK sweep drops a row not asked
//! for since the hand last passed it.

use ps_codec::{IdMap, prefetch};
use ps_core::Held;
use ps_core::hash::row_digest;

/// One sparse table's rows as last pulled, with their digests.
#[derive(Debug)]
pub(crate) struct HeldRows {
    dim: usize,
    max_rows: usize,
    /// Row id to its slot.
    slots: IdMap,
    values: Vec<f32>,
    /// Per slot: the row it holds, its digest, and whether it was asked for since the CLOCK
    /// hand last passed.
    owner: Vec<u64>,
    digests: Vec<u64>,
    used: Vec<bool>,
    hand: usize,
}

impl HeldRows {
    /// Bytes a held row of `dim` values takes: its values, id, digest, state and its bucket
    /// in the map (with the map's spare room, at most [`IdMap::BYTES_PER_ID`]'s larger figure).
    fn row_bytes(dim: usize) -> usize {
        dim * 4 + 8 + 8 + 1 + IdMap::BYTES_PER_ID.1
    }

    /// Rows of `dim` values, at most as many as fit in `bytes` (at least one).
    pub fn new(dim: usize, bytes: usize) -> Self {
        Self {
            dim,
            max_rows: (bytes / Self::row_bytes(dim)).clamp(1, u32::MAX as usize),
            slots: IdMap::new(),
            values: Vec::new(),
            owner: Vec::new(),
            digests: Vec::new(),
            used: Vec::new(),
            hand: 0,
        }
    }

    /// The length of the rows held.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// For the ids at `positions` of `ids`: the held bits and digests to send, with each held
    /// row's values copied into `out` (row `p` of `out` for position `p`), so that an answer of
    /// "unchanged" needs nothing more from here (another pull may replace the row meanwhile).
    pub fn ask(&mut self, ids: &[u64], positions: &[usize], out: &mut [f32]) -> Held {
        let dim = self.dim;
        let mut held = Held::clear(positions.len());
        // Every row found first, its values asked for as it is found, then copied: the
        // lookups' cache misses overlap (see `IdMap::get_many`).
        let asked: Vec<u64> = positions.iter().map(|&p| ids[p]).collect();
        let mut slots = Vec::new();
        let (values, digests) = (&self.values, &self.digests);
        self.slots.get_many(&asked, &mut slots, |s| {
            let s = s as usize;
            prefetch(&digests[s]);
            for line in values[s * dim..(s + 1) * dim].iter().step_by(16) {
                prefetch(line);
            }
        });
        for (i, (&p, s)) in positions.iter().zip(slots).enumerate() {
            if let Some(s) = s {
                let s = s as usize;
                held.mark(i);
                held.digests.push(self.digests[s]);
                self.used[s] = true;
                out[p * dim..(p + 1) * dim].copy_from_slice(&self.values[s * dim..(s + 1) * dim]);
            }
        }
        if held.digests.is_empty() {
            held.mask.clear();
        }
        held
    }

    /// Keeps `rows` (row after row) as the values of rows `ids`.
    pub fn keep(&mut self, ids: &[u64], rows: &[f32]) {
        let dim = self.dim;
        for (i, (&id, row)) in ids.iter().zip(rows.chunks_exact(dim)).enumerate() {
            // Each lookup's bucket asked for ahead (see `IdMap::get_many`); each row is looked
            // up in its turn, as a row kept before it may have taken an earlier one's slot.
            if let Some(&next) = ids.get(i + IdMap::AHEAD) {
                self.slots.prefetch(next);
            }
            let s = match self.slots.get(id) {
                Some(s) => s as usize,
                None => {
                    let s = self.vacant();
                    self.slots.insert(id, s as u32);
                    self.owner[s] = id;
                    s
                }
            };
            self.values[s * dim..(s + 1) * dim].copy_from_slice(row);
            self.digests[s] = row_digest(row);
        }
    }

    /// A slot for a new row: a new one while under `max_rows`, else one whose row the CLOCK
    /// hand drops (every row asked for since its last pass gets one more turn).
    fn vacant(&mut self) -> usize {
        let n = self.owner.len();
        if n < self.max_rows {
            self.values.resize(self.values.len() + self.dim, 0.0);
            self.owner.push(0);
            self.digests.push(0);
            self.used.push(false);
            return n;
        }
        loop {
            let s = self.hand;
            self.hand = (self.hand + 1) % n;
            if std::mem::take(&mut self.used[s]) {
                continue;
            }
            self.slots.remove(self.owner[s]);
            return s;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Room for exactly `rows` rows of `dim`.
    fn room(rows: usize, dim: usize) -> HeldRows {
        HeldRows::new(dim, rows * HeldRows::row_bytes(dim))
    }

    #[test]
    fn held_rows_go_out_with_their_digests_and_values() {
        let mut h = room(4, 2);
        h.keep(&[10, 20], &[1.0, 2.0, 3.0, 4.0]);
        h.keep(&[10], &[5.0, 6.0]);
        let ids = [20, 99, 10];
        let mut out = vec![0.0; 6];
        let asked = h.ask(&ids, &[0, 1, 2], &mut out);
        assert_eq!(asked.mask, vec![0b101]);
        assert_eq!(
            asked.digests,
            vec![row_digest(&[3.0, 4.0]), row_digest(&[5.0, 6.0])]
        );
        assert_eq!(out, vec![3.0, 4.0, 0.0, 0.0, 5.0, 6.0]);
        // Nothing held among these: no mask at all.
        assert_eq!(h.ask(&[1, 2], &[0, 1], &mut [0.0; 4]), Held::default());
    }

    #[test]
    fn a_full_store_drops_a_row_not_asked_for_lately() {
        let mut h = room(3, 1);
        h.keep(&[1, 2, 3], &[1.0, 2.0, 3.0]);
        // 1 and 3 asked for: the hand passes them once and drops 2.
        h.ask(&[1, 3], &[0, 1], &mut [0.0; 2]);
        h.keep(&[4], &[4.0]);
        let held = |h: &mut HeldRows, id: u64| h.ask(&[id], &[0], &mut [0.0]).count() == 1;
        assert!(!held(&mut h, 2));
        assert!(held(&mut h, 1) && held(&mut h, 3) && held(&mut h, 4));
        assert_eq!(h.slots.len(), 3);
    }
}
