//! The push log: where a durable shard writes the gradients its pushes applied (dense chunks,
//! and the rows of sparse tables it writes back), instead of writing every updated cell into
//! RocksDB.
//!
//! Through RocksDB each updated cell was copied into the write batch, the WAL and the
//! memtable, then flushed to a fresh SST file and compacted. The log is one preallocated file
//! used as a ring: each group commit appends one record (the gradients it applied, with the
//! push ids), written in place over pages the kernel already holds. Two stored positions say
//! what the store covers: the dense cells' (`S`, from a snapshot of them into RocksDB or an
//! image in the log) and the sparse rows' (every logged row update before it is in the store,
//! `engine/writeback.rs`). The log never overwrites a record at or after the older of the two
//! (its *tail*), so at open the store plus the records from there on, replayed through the
//! same optimizer in the same order, give back exactly the state that was acknowledged.
//!
//! A record: magic, CRC-32 of everything after it, its logical position, its length, and its
//! entries (one per push: table id, push id, then each chunk's index or row's id, length and
//! f32 gradient; a sparse row's length carries a flag when the push stored the row). A record
//! is placed when it begins, from the most it can hold (its rows are stamped with that
//! position); one that would not fit before the end of the file goes to the start of the next
//! lap. Replay stops at the first record whose magic, position or CRC is wrong: a torn tail, or
//! a previous lap's data.
//!
//! The log also takes *images*: one record holding every dense cell (parameters, optimizer
//! state and step count), written when the log runs out of room and the image fits in it. The
//! dense position then names the image, which frees the log behind it for a fraction of the
//! cost of writing the cells through RocksDB (WAL, memtable, flush and compaction). Replay sets
//! the cells from an image wherever it meets one. An image goes into the file cell by cell,
//! from the cells themselves, its header last: it is never gathered in memory. Records of
//! *rows* do the same for hot sparse rows: each entry is one row in its stored form (table id,
//! byte count, row id, then parameters, step, optimizer state and stamp), written instead of
//! writing the row back into RocksDB when the log needs the room its older updates take
//! (`engine/writeback.rs`).
//! Checkpoints and a clean stop still write the cells and the dirty rows into RocksDB, so that
//! a checkpoint needs nothing but the store.
//!
//! The file keeps the name it had when it held dense gradients only (`<db>.dense-log`, sized
//! by `dense_log_mib`), so that data directories written before read the same.

use std::fs::{File, OpenOptions};
use std::io::IoSlice;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use ps_core::PushId;

use crate::body_ring::BodyRing;
use crate::page_warmer::PageWarmer;

/// The push log's errors.
#[derive(Debug, thiserror::Error)]
pub enum PushLogError {
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// A record whose checksum is good does not parse: the log is damaged, not torn.
    #[error("{path} at position {position}: {reason}")]
    Corrupt {
        path: String,
        position: u64,
        reason: String,
    },
}

const MAGIC: u32 = 0x4C44_5350; // "PSDL"
const MAGIC_IMAGE: u32 = 0x4944_5350; // "PSDI"
const MAGIC_ROWS: u32 = 0x5244_5350; // "PSDR"
/// magic u32, crc u32, position u64, length u32, entries u32.
const HEADER: usize = 24;
/// table id u32, chunks u32, client u64, seq u64, floor u64.
const ENTRY: usize = 32;
/// chunk index u64, values u32.
const CHUNK: usize = 12;
/// An image's cell: table id u32, values u32, chunk index u64, step u64.
const CELL: usize = 24;
/// Set in a sparse row's value count: the push stored the row (it was new).
const NEW_ROW: u32 = 1 << 31;
/// A row image's entry: table id u32, bytes u32, row id u64.
const ROW: usize = 16;
/// Set in a dense chunk's value count: the record holds, instead of the values, where they
/// are in the body ring (`body_ring.rs`) and their CRC-32.
const IN_RING: u32 = 1 << 30;
/// A chunk's place in the body ring: position u64, CRC-32 u32.
const RING_REF: usize = 12;

/// What a record holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// The gradients of a group commit.
    Pushes,
    /// Every dense cell.
    Image,
    /// Sparse rows as they are in memory.
    Rows,
}

impl Kind {
    fn magic(self) -> u32 {
        match self {
            Kind::Pushes => MAGIC,
            Kind::Image => MAGIC_IMAGE,
            Kind::Rows => MAGIC_ROWS,
        }
    }

    fn of(magic: u32) -> Option<Self> {
        [Kind::Pushes, Kind::Image, Kind::Rows]
            .into_iter()
            .find(|k| k.magic() == magic)
    }
}

/// Where the log lives and how big it is.
#[derive(Debug, Clone)]
pub struct PushLogOptions {
    pub path: PathBuf,
    pub capacity: u64,
    /// fdatasync after every record (the store's `sync` option).
    pub sync: bool,
}

/// The log, owned by the engine's writer.
#[derive(Debug)]
pub struct PushLog {
    file: File,
    path: PathBuf,
    capacity: u64,
    sync: bool,
    /// Where the next record goes (logical: the file offset is this modulo the capacity).
    head: u64,
    /// The stored position the dense cells cover (the last snapshot's or image's): dense
    /// records from here on are live.
    dense_tail: u64,
    /// The stored position the sparse rows in the store cover (the oldest update of a row
    /// not yet written back): sparse entries from here on are live.
    rows_tail: u64,
    /// Where the record being built goes, fixed when it begins (its rows are stamped with it).
    at: u64,
    /// The record being built, kept between groups so its pages stay allocated; the
    /// gradients in `shared` are not in it.
    buf: Vec<u8>,
    /// Gradients the record holds as the pushes brought them ([`PushLog::chunk_shared`]):
    /// each with the offset in `buf` where it goes. They are checksummed and written from
    /// where they are, never copied into `buf`, each with the CRC-32 its caller took.
    shared: Vec<(usize, Bytes, u32)>,
    entries: u32,
    entry_at: Option<usize>,
    /// What the record being built holds.
    kind: Kind,
    /// Where large dense pushes' bodies are received (`body_ring.rs`), when this log has one.
    bodies: Option<Arc<BodyRing>>,
    /// The first ring position the record being built points at.
    ring_first: Option<u64>,
    /// The chunks the record being built holds in the ring, each with the offset in `buf` of
    /// its CRC-32 (the caller's), written there at [`PushLog::commit`]. Each holds its bytes
    /// until the record points at them.
    in_ring: Vec<(usize, Bytes, u32)>,
    /// An image is written into the file cell by cell, straight from the cells, as
    /// [`PushLog::image_cell`] is given them (it is as large as every dense cell together,
    /// so it is never gathered in `buf`): the room it began with, the bytes written after its
    /// header and their CRC-32, combined with the header's at [`PushLog::commit`].
    image_room: u64,
    image_written: u64,
    image_crc: crc32fast::Hasher,
    /// The thread reading the file's pages ahead of the head during its first lap in this
    /// process ([`PushLog::warm_ahead`]); `Warming::Done` after it.
    warmer: Warming,
}

/// Where warming the log's pages ahead of its head stands.
#[derive(Debug, Default)]
enum Warming {
    /// Not begun: no record has been placed yet.
    #[default]
    NotYet,
    On(PageWarmer),
    /// A lap has been read (or the thread could not start): nothing more to do.
    Done,
}

