//! The sparse updates a restart finds in the log, applied on demand: start-up only indexes
//! them (row → the positions of its logged gradients in the log file), so that a shard serves
//! again in the time it takes to read its log, whatever the rows that log touched.
//!
//! A pending row is never in the cache. The writer brings it up to date (from its latest image
//! in the log, or read from the store unless the log stored it; then every logged update that
//! row lacks applied in order, by its stamp) and writes it back before it first updates it,
//! and drains the rest oldest first between groups ([`Inner::write_back_step`]), which is what
//! moves the rows' tail past them; a pull answers a pending row from the same computation,
//! without caching it. A row stops being pending only after the write that brings the store
//! up to date, so a pull that finds it pending computes it (from the store as it is then: a
//! stored row's stamp says which logged updates it holds), and one that does not reads it from
//! the store.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use super::cell::Cell;
use super::rows::Row;
use super::table::Table;
use super::{Inner, Result};
use crate::store::{Store, StoreError};

/// Pending rows of one table, by id.
pub(super) type PendingRows = Vec<(u64, PendingRow)>;

/// Where a pending row is rebuilt from, before its logged updates.
#[derive(Debug, Clone, Copy)]
enum Base {
    /// The store's row.
    Store,
    /// The initializer: the row's first update in the log stored it (it was new).
    Fresh,
    /// An image of the row in the log (`writeback.rs`): file offset and length of its stored
    /// form.
    Image { offset: u64, len: u32 },
}

/// A pending row's logged updates.
#[derive(Debug, Clone)]
pub(super) struct PendingRow {
    base: Base,
    /// (record position, file offset of the gradient), oldest first, after the base.
    updates: Vec<(u64, u64)>,
}

#[derive(Debug, Default)]
struct State {
    rows: HashMap<(u32, u64), PendingRow, foldhash::fast::RandomState>,
    /// (first update's position, table id, row id), oldest first; an entry whose row is no
    /// longer pending is done.
    order: VecDeque<(u64, u32, u64)>,
}

impl State {
    /// Pending row `id` of table `table`; when it is not pending yet, added with `base`, first
    /// seen in the record at `pos`, and counted in `added`.
    fn row(
        &mut self,
        table: u32,
        id: u64,
        pos: u64,
        base: Base,
        added: &mut u64,
    ) -> &mut PendingRow {
        let order = &mut self.order;
        self.rows.entry((table, id)).or_insert_with(|| {
            order.push_back((pos, table, id));
            *added += 1;
            PendingRow {
                base,
                updates: Vec::new(),
            }
        })
    }
}

/// The rows a restart left pending.
#[derive(Debug, Default)]
pub(super) struct Pending {
    state: Mutex<State>,
    /// Rows pending: 0 is the fast path of every read and push, which then takes no lock.
    rows: AtomicU64,
    /// The log file the offsets are in.
    file: std::sync::OnceLock<File>,
}

impl Pending {
    /// Whether no row is pending.
    pub(super) fn is_empty(&self) -> bool {
        self.rows.load(Ordering::Acquire) == 0
    }

    /// Rows pending.
    pub(super) fn len(&self) -> u64 {
        self.rows.load(Ordering::Acquire)
    }

    /// Start-up: the log file the updates are read from.
    pub(super) fn set_file(&self, file: File) {
        let _ = self.file.set(file);
    }

    /// Start-up: the rows of table `table` a push in the record at `pos` updated, each with
    /// its gradient's offset in the log file and whether the push stored the row.
    pub(super) fn add(&self, table: u32, pos: u64, rows: impl Iterator<Item = (u64, u64, bool)>) {
        let (mut state, mut added) = (self.state.lock(), 0);
        for (id, offset, new) in rows {
            let base = if new { Base::Fresh } else { Base::Store };
            let row = state.row(table, id, pos, base, &mut added);
            row.updates.push((pos, offset));
        }
        self.rows.fetch_add(added, Ordering::Release);
    }

    /// Start-up: rows the record at `pos` holds images of (table id, row id, file offset and
    /// length of the stored form). An image holds every update logged before it, so the row
    /// is rebuilt from it and the updates after it.
    pub(super) fn add_images(&self, pos: u64, rows: impl Iterator<Item = (u32, u64, u64, u32)>) {
        let (mut state, mut added) = (self.state.lock(), 0);
        for (table, id, offset, len) in rows {
            let base = Base::Image { offset, len };
            let row = state.row(table, id, pos, base, &mut added);
            row.base = base;
            row.updates.clear();
        }
        self.rows.fetch_add(added, Ordering::Release);
    }

    /// The pending updates of each of `ids` that has some. They stay pending until the writer,
    /// having written the rows back, calls [`Pending::done`]: a row stops being pending only
    /// once the store holds it up to date, so that a pull that finds it no longer pending
    /// reads it right from the store.
    pub(super) fn get(&self, table: u32, ids: &[u64]) -> Vec<(u64, PendingRow)> {
        if self.is_empty() {
            return Vec::new();
        }
        let state = self.state.lock();
        ids.iter()
            .filter_map(|&id| state.rows.get(&(table, id)).map(|p| (id, p.clone())))
            .collect()
    }