/// One push of a replayed record.
#[derive(Debug)]
pub struct LoggedPush<'a> {
    pub table_id: u32,
    pub push_id: PushId,
    /// The dense chunks or sparse rows it updated.
    pub chunks: Vec<LoggedChunk<'a>>,
}

/// One dense chunk's or sparse row's gradient in a replayed push.
#[derive(Debug, Clone, Copy)]
pub struct LoggedChunk<'a> {
    /// The chunk's index, or the row's id.
    pub index: u64,
    /// A sparse row the push stored (it was new).
    pub new: bool,
    /// The gradient, as little-endian f32 bytes. Empty for a chunk whose values are in the
    /// body ring, in a record before the position replay was asked to read bodies from.
    pub data: &'a [u8],
    /// Where the gradient starts in the log file (in the body ring, for a chunk held there).
    pub offset: u64,
}

/// One dense cell of a replayed image.
#[derive(Debug)]
pub struct CellImage<'a> {
    pub table_id: u32,
    pub index: u64,
    pub step: u64,
    /// Parameters then optimizer state, as little-endian f32 bytes.
    pub data: &'a [u8],
}

/// One sparse row of a replayed record of rows.
#[derive(Debug)]
pub struct RowImage<'a> {
    pub table_id: u32,
    pub id: u64,
    /// The row in its stored form: parameters, step, optimizer state and stamp.
    pub data: &'a [u8],
    /// Where `data` starts in the log file.
    pub offset: u64,
}

/// A replayed record.
#[derive(Debug)]
pub enum Logged<'a> {
    /// The gradients of a group commit, in push order.
    Pushes(Vec<LoggedPush<'a>>),
    /// Every dense cell as it was when the image was written.
    Image(Vec<CellImage<'a>>),
    /// Sparse rows as they were in memory when the record was written, each holding every
    /// logged update before it (`engine/writeback.rs`).
    Rows(Vec<RowImage<'a>>),
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap_or_default())
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or_default())
}

impl PushLog {
    /// Opens (or creates) the log file; nothing is read until [`PushLog::replay`].
    pub fn open(opts: &PushLogOptions) -> Result<Self, PushLogError> {
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&opts.path)?;
        if file.metadata()?.len() < opts.capacity {
            reserve(&file, opts.capacity).map_err(|e| {
                std::io::Error::new(
                    e.kind(),
                    format!(
                        "reserving {} MiB for the push log {} ({e}); free disk space or lower \
                         dense_log_mib",
                        opts.capacity >> 20,
                        opts.path.display()
                    ),
                )
            })?;
        }
        Ok(Self {
            file,
            path: opts.path.clone(),
            capacity: opts.capacity,
            sync: opts.sync,
            head: 0,
            dense_tail: 0,
            rows_tail: 0,
            at: 0,
            buf: Vec::new(),
            shared: Vec::new(),
            entries: 0,
            entry_at: None,
            kind: Kind::Pushes,
            bodies: None,
            ring_first: None,
            in_ring: Vec::new(),
            image_room: 0,
            image_written: 0,
            image_crc: crc32fast::Hasher::new(),
            warmer: Warming::NotYet,
        })
    }

    /// Has the file's pages from the head to `bytes` past it read, by a thread of its own, if
    /// this process has not yet written them (`page_warmer.rs`): what the next records and
    /// the next image will be written into.
    pub fn warm_ahead(&mut self, bytes: u64) {
        if let Warming::NotYet = self.warmer {
            self.warmer = PageWarmer::start(&self.file, self.capacity, self.head)
                .map_or(Warming::Done, Warming::On);
        }
        if let Warming::On(w) = &mut self.warmer
            && !w.ahead_to(self.head.saturating_add(bytes))
        {
            self.warmer = Warming::Done;
        }
    }

    /// Gives the log the ring its large dense pushes' bodies are received into: their
    /// records point there instead of holding the values.
    pub fn set_bodies(&mut self, ring: Option<Arc<BodyRing>>) {
        self.bodies = ring;
    }

    /// The ring large dense pushes' bodies are received into, if any.
    pub fn bodies(&self) -> Option<&Arc<BodyRing>> {
        self.bodies.as_ref()
    }

    /// Empties the log (for a new database, which must not read a stranger's records).
    pub fn reset(&mut self) -> Result<(), PushLogError> {
        self.file.set_len(0)?;
        reserve(&self.file, self.capacity)?;
        self.head = 0;
        self.dense_tail = 0;
        self.rows_tail = 0;
        // Its pages are new again.
        self.warmer = Warming::NotYet;
        if let Some(ring) = &self.bodies {
            ring.clear_references();
        }
        Ok(())
    }

    /// The largest record the log takes; a group with more goes to RocksDB whole.
    pub fn max_record(&self) -> u64 {
        self.capacity / 2
    }

    /// Bytes of a record holding `pushes` pushes with `chunks` chunks and `bytes` of gradients.
    pub fn record_len(pushes: usize, chunks: usize, bytes: usize) -> u64 {
        (HEADER + pushes * ENTRY + chunks * CHUNK + bytes) as u64
    }

    /// Bytes of an image of `cells` cells holding `floats` values in all.
    pub fn image_len(cells: usize, floats: usize) -> u64 {
        (HEADER + cells * CELL + floats * 4) as u64
    }

    /// The largest image the log takes: a quarter of it, so that records between two images
    /// have room.
    pub fn max_image(&self) -> u64 {
        self.capacity / 4
    }

    /// Where a record of `len` bytes would start: `head`, or the next lap when it does not fit.
    fn place(&self, len: u64) -> u64 {
        let off = self.head % self.capacity;
        if off + len <= self.capacity {
            self.head
        } else {
            self.head - off + self.capacity
        }
    }

    /// Whether a record of `len` bytes can be written without overwriting a live one; when it
    /// cannot, the caller frees the log first: a snapshot or an image of the dense cells
    /// ([`PushLog::set_dense_tail`]), the oldest dirty rows written back
    /// ([`PushLog::set_rows_tail`]).
    pub fn fits(&self, len: u64) -> bool {
        self.place(len) + len - self.tail() <= self.capacity
    }

    /// The position a snapshot taken now covers.
    pub fn head(&self) -> u64 {
        self.head
    }

    /// The oldest live position: records from here on may not be overwritten.
    pub fn tail(&self) -> u64 {
        self.dense_tail.min(self.rows_tail)
    }

    /// The live bytes of the log: from its tail to its head.
    pub fn live(&self) -> u64 {
        self.head - self.tail()
    }

    /// The stored position the dense cells cover.
    pub fn dense_tail(&self) -> u64 {
        self.dense_tail
    }

    /// The stored position the sparse rows in the store cover.
    pub fn rows_tail(&self) -> u64 {
        self.rows_tail
    }

    /// Records that the dense cells as stored (a snapshot, or an image at `pos`) cover
    /// everything before `pos`.
    pub fn set_dense_tail(&mut self, pos: u64) {
        self.dense_tail = pos;
        if let Some(ring) = &self.bodies {
            ring.release_before(pos);
        }
    }

    /// Records that the sparse rows as stored cover every entry before `pos`.
    pub fn set_rows_tail(&mut self, pos: u64) {
        self.rows_tail = pos;
    }

    /// Starts a record of at most `len` bytes ([`PushLog::record_len`]); its position is fixed
    /// now ([`PushLog::position`]), so the record may turn out shorter, never longer.
    pub fn begin(&mut self, len: u64) {
        self.start(len, Kind::Pushes);
        self.buf.reserve(usize::try_from(len).unwrap_or(0));
    }

    /// Places a record of at most `len` bytes holding `kind` and empties what the last one
    /// left; `buf` holds the header only.
    fn start(&mut self, len: u64, kind: Kind) {
        self.at = self.place(len);
        self.buf.clear();
        self.buf.resize(HEADER, 0);
        self.shared.clear();
        self.entries = 0;
        self.entry_at = None;
        self.kind = kind;
        self.ring_first = None;
        self.in_ring.clear();
        self.image_written = 0;
    }

    /// Starts an image of at most `len` bytes ([`PushLog::image_len`]); its cells go straight
    /// into the file ([`PushLog::image_cell`]), so nothing of its size is allocated.
    pub fn begin_image(&mut self, len: u64) {
        self.start(len, Kind::Image);
        self.image_room = len;
        self.image_crc = crc32fast::Hasher::new();
    }

    /// Bytes of a record of `rows` row images holding `bytes` of stored rows in all.
    pub fn rows_len(rows: usize, bytes: usize) -> u64 {
        (HEADER + rows * ROW + bytes) as u64
    }

    /// Starts a record of sparse rows, at most `len` bytes ([`PushLog::rows_len`]).
    pub fn begin_rows(&mut self, len: u64) {
        self.begin(len);
        self.kind = Kind::Rows;
    }

    /// Adds one sparse row, in its stored form (parameters, step, optimizer state, stamp), to
    /// the current record of rows.
    pub fn row_image(&mut self, table_id: u32, id: u64, stored: &[u8]) {
        self.entries += 1;
        self.buf.extend_from_slice(&table_id.to_le_bytes());
        let len = u32::try_from(stored.len()).unwrap_or(u32::MAX);
        self.buf.extend_from_slice(&len.to_le_bytes());
        self.buf.extend_from_slice(&id.to_le_bytes());
        self.buf.extend_from_slice(stored);
    }

    /// Writes one dense cell of the current image into the file where it goes, from `data`
    /// itself (the caller holds the cell's read guard meanwhile). A cell past the room the
    /// image began with is refused and nothing of it is written: the record would overwrite
    /// live ones.
    pub fn image_cell(
        &mut self,
        table_id: u32,
        index: u64,
        step: u64,
        data: &[f32],
    ) -> Result<(), PushLogError> {
        let values = u32::try_from(data.len()).unwrap_or(u32::MAX);
        let mut head = [0u8; CELL];
        head[0..4].copy_from_slice(&table_id.to_le_bytes());
        head[4..8].copy_from_slice(&values.to_le_bytes());
        head[8..16].copy_from_slice(&index.to_le_bytes());
        head[16..24].copy_from_slice(&step.to_le_bytes());
        // Little-endian as they are: ps-core builds for little-endian targets only.
        let bytes: &[u8] = bytemuck::cast_slice(data);
        let start = HEADER as u64 + self.image_written;
        let end = start + (CELL + bytes.len()) as u64;
        if self.kind != Kind::Image || end > self.image_room {
            return Err(PushLogError::Corrupt {
                path: self.path.display().to_string(),
                position: self.at,
                reason: format!(
                    "an image's cells reach {end} bytes, past the {} it began with; not written",
                    self.image_room
                ),
            });
        }
        write_parts_at(&self.file, &[&head, bytes], self.at % self.capacity + start)?;
        self.image_crc.update(&head);
        self.image_crc.update(bytes);
        self.image_written = end - HEADER as u64;
        self.entries += 1;
        Ok(())
    }

    /// Starts a push's entry in the current record.
    pub fn push(&mut self, table_id: u32, id: &PushId) {
        self.entries += 1;
        self.entry_at = Some(self.buf.len());
        self.buf.extend_from_slice(&table_id.to_le_bytes());
        self.buf.extend_from_slice(&0u32.to_le_bytes());
        self.buf.extend_from_slice(&id.client_id.to_le_bytes());
        self.buf.extend_from_slice(&id.seq.to_le_bytes());
        self.buf
            .extend_from_slice(&id.min_unacked_seq.to_le_bytes());
    }

    /// Adds one chunk's gradient (little-endian f32 bytes) to the current push's entry and
    /// returns where the record holds it: every field before it is a multiple of 4 bytes, so
    /// the copy is 4-byte aligned and the caller can apply the gradient from it.
    pub fn chunk(&mut self, index: u64, grad: &[u8]) -> &[u8] {
        if !self.chunk_head(index, grad.len()) {
            return &[];
        }
        let start = self.buf.len();
        self.buf.extend_from_slice(grad);
        &self.buf[start..]
    }

    /// [`PushLog::chunk`] without the copy: the record holds `grad` (a push's received
    /// bytes, which never change) and writes it from where it is at [`PushLog::commit`]; or,
    /// when those bytes were received into the body ring, where they are there and their
    /// CRC-32, so that they are not written again. `crc` is `grad`'s CRC-32, taken by the
    /// caller in the pass that applied it (`Table::apply_le_summed`), so that the commit never
    /// reads the gradient again.
    pub fn chunk_shared(&mut self, index: u64, grad: &Bytes, crc: u32) {
        let in_ring = self.bodies.as_ref().and_then(|ring| ring.locate(grad));
        if !self.chunk_head(index, grad.len()) {
            return;
        }
        let Some(pos) = in_ring else {
            self.shared.push((self.buf.len(), grad.clone(), crc));
            return;
        };
        let at = self.buf.len() - 4;
        let values = u32_at(&self.buf, at) | IN_RING;
        self.buf[at..at + 4].copy_from_slice(&values.to_le_bytes());
        self.buf.extend_from_slice(&pos.to_le_bytes());
        self.in_ring.push((self.buf.len(), grad.clone(), crc));
        self.buf.extend_from_slice(&[0; 4]);
        self.ring_first = Some(self.ring_first.map_or(pos, |f| f.min(pos)));
    }

    /// A chunk's index and value count in the current push's entry; false outside one.
    fn chunk_head(&mut self, index: u64, grad_bytes: usize) -> bool {
        let Some(at) = self.entry_at else {
            return false;
        };
        let count = u32_at(&self.buf, at + 4) + 1;
        self.buf[at + 4..at + 8].copy_from_slice(&count.to_le_bytes());
        self.buf.extend_from_slice(&index.to_le_bytes());
        let values = u32::try_from(grad_bytes / 4).unwrap_or(u32::MAX);
        self.buf.extend_from_slice(&values.to_le_bytes());
        true
    }

    /// Adds one sparse row's gradient (little-endian f32 bytes) to the current push's entry;
    /// `new`: the push stored the row (a replay after a crash that lost the group's store
    /// write counts it).
    pub fn row(&mut self, id: u64, grad: &[u8], new: bool) {
        self.chunk(id, grad);
        if new {
            let at = self.buf.len() - grad.len() - 4;
            let values = u32_at(&self.buf, at) | NEW_ROW;
            self.buf[at..at + 4].copy_from_slice(&values.to_le_bytes());
        }
    }

    /// [`PushLog::row`] with the gradient as f32s.
    pub fn row_f32(&mut self, id: u64, grad: &[f32], new: bool) {
        if cfg!(target_endian = "little") {
            self.row(id, bytemuck::cast_slice(grad), new);
        } else {
            let bytes: Vec<u8> = grad.iter().flat_map(|v| v.to_le_bytes()).collect();
            self.row(id, &bytes, new);
        }
    }

    /// The oldest tail with which a record of `len` bytes would fit ([`PushLog::fits`]).
    pub fn tail_needed(&self, len: u64) -> u64 {
        (self.place(len) + len).saturating_sub(self.capacity)
    }

    /// The log's size in bytes.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// A second handle on the log's file, to read logged gradients from (their
    /// [`LoggedChunk::offset`]) while the writer appends.
    pub fn reader(&self) -> Result<File, PushLogError> {
        Ok(self.file.try_clone()?)
    }

    /// Bytes of the record being built.
    pub fn pending(&self) -> u64 {
        let shared: usize = self.shared.iter().map(|(_, g, _)| g.len()).sum();
        (self.buf.len() + shared) as u64 + self.image_written
    }

    /// The record being built, in order: `buf` with the shared gradients where they go. The
    /// first part starts with the record's header.
    fn parts(&self) -> Vec<&[u8]> {
        let mut parts = Vec::with_capacity(2 * self.shared.len() + 1);
        let mut from = 0;
        for (at, grad, _) in &self.shared {
            parts.push(&self.buf[from..*at]);
            parts.push(&grad[..]);
            from = *at;
        }
        parts.push(&self.buf[from..]);
        parts.retain(|p| !p.is_empty());
        parts
    }

    /// Where the record being built goes: what its rows are stamped with (plus one, so that
    /// no stamp is 0, which stands for "no logged update").
    pub fn position(&self) -> u64 {
        self.at
    }

    /// Writes the current record at the position [`PushLog::begin`] fixed (the caller checked
    /// [`PushLog::fits`] for the length it began with); returns its length (it ends at
    /// [`PushLog::head`]).
    pub fn commit(&mut self) -> Result<u64, PushLogError> {
        let entries = self.entries;
        let len = self.pending();
        let pos = self.at;
        if pos % self.capacity + len > self.capacity || pos + len - self.tail() > self.capacity {
            return Err(PushLogError::Corrupt {
                path: self.path.display().to_string(),
                position: pos,
                reason: format!(
                    "a record of {len} bytes is longer than the room it began with; not written"
                ),
            });
        }
        self.buf[0..4].copy_from_slice(&self.kind.magic().to_le_bytes());
        self.buf[8..16].copy_from_slice(&pos.to_le_bytes());
        self.buf[16..20].copy_from_slice(&(len as u32).to_le_bytes());
        self.buf[20..24].copy_from_slice(&entries.to_le_bytes());
        for (at, _, sum) in self.in_ring.drain(..) {
            self.buf[at..at + 4].copy_from_slice(&sum.to_le_bytes());
        }
        // Everything after the magic and the checksum itself: `buf` with the shared gradients
        // where they go, each taken by the checksum its caller gave.
        let mut crc = crc32fast::Hasher::new();
        let mut from = 8;
        for (at, grad, sum) in &self.shared {
            crc.update(&self.buf[from..*at]);
            crc.combine(&crc32fast::Hasher::new_with_initial_len(
                *sum,
                grad.len() as u64,
            ));
            from = *at;
        }
        crc.update(&self.buf[from..]);
        if self.kind == Kind::Image {
            // The cells, written already, follow the header.
            crc.combine(&self.image_crc);
        }
        self.buf[4..8].copy_from_slice(&crc.finalize().to_le_bytes());
        let ring = self.bodies.as_ref().filter(|_| self.ring_first.is_some());
        if let Some(ring) = ring
            && self.sync
        {
            // The bodies it points at are durable before the record is.
            ring.sync()?;
        }
        write_parts_at(&self.file, &self.parts(), pos % self.capacity)?;
        self.shared.clear();
        self.image_written = 0;
        if let (Some(ring), Some(first)) = (ring, self.ring_first.take()) {
            ring.referenced(pos, first);
        }
        if self.sync {
            self.file.sync_data()?;
        }
        self.head = pos + len;
        Ok(len)
    }

    /// Reads the live records from `from` (the oldest stored position) on, in order, each
    /// with its position, and leaves the head after the last good one. A record that fails
    /// its checks ends the log.
    pub fn replay<E: From<PushLogError>>(
        &mut self,
        from: u64,
        visit: &mut dyn FnMut(u64, Logged<'_>) -> Result<(), E>,
    ) -> Result<u64, E> {
        self.replay_from(from, from, visit)
    }

    /// [`PushLog::replay`], reading the values a record holds in the body ring only for
    /// records from `bodies_from` on (the dense cells' stored position: the records before it
    /// are not applied, and the ring may have reused their bodies' place); those records hold
    /// their bodies in the ring again. A body that fails its CRC-32 ends the log as a torn
    /// record does: without `sync`, a crash of the machine may keep a record and lose the
    /// body it points at.
    pub fn replay_from<E: From<PushLogError>>(
        &mut self,
        from: u64,
        bodies_from: u64,
        visit: &mut dyn FnMut(u64, Logged<'_>) -> Result<(), E>,
    ) -> Result<u64, E> {
        self.dense_tail = from;
        self.rows_tail = from;
        self.head = from;
        if let Some(ring) = &self.bodies {
            ring.clear_references();
        }
        let mut records = 0;
        let mut header = [0u8; HEADER];
        let mut body = Vec::new();
        let mut bodies = Vec::new();
        loop {
            let mut pos = self.head;
            let mut found = self.read_header(pos, &mut header)?;
            if found.is_none() && !pos.is_multiple_of(self.capacity) {
                // A record that did not fit before the end of the file starts the next lap.
                pos = pos - pos % self.capacity + self.capacity;
                found = self.read_header(pos, &mut header)?;
            }
            let Some((len, kind)) = found else {
                break;
            };
            if pos + len - from > self.capacity {
                break; // would reach past the live window: older data
            }
            body.resize(len as usize, 0);
            self.file
                .read_exact_at(&mut body, pos % self.capacity)
                .map_err(PushLogError::Io)?;
            if crc32fast::hash(&body[8..]) != u32_at(&body, 4) {
                break; // a torn record: the process died while writing it
            }
            let base = pos % self.capacity;
            let read_bodies = kind == Kind::Pushes && pos >= bodies_from;
            if read_bodies && !self.read_bodies(pos, &body, &mut bodies)? {
                tracing::warn!(
                    path = %self.path.display(),
                    position = pos,
                    "a push-log record points at a body the ring does not hold (a machine \
                     crash without sync keeps one file's pages and not the other's); the log \
                     ends before it"
                );
                break;
            }
            let logged = match kind {
                Kind::Image => parse_image(&body).map(Logged::Image),
                Kind::Pushes => {
                    parse(&body, base, read_bodies.then_some(&bodies[..])).map(Logged::Pushes)
                }
                Kind::Rows => parse_rows(&body, base).map(Logged::Rows),
            };
            let Some(logged) = logged else {
                return Err(PushLogError::Corrupt {
                    path: self.path.display().to_string(),
                    position: pos,
                    reason: "a record with a good checksum does not parse".into(),
                }
                .into());
            };
            visit(pos, logged)?;
            records += 1;
            self.head = pos + len;
        }
        Ok(records)
    }

    /// Reads the bodies a record of pushes at `pos` points at in the ring into `out`, one
    /// after another in the record's order, and holds them in the ring; false when one fails
    /// its CRC-32 (or the log has no ring to read them from).
    fn read_bodies(
        &self,
        pos: u64,
        record: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<bool, PushLogError> {
        out.clear();
        let Some(refs) = ring_refs(record) else {
            return Ok(true); // does not parse: the caller says so
        };
        if refs.is_empty() {
            return Ok(true);
        }
        let Some(ring) = &self.bodies else {
            return Ok(false);
        };
        let (mut first, mut end) = (u64::MAX, 0);
        for (at, len, crc) in refs {
            let start = out.len();
            out.resize(start + len, 0);
            ring.read_at(at, &mut out[start..])?;
            if crc32fast::hash(&out[start..]) != crc {
                return Ok(false);
            }
            first = first.min(at);
            end = end.max(at + len as u64);
        }
        ring.referenced(pos, first);
        ring.advance_head(end);
        Ok(true)
    }

    /// The length of the record at `pos` and what it holds, if a plausible header for that
    /// position is there.
    fn read_header(
        &self,
        pos: u64,
        header: &mut [u8; HEADER],
    ) -> Result<Option<(u64, Kind)>, PushLogError> {
        let off = pos % self.capacity;
        if off + HEADER as u64 > self.capacity {
            return Ok(None);
        }
        self.file.read_exact_at(header, off)?;
        let len = u32_at(header, 16) as u64;
        let kind = Kind::of(u32_at(header, 0));
        let ok = u64_at(header, 8) == pos && len >= HEADER as u64 && off + len <= self.capacity;
        Ok(kind.filter(|_| ok).map(|k| (len, k)))
    }
}

/// At most this many buffers to one `pwritev` (Linux takes 1024).
const IOV_BATCH: usize = 512;

/// Writes `parts` one after another at `offset`, with as few system calls as the kernel takes.
fn write_parts_at(file: &File, parts: &[&[u8]], mut offset: u64) -> std::io::Result<()> {
    let (mut i, mut done) = (0, 0); // the first part not wholly written, and its bytes written
    while i < parts.len() {
        let iov: Vec<IoSlice<'_>> = std::iter::once(&parts[i][done..])
            .chain(parts[i + 1..].iter().copied())
            .take(IOV_BATCH)
            .map(IoSlice::new)
            .collect();
        let at = i64::try_from(offset).map_err(std::io::Error::other)?;
        let mut n = match nix::sys::uio::pwritev(file, &iov, at) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => n,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        };
        offset += n as u64;
        while n > 0 {
            let rest = parts[i].len() - done;
            if n >= rest {
                n -= rest;
                (i, done) = (i + 1, 0);
            } else {
                done += n;
                n = 0;
            }
        }
    }
    Ok(())
}

/// Allocates the file's blocks up front, so that a full disk shows when the shard starts and
/// not in the middle of a push.
fn reserve(file: &File, len: u64) -> std::io::Result<()> {
    use nix::errno::Errno;
    let len = i64::try_from(len).map_err(std::io::Error::other)?;
    match nix::fcntl::posix_fallocate(file, 0, len) {
        Ok(()) => Ok(()),
        // A file system without fallocate: a sparse file, whose blocks are allocated as the
        // first lap writes them.
        Err(Errno::EOPNOTSUPP | Errno::EINVAL) => file.set_len(len as u64),
        Err(e) => Err(e.into()),
    }
}

/// The pushes of one record written at file offset `base`, or `None` when its entries overrun
/// it. `bodies`: the values the record holds in the body ring, one chunk after another
/// ([`PushLog::read_bodies`]); without them such chunks have no data.
fn parse<'a>(body: &'a [u8], base: u64, bodies: Option<&'a [u8]>) -> Option<Vec<LoggedPush<'a>>> {
    let entries = u32_at(body, 20) as usize;
    let mut at = HEADER;
    let mut in_ring = 0;
    let mut out = Vec::with_capacity(entries);
    for _ in 0..entries {
        let e = body.get(at..at + ENTRY)?;
        let chunks = u32_at(e, 4) as usize;
        let push_id = PushId {
            client_id: u64_at(e, 8),
            seq: u64_at(e, 16),
            min_unacked_seq: u64_at(e, 24),
        };
        at += ENTRY;
        let mut list = Vec::with_capacity(chunks.min(1 << 16));
        for _ in 0..chunks {
            let c = body.get(at..at + CHUNK)?;
            at += CHUNK;
            let values = u32_at(c, 8);
            if values & IN_RING != 0 {
                let r = body.get(at..at + RING_REF)?;
                at += RING_REF;
                let data = match bodies {
                    Some(b) => take_f32s(b, &mut in_ring, values & !IN_RING)?,
                    None => &[],
                };
                list.push(LoggedChunk {
                    index: u64_at(c, 0),
                    new: false,
                    data,
                    offset: u64_at(r, 0),
                });
                continue;
            }
            let start = base + at as u64;
            list.push(LoggedChunk {
                index: u64_at(c, 0),
                new: values & NEW_ROW != 0,
                data: take_f32s(body, &mut at, values & !NEW_ROW)?,
                offset: start,
            });
        }
        out.push(LoggedPush {
            table_id: u32_at(e, 0),
            push_id,
            chunks: list,
        });
    }
    (at == body.len()).then_some(out)
}

/// The chunks a record of pushes holds in the body ring, in its order: (ring position, bytes,
/// CRC-32); `None` when its entries overrun it.
fn ring_refs(body: &[u8]) -> Option<Vec<(u64, usize, u32)>> {
    let entries = u32_at(body, 20) as usize;
    let mut at = HEADER;
    let mut out = Vec::new();
    for _ in 0..entries {
        let chunks = u32_at(body.get(at..at + ENTRY)?, 4) as usize;
        at += ENTRY;
        for _ in 0..chunks {
            let values = u32_at(body.get(at..at + CHUNK)?, 8);
            at += CHUNK;
            if values & IN_RING != 0 {
                let r = body.get(at..at + RING_REF)?;
                out.push((u64_at(r, 0), (values & !IN_RING) as usize * 4, u32_at(r, 8)));
                at += RING_REF;
            } else {
                at = at.checked_add((values & !NEW_ROW) as usize * 4)?;
            }
        }
    }
    Some(out)
}

/// The bytes of `values` f32s at `*at`, moving `*at` past them; `None` past the end.
fn take_f32s<'a>(body: &'a [u8], at: &mut usize, values: u32) -> Option<&'a [u8]> {
    let end = at.checked_add((values as usize).checked_mul(4)?)?;
    let data = body.get(*at..end)?;
    *at = end;
    Some(data)
}