    /// Up to `max` of the rows whose first update is before `target`, oldest first (they stay
    /// pending until [`Pending::done`]).
    pub(super) fn oldest(&self, target: u64, max: usize) -> Vec<(u32, u64, PendingRow)> {
        if self.is_empty() {
            return Vec::new();
        }
        let mut state = self.state.lock();
        while let Some(&(_, table, id)) = state.order.front()
            && !state.rows.contains_key(&(table, id))
        {
            state.order.pop_front();
        }
        let mut out = Vec::new();
        for &(pos, table, id) in &state.order {
            if out.len() >= max || pos >= target {
                break;
            }
            if let Some(p) = state.rows.get(&(table, id)) {
                out.push((table, id, p.clone()));
            }
        }
        out
    }

    /// Rows of table `table` the store now holds up to date: no longer pending.
    pub(super) fn done(&self, table: u32, ids: impl Iterator<Item = u64>) {
        let mut state = self.state.lock();
        let mut n = 0;
        for id in ids {
            n += u64::from(state.rows.remove(&(table, id)).is_some());
        }
        self.rows.fetch_sub(n, Ordering::Release);
    }

    /// The position of the oldest pending update: the rows' tail may not pass it.
    pub(super) fn front(&self) -> Option<u64> {
        if self.is_empty() {
            return None;
        }
        let mut state = self.state.lock();
        loop {
            let &(pos, table, id) = state.order.front()?;
            if state.rows.contains_key(&(table, id)) {
                return Some(pos);
            }
            state.order.pop_front();
        }
    }

    /// Reads the logged gradient at `offset` into `out`.
    fn read(&self, offset: u64, bytes: &mut Vec<u8>, out: &mut [f32]) -> Result<(), StoreError> {
        self.read_bytes(offset, out.len() * 4, bytes)?;
        ps_core::payload::read_f32_le(bytes, out);
        Ok(())
    }

    /// Reads `len` bytes of the log file at `offset` into `bytes`.
    fn read_bytes(&self, offset: u64, len: usize, bytes: &mut Vec<u8>) -> Result<(), StoreError> {
        bytes.resize(len, 0);
        let file = self
            .file
            .get()
            .ok_or_else(|| StoreError::Corrupt("pending updates without their log".into()))?;
        file.read_exact_at(bytes, offset)?;
        Ok(())
    }
}

impl<S: Store> Inner<S> {
    /// Brings pending rows of `table` up to date: each from its image in the log, or read from
    /// the store (one read for all; a row the log stored starts from the initializer), then
    /// every logged update its stamp says it lacks, in order. The rows are not put anywhere.
    pub(super) fn pending_rows(
        &self,
        table: &Table,
        rows: Vec<(u64, PendingRow)>,
    ) -> Result<Vec<(u64, Row)>> {
        let dim = table.spec.row_dim();
        let stored: Vec<u64> = rows
            .iter()
            .filter(|(_, p)| matches!(p.base, Base::Store))
            .map(|r| r.0)
            .collect();
        let mut fetched = self.fetch_rows(table, &stored)?;
        let (mut grad, mut bytes) = (vec![0.0; dim], Vec::new());
        let mut out = Vec::with_capacity(rows.len());
        for (id, p) in rows {
            let mut row = match p.base {
                Base::Image { offset, len } => {
                    if len as usize != table.stored_row_bytes() {
                        return Err(StoreError::Corrupt(format!(
                            "the push log's image of row {id} of `{}` is {len} bytes",
                            table.spec.name
                        ))
                        .into());
                    }
                    self.pending.read_bytes(offset, len as usize, &mut bytes)?;
                    let (cell, stamp) = Cell::stored(&table.spec, dim, &bytes, None)?;
                    Row::new(cell, 0, stamp)
                }
                Base::Store | Base::Fresh => fetched.remove(&id).unwrap_or_else(|| {
                    Row::new(Cell::fresh(&table.spec, table.hash, id, dim), 0, 0)
                }),
            };
            let mut stamp = row.stamp.load(Ordering::Relaxed);
            for (pos, offset) in p.updates {
                if pos < stamp {
                    continue; // the stored row holds it
                }
                self.pending.read(offset, &mut bytes, &mut grad)?;
                table.apply_grad(&mut row.cell, &grad);
                stamp = pos + 1;
            }
            row.stamp.store(stamp, Ordering::Relaxed);
            out.push((id, row));
        }
        Ok(out)
    }

    /// Pending rows of the tables they belong to; those of a table dropped since are no
    /// longer pending.
    pub(super) fn by_table(
        &self,
        rows: Vec<(u32, u64, PendingRow)>,
    ) -> Vec<(Arc<Table>, PendingRows)> {
        let mut groups: HashMap<u32, PendingRows> = HashMap::new();
        for (table, id, p) in rows {
            groups.entry(table).or_default().push((id, p));
        }
        let tables = self.tables.read();
        let mut out = Vec::with_capacity(groups.len());
        for (id, rows) in groups {
            match tables.values().find(|t| t.id == id) {
                Some(table) => out.push((table.clone(), rows)),
                None => self.pending.done(id, rows.into_iter().map(|(row, _)| row)),
            }
        }
        out
    }
}