/// The cells of an image, or `None` when its entries overrun it.
fn parse_image(body: &[u8]) -> Option<Vec<CellImage<'_>>> {
    let entries = u32_at(body, 20) as usize;
    let mut at = HEADER;
    let mut out = Vec::with_capacity(entries.min(1 << 16));
    for _ in 0..entries {
        let c = body.get(at..at + CELL)?;
        at += CELL;
        out.push(CellImage {
            table_id: u32_at(c, 0),
            index: u64_at(c, 8),
            step: u64_at(c, 16),
            data: take_f32s(body, &mut at, u32_at(c, 4))?,
        });
    }
    (at == body.len()).then_some(out)
}

/// The rows of a record of row images written at file offset `base`, or `None` when its
/// entries overrun it.
fn parse_rows(body: &[u8], base: u64) -> Option<Vec<RowImage<'_>>> {
    let entries = u32_at(body, 20) as usize;
    let mut at = HEADER;
    let mut out = Vec::with_capacity(entries.min(1 << 16));
    for _ in 0..entries {
        let r = body.get(at..at + ROW)?;
        at += ROW;
        let end = at.checked_add(u32_at(r, 4) as usize)?;
        out.push(RowImage {
            table_id: u32_at(r, 0),
            id: u64_at(r, 8),
            data: body.get(at..end)?,
            offset: base + at as u64,
        });
        at = end;
    }
    (at == body.len()).then_some(out)
}

/// The log's path beside a RocksDB directory: `<db>.dense-log`.
pub fn path_for(db: &Path) -> PathBuf {
    let mut name = db.file_name().unwrap_or_default().to_os_string();
    name.push(".dense-log");
    db.with_file_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(seq: u64) -> PushId {
        PushId {
            client_id: 7,
            seq,
            min_unacked_seq: 1,
        }
    }

    fn open(dir: &Path, capacity: u64) -> PushLog {
        PushLog::open(&PushLogOptions {
            path: dir.join("log"),
            capacity,
            sync: false,
        })
        .unwrap()
    }

    fn write(log: &mut PushLog, seq: u64, values: usize) -> u64 {
        log.begin(PushLog::record_len(1, 1, values * 4));
        log.push(3, &id(seq));
        let grad = vec![seq as f32; values];
        let held = log.chunk(seq, bytemuck::cast_slice(&grad));
        assert_eq!(held, bytemuck::cast_slice::<f32, u8>(&grad));
        assert!(
            bytemuck::try_cast_slice::<u8, f32>(held).is_ok(),
            "held aligned"
        );
        let len = log.pending();
        assert!(log.fits(len));
        let at = log.place(len);
        log.commit().unwrap();
        at
    }

    /// A logged chunk's values.
    fn values(data: &[u8]) -> Vec<f32> {
        let mut v = vec![0.0; data.len() / 4];
        ps_codec::quant::read_f32_le(data, &mut v);
        v
    }

    fn seqs(log: &mut PushLog, from: u64) -> Vec<u64> {
        let mut out = Vec::new();
        log.replay(from, &mut |_, logged| -> Result<(), PushLogError> {
            let Logged::Pushes(pushes) = logged else {
                out.push(0);
                return Ok(());
            };
            for p in pushes {
                assert_eq!(p.table_id, 3);
                for c in &p.chunks {
                    assert_eq!(c.index, p.push_id.seq);
                    assert!(!c.new);
                    assert!(values(c.data).iter().all(|&x| x == p.push_id.seq as f32));
                }
                out.push(p.push_id.seq);
            }
            Ok(())
        })
        .unwrap();
        out
    }

    #[test]
    fn records_replay_in_order_across_laps_and_stop_at_a_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = open(dir.path(), 4096);
        // 24 + 32 + 12 + 400 = 468 bytes a record: 8 fit in a lap, the 9th starts the next.
        for seq in 1..=8 {
            write(&mut log, seq, 100);
        }
        assert_eq!(
            seqs(&mut open(dir.path(), 4096), 0),
            (1..=8).collect::<Vec<_>>()
        );
        log.set_dense_tail(log.head());
        log.set_rows_tail(log.head());
        let snap = log.head();
        assert!(
            !log.fits(4096 - 100),
            "a record over the free space needs a snapshot"
        );
        let ninth = write(&mut log, 9, 100);
        assert_eq!(
            ninth, 4096,
            "the record that does not fit starts the next lap"
        );
        write(&mut log, 10, 100);
        let mut reopened = open(dir.path(), 4096);
        assert_eq!(seqs(&mut reopened, snap), vec![9, 10]);
        assert_eq!(reopened.head(), log.head());
        // The previous lap's records are not read as new ones.
        assert_eq!(
            seqs(&mut open(dir.path(), 4096), log.head()),
            Vec::<u64>::new()
        );

        // A torn record (its last bytes never written) ends the log.
        let end = write(&mut log, 11, 100) % 4096 + 468;
        log.file.write_all_at(&[0xAB; 4], end - 4).unwrap();
        assert_eq!(seqs(&mut open(dir.path(), 4096), snap), vec![9, 10]);
    }

    /// A log with a body ring, and a body of `values` copies of `v` received into it.
    fn ring_body(log: &PushLog, values: usize, v: f32) -> Bytes {
        let ring = log.bodies().unwrap();
        let mut r = ring.reserve(values * 4).unwrap();
        for (d, s) in r
            .as_mut_slice()
            .chunks_exact_mut(4)
            .zip(std::iter::repeat(v.to_le_bytes()))
        {
            d.copy_from_slice(&s);
        }
        r.into_bytes()
    }

    fn open_with_ring(dir: &Path, capacity: u64) -> PushLog {
        let mut log = open(dir, capacity);
        let ring = BodyRing::open(&dir.join("log"), capacity).unwrap();
        assert!(ring.is_some(), "the test's file system preallocates");
        log.set_bodies(ring);
        log
    }

    #[test]
    fn chunks_received_into_the_body_ring_are_logged_where_they_are_and_replayed_from_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = open_with_ring(dir.path(), 1 << 20);
        // Push 1: a ring body in two chunks and a chunk from memory; push 2: a ring body.
        let one = ring_body(&log, 2048, 1.0);
        let two = ring_body(&log, 1024, 2.0);
        let mem = Bytes::copy_from_slice(bytemuck::cast_slice(&[1.0f32; 100]));
        let first = log.head();
        log.begin(PushLog::record_len(2, 4, one.len() + two.len() + mem.len()));
        log.push(3, &id(1));
        for grad in [one.slice(..4096), one.slice(4096..), mem.clone()] {
            log.chunk_shared(1, &grad, crc32fast::hash(&grad));
        }
        log.push(3, &id(2));
        log.chunk_shared(2, &two, crc32fast::hash(&two));
        let len = log.commit().unwrap();
        // Only the chunk from memory is in the record: the others are 12-byte references.
        assert_eq!(len, PushLog::record_len(2, 4, 400) + 3 * RING_REF as u64);
        let ring = Arc::clone(log.bodies().unwrap());
        drop((one, two));
        assert!(ring.held_by_records() > 0, "the record holds its bodies");
        // Replayed (by a new process) as if the record held the values.
        let mut reopened = open_with_ring(dir.path(), 1 << 20);
        assert_eq!(seqs(&mut reopened, first), vec![1, 2]);
        let sizes = |log: &mut PushLog, from: u64, bodies_from: u64| {
            let mut sizes = Vec::new();
            log.replay_from(
                from,
                bodies_from,
                &mut |_, logged| -> Result<(), PushLogError> {
                    if let Logged::Pushes(p) = logged {
                        sizes.extend(p.iter().flat_map(|p| p.chunks.iter().map(|c| c.data.len())));
                    }
                    Ok(())
                },
            )
            .unwrap();
            sizes
        };
        assert_eq!(
            sizes(&mut reopened, first, first),
            vec![4096, 4096, 400, 4096]
        );
        let reheld = Arc::clone(reopened.bodies().unwrap());
        assert!(
            reheld.held_by_records() > 0,
            "replay holds the bodies again"
        );
        // Before the dense cells' stored position the ring's chunks are not read (their place
        // may have been reused); the record's own values still are.
        assert_eq!(sizes(&mut reopened, first, first + 1), vec![0, 0, 400, 0]);
        assert_eq!(reheld.held_by_records(), 0);
        // Once an image or a snapshot passes the record, its bodies' place is free.
        log.set_dense_tail(log.head());
        assert_eq!(ring.held_by_records(), 0);

        // A body that does not hold what the record says ends the log, as a torn record does.
        let three = ring_body(&log, 1024, 3.0);
        let at = ring.locate(&three).unwrap();
        let second = log.head();
        log.begin(PushLog::record_len(1, 1, three.len()));
        log.push(3, &id(3));
        log.chunk_shared(3, &three, crc32fast::hash(&three));
        log.commit().unwrap();
        write(&mut log, 4, 10);
        assert_eq!(
            seqs(&mut open_with_ring(dir.path(), 1 << 20), second),
            vec![3, 4]
        );
        std::fs::OpenOptions::new()
            .write(true)
            .open(crate::body_ring::path_for(&dir.path().join("log")))
            .unwrap()
            .write_all_at(&[0xAB; 4], at % (1 << 20) + 8)
            .unwrap();
        assert_eq!(
            seqs(&mut open_with_ring(dir.path(), 1 << 20), second),
            Vec::<u64>::new()
        );
        // Without a ring to read from, such a record ends the log too.
        assert_eq!(
            seqs(&mut open(dir.path(), 1 << 20), second),
            Vec::<u64>::new()
        );
    }

    #[test]
    fn a_gradient_whose_given_checksum_is_wrong_ends_the_log_there() {
        let dir = tempfile::tempdir().unwrap();
        for in_ring in [false, true] {
            let sub = dir.path().join(if in_ring { "ring" } else { "memory" });
            std::fs::create_dir_all(&sub).unwrap();
            let mut log = if in_ring {
                open_with_ring(&sub, 1 << 20)
            } else {
                open(&sub, 1 << 20)
            };
            // Records 1 and 3 with their checksums right, 2 with one bit of it wrong.
            for seq in 1..=3u64 {
                let grad = if in_ring {
                    ring_body(&log, 1024, seq as f32)
                } else {
                    Bytes::copy_from_slice(bytemuck::cast_slice(&[seq as f32; 1024]))
                };
                let crc = crc32fast::hash(&grad) ^ u32::from(seq == 2);
                log.begin(PushLog::record_len(1, 1, grad.len()));
                log.push(3, &id(seq));
                log.chunk_shared(seq, &grad, crc);
                log.commit().unwrap();
            }
            let mut reopened = if in_ring {
                open_with_ring(&sub, 1 << 20)
            } else {
                open(&sub, 1 << 20)
            };
            assert_eq!(seqs(&mut reopened, 0), vec![1], "in the ring: {in_ring}");
        }
    }

    #[test]
    fn shared_gradients_are_written_from_where_they_are_and_replay_as_copied_ones() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = open(dir.path(), 1 << 20);
        // More parts than one pwritev takes (two per shared chunk), mixed with copied chunks,
        // over two pushes; each gradient a slice of one received buffer, as a bulk body is.
        let chunks = IOV_BATCH + 40;
        let body: Vec<f32> = (0..chunks * 3).map(|v| v as f32 * 0.5 - 7.0).collect();
        let body = Bytes::copy_from_slice(bytemuck::cast_slice(&body));
        log.begin(PushLog::record_len(2, chunks, body.len()));
        for (seq, range) in [(1, 0..chunks / 2), (2, chunks / 2..chunks)] {
            log.push(3, &id(seq));
            for c in range {
                let grad = body.slice(c * 12..(c + 1) * 12);
                if c % 5 == 4 {
                    log.chunk(c as u64, &grad);
                } else {
                    log.chunk_shared(c as u64, &grad, crc32fast::hash(&grad));
                }
            }
        }
        assert_eq!(
            log.pending(),
            PushLog::record_len(2, chunks, body.len()),
            "the record is as long as the copied one"
        );
        let len = log.commit().unwrap();
        assert_eq!(log.head(), len);
        assert!(log.shared.is_empty(), "the received buffers are let go");

        let mut seen = Vec::new();
        open(dir.path(), 1 << 20)
            .replay(0, &mut |_, logged| -> Result<(), PushLogError> {
                let Logged::Pushes(pushes) = logged else {
                    panic!("a record of pushes");
                };
                for p in pushes {
                    for c in p.chunks {
                        seen.push((p.push_id.seq, c.index, c.data.to_vec()));
                    }
                }
                Ok(())
            })
            .unwrap();
        assert_eq!(seen.len(), chunks);
        for (c, (seq, index, data)) in seen.into_iter().enumerate() {
            assert_eq!((seq, index), (if c < chunks / 2 { 1 } else { 2 }, c as u64));
            assert_eq!(data, body[c * 12..(c + 1) * 12], "chunk {c}");
        }
    }

    /// What replay from `from` meets: each image cell as (table, chunk, step, values), each
    /// record of pushes as (0, its first push's seq, 0, no values).
    fn replayed(log: &mut PushLog, from: u64) -> Vec<(u32, u64, u64, Vec<f32>)> {
        let mut out = Vec::new();
        log.replay(from, &mut |_, logged| -> Result<(), PushLogError> {
            match logged {
                Logged::Image(image) => {
                    for c in image {
                        out.push((c.table_id, c.index, c.step, values(c.data)));
                    }
                }
                Logged::Pushes(p) => out.push((0, p[0].push_id.seq, 0, Vec::new())),
                Logged::Rows(_) => panic!("no rows were written"),
            }
            Ok(())
        })
        .unwrap();
        out
    }

    #[test]
    fn an_image_replays_as_its_cells_between_the_records_around_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = open(dir.path(), 1 << 16);
        write(&mut log, 1, 10);
        log.begin_image(PushLog::image_len(2, 7));
        log.image_cell(3, 0, 4, &[1.0, 2.0, 3.0]).unwrap();
        log.image_cell(5, 9, 0, &[-1.0; 4]).unwrap();
        let len = log.commit().unwrap();
        assert_eq!(len, PushLog::image_len(2, 7));
        let image_at = log.head() - len;
        write(&mut log, 2, 10);

        assert_eq!(
            replayed(&mut open(dir.path(), 1 << 16), image_at),
            vec![
                (3, 0, 4, vec![1.0, 2.0, 3.0]),
                (5, 9, 0, vec![-1.0; 4]),
                (0, 2, 0, Vec::new()),
            ]
        );
        // From the start, the image sits between the records: 0 stands for it.
        assert_eq!(seqs(&mut open(dir.path(), 1 << 16), 0), vec![1, 0, 2]);
    }

    #[test]
    fn an_image_goes_from_the_cells_into_the_file_without_gathering_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = open(dir.path(), 64 << 20);
        write(&mut log, 1, 10);
        // Two cells of 1 M values: 8 MiB of image, none of it in the record's buffer.
        let a: Vec<f32> = (0..1 << 20).map(|v| v as f32 * 0.25).collect();
        let b: Vec<f32> = (0..1 << 20).map(|v| -(v as f32)).collect();
        log.begin_image(PushLog::image_len(2, 2 << 20));
        log.image_cell(3, 0, 7, &a).unwrap();
        log.image_cell(3, 1, 7, &b).unwrap();
        assert_eq!(log.pending(), PushLog::image_len(2, 2 << 20));
        let len = log.commit().unwrap();
        assert!(
            log.buf.capacity() < 64 << 10,
            "the buffer holds the header, not the image ({} bytes)",
            log.buf.capacity()
        );
        let image_at = log.head() - len;
        write(&mut log, 2, 10);
        assert_eq!(log.pending(), PushLog::record_len(1, 1, 40));

        // The record after the image replays too.
        assert_eq!(
            replayed(&mut open(dir.path(), 64 << 20), image_at),
            vec![(3, 0, 7, a), (3, 1, 7, b), (0, 2, 0, Vec::new())]
        );
    }

    #[test]
    fn an_image_cell_past_the_room_it_began_with_is_refused_and_not_written() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = open(dir.path(), 1 << 16);
        write(&mut log, 1, 10);
        let head = log.head();
        let mut before = vec![0u8; 1 << 16];
        log.file.read_exact_at(&mut before, 0).unwrap();
        log.begin_image(PushLog::image_len(1, 4));
        log.image_cell(3, 0, 1, &[1.0; 4]).unwrap();
        let err = log.image_cell(3, 1, 1, &[2.0; 4]).unwrap_err();
        assert!(err.to_string().contains("past the"), "{err}");
        let mut after = vec![0u8; 1 << 16];
        log.file.read_exact_at(&mut after, 0).unwrap();
        let cell_end = head as usize + HEADER + CELL + 16;
        assert_eq!(
            after[cell_end..],
            before[cell_end..],
            "nothing past the first cell was written"
        );
        assert_eq!(after[..head as usize], before[..head as usize]);
        // Never committed, the image is not in the log: it ends after the first record.
        assert_eq!(seqs(&mut open(dir.path(), 1 << 16), 0), vec![1]);
    }

    #[test]
    fn sparse_rows_replay_with_their_flags_and_file_offsets() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = open(dir.path(), 4096);
        write(&mut log, 1, 700); // 2,868 bytes
        log.set_dense_tail(log.head());
        log.set_rows_tail(log.head());
        // Begun with room for 60 rows of 4 values (1,736 bytes, more than the 1,228 left in
        // the lap): placed at the next lap, its rows stamped with that position, although it
        // ends up shorter.
        log.begin(PushLog::record_len(1, 60, 60 * 16));
        assert_eq!(log.position(), 4096);
        log.push(8, &id(2));
        log.row_f32(11, &[1.0, 2.0, 3.0, 4.0], true);
        log.row_f32(12, &[-1.0; 4], false);
        log.commit().unwrap();
        assert_eq!(log.head(), 4096 + PushLog::record_len(1, 2, 32));
        let mut rows = Vec::new();
        let mut reopened = open(dir.path(), 4096);
        let file = reopened.reader().unwrap();
        reopened
            .replay(2868, &mut |pos, logged| -> Result<(), PushLogError> {
                let Logged::Pushes(pushes) = logged else {
                    panic!("an image");
                };
                for p in &pushes {
                    for c in &p.chunks {
                        let mut at = vec![0u8; c.data.len()];
                        file.read_exact_at(&mut at, c.offset).unwrap();
                        assert_eq!(at, c.data, "the offset names the gradient in the file");
                        rows.push((pos, c.index, c.new, c.data.to_vec()));
                    }
                }
                Ok(())
            })
            .unwrap();
        let bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        assert_eq!(
            rows,
            vec![
                (4096, 11, true, bytes(&[1.0, 2.0, 3.0, 4.0])),
                (4096, 12, false, bytes(&[-1.0; 4])),
            ]
        );

        // A record that outgrows the room it began with, past the end of the file, is refused.
        let other = tempfile::tempdir().unwrap();
        let mut log = open(other.path(), 4096);
        write(&mut log, 1, 700);
        log.begin(PushLog::record_len(1, 1, 16));
        assert_eq!(log.position(), 2868);
        log.push(8, &id(2));
        for row in 0..80 {
            log.row_f32(row, &[0.5; 4], false);
        }
        assert!(log.commit().is_err());
        assert_eq!(log.head(), 2868, "nothing written");
    }

    #[test]
    fn row_images_replay_as_written_with_their_file_offsets() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = open(dir.path(), 1 << 16);
        write(&mut log, 1, 10);
        let (a, b) = (vec![7u8; 40], vec![9u8; 12]);
        let len = PushLog::rows_len(2, a.len() + b.len());
        log.begin_rows(len);
        let at = log.position();
        log.row_image(4, 1 << 40, &a);
        log.row_image(6, 3, &b);
        assert_eq!(log.commit().unwrap(), len);
        write(&mut log, 2, 10);

        let mut reopened = open(dir.path(), 1 << 16);
        let file = reopened.reader().unwrap();
        let mut seen = Vec::new();
        reopened
            .replay(0, &mut |pos, logged| -> Result<(), PushLogError> {
                match logged {
                    Logged::Rows(rows) => {
                        assert_eq!(pos, at);
                        for r in rows {
                            let mut held = vec![0u8; r.data.len()];
                            file.read_exact_at(&mut held, r.offset).unwrap();
                            assert_eq!(held, r.data, "the offset names the row in the file");
                            seen.push((r.table_id, r.id, r.data.to_vec()));
                        }
                    }
                    Logged::Pushes(p) => seen.push((0, p[0].push_id.seq, Vec::new())),
                    Logged::Image(_) => panic!("no image was written"),
                }
                Ok(())
            })
            .unwrap();
        assert_eq!(
            seen,
            vec![
                (0, 1, Vec::new()),
                (4, 1 << 40, a),
                (6, 3, b),
                (0, 2, Vec::new())
            ]
        );
        assert_eq!(reopened.head(), log.head());

        // An entry claiming more bytes than its record holds is damage, not a torn tail.
        let other = tempfile::tempdir().unwrap();
        let mut log = open(other.path(), 1 << 16);
        log.begin_rows(PushLog::rows_len(1, 8));
        log.row_image(4, 1, &[1u8; 8]);
        let at = 24 + 4; // the entry's byte count
        log.buf[at..at + 4].copy_from_slice(&9u32.to_le_bytes());
        log.commit().unwrap();
        let err = open(other.path(), 1 << 16)
            .replay(0, &mut |_, _| -> Result<(), PushLogError> { Ok(()) })
            .unwrap_err();
        assert!(matches!(err, PushLogError::Corrupt { .. }), "{err}");
    }

    #[test]
    fn the_log_sits_beside_its_database() {
        assert_eq!(
            path_for(Path::new("/d/gen-5/db")),
            PathBuf::from("/d/gen-5/db.dense-log")
        );
    }
}
