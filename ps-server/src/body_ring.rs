//! The push log's body ring: where a durable shard receives the bodies of large dense pushes
//! from the bulk stream, straight from the socket into the pages of a file the push log's
//! records then point at, so that a pushed gradient is copied once (socket to page cache)
//! instead of twice (socket to memory, then memory to the log's pages).
//!
//! The ring is one preallocated file (`<db>.dense-bodies`, as large as the push log) mapped
//! into memory. A connection reserves the next `len` bytes of it for a push's body before it
//! reads the body ([`BodyRing::reserve`]), reads the body into them, and hands the push on as
//! [`Bytes`] whose owner holds the reservation: the engine validates, applies and logs the
//! push from those bytes exactly as from a buffer. When the writer logs a chunk of such a
//! push, its record holds the chunk's place in the ring and CRC-32 instead of its values
//! (`push_log.rs`); a replay reads the values back from the ring and checks them.
//!
//! A body's bytes are never overwritten while either holds:
//! - *in flight*: some [`Bytes`] of it is alive (being read, queued, applied or logged). A
//!   push refused, or a duplicate, releases its bytes when it is dropped, and nothing points
//!   at them.
//! - *referenced*: a live record points at it (one at or after the dense cells' stored
//!   position, which a replay would read). [`BodyRing::release_before`] drops the references
//!   of records that an image or a snapshot of the dense cells has made obsolete.
//!
//! A reservation that would overwrite either fails, and the connection reads the body into
//! memory as before; the writer takes an image of the dense cells once the ring is three
//! quarters held, so that this is rare.
//!
//! The file is allocated before it is mapped (`posix_fallocate`), never shrunk while mapped,
//! and written only through the mapping: a page of it is always backed by an allocated block,
//! so a full disk cannot fault a write into it. A file system without `fallocate` gets no ring
//! (every body then goes into memory).

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;

/// Bodies shorter than this go into memory: the ring's bookkeeping costs more than a small
/// copy saves.
pub const MIN_BODY: usize = 64 << 10;

/// Where in the ring a body goes: every body starts on a 64-byte boundary, so that its values
/// are aligned for the optimizer.
const ALIGN: u64 = 64;

/// A preallocated, mapped file of push bodies (see the module's comment).
pub struct BodyRing {
    file: File,
    path: PathBuf,
    map: memmap2::MmapRaw,
    capacity: u64,
    state: Mutex<State>,
}

impl std::fmt::Debug for BodyRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BodyRing")
            .field("path", &self.path)
            .field("capacity", &self.capacity)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Default)]
struct State {
    /// Where the next body goes (logical: the file offset is this modulo the capacity).
    head: u64,
    /// Bodies whose bytes are alive: (position, length), oldest first.
    in_flight: Vec<(u64, u64)>,
    /// Records pointing into the ring: (the record's position in the push log, the first
    /// body position it points at), in the order they were written.
    records: VecDeque<(u64, u64)>,
    /// The least body position `records` point at.
    records_min: Option<u64>,
}

impl State {
    /// The oldest position still held; `head` when nothing is.
    fn tail(&self) -> u64 {
        let flight = self.in_flight.iter().map(|&(p, _)| p).min();
        [flight, self.records_min]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(self.head)
    }
}

impl BodyRing {
    /// Opens (or creates) the ring beside the push log at `log_path`; `None` when the file
    /// system cannot allocate the file's blocks up front (see the module's comment).
    pub fn open(log_path: &Path, capacity: u64) -> std::io::Result<Option<Arc<Self>>> {
        let path = path_for(log_path);
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&path)?;
        let len = i64::try_from(capacity).map_err(std::io::Error::other)?;
        match nix::fcntl::posix_fallocate(&file, 0, len) {
            Ok(()) => {}
            Err(nix::errno::Errno::EOPNOTSUPP | nix::errno::Errno::EINVAL) => {
                tracing::warn!(
                    path = %path.display(),
                    "the file system cannot preallocate the push bodies' ring; large dense \
                     pushes are received into memory and copied into the push log"
                );
                drop(file);
                let _ = std::fs::remove_file(&path);
                return Ok(None);
            }
            Err(e) => {
                return Err(std::io::Error::new(
                    std::io::Error::from(e).kind(),
                    format!(
                        "reserving {} MiB for the push bodies' ring {} ({e}); free disk space \
                         or lower dense_body_mib",
                        capacity >> 20,
                        path.display()
                    ),
                ));
            }
        }
        let map = memmap2::MmapOptions::new()
            .len(capacity as usize)
            .map_raw(&file)?;
        Ok(Some(Arc::new(Self {
            file,
            path,
            map,
            capacity,
            state: Mutex::new(State::default()),
        })))
    }

    /// The ring's size in bytes.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Bytes held from the oldest body in flight or referenced to the head.
    pub fn held(&self) -> u64 {
        let s = self.state.lock();
        s.head - s.tail()
    }

    /// Bytes from the first body a live record points at to the head: what an image of the
    /// dense cells would free.
    pub fn held_by_records(&self) -> u64 {
        let s = self.state.lock();
        s.records_min.map_or(0, |m| s.head - m)
    }

    /// The next `len` bytes of the ring for one body, or `None` when they would overwrite a
    /// body in flight or referenced (or `len` is more than an eighth of the ring).
    pub fn reserve(self: &Arc<Self>, len: usize) -> Option<Reservation> {
        let len64 = len as u64;
        if len == 0 || len64 > self.capacity / 8 {
            return None;
        }
        let mut s = self.state.lock();
        let start = s.head.next_multiple_of(ALIGN);
        let off = start % self.capacity;
        let pos = if off + len64 <= self.capacity {
            start
        } else {
            start - off + self.capacity
        };
        if pos + len64 - s.tail() > self.capacity {
            return None;
        }
        s.head = pos + len64;
        s.in_flight.push((pos, len64));
        drop(s);
        Some(Reservation {
            body: Body {
                ring: Arc::clone(self),
                pos,
                len,
            },
        })
    }

    /// The ring position of `bytes` when they are a body in flight in this ring (or part of
    /// one).
    pub fn locate(&self, bytes: &[u8]) -> Option<u64> {
        let base = self.map.as_ptr() as usize;
        let at = (bytes.as_ptr() as usize).checked_sub(base)? as u64;
        if bytes.is_empty() || at + bytes.len() as u64 > self.capacity {
            return None;
        }
        let s = self.state.lock();
        s.in_flight.iter().find_map(|&(pos, len)| {
            let off = pos % self.capacity;
            (at >= off && at + bytes.len() as u64 <= off + len).then(|| pos + (at - off))
        })
    }

    /// Records that the push-log record at `record` points at bodies from `first` on: they stay
    /// until [`BodyRing::release_before`] passes `record`.
    pub fn referenced(&self, record: u64, first: u64) {
        let mut s = self.state.lock();
        s.records.push_back((record, first));
        s.records_min = Some(s.records_min.map_or(first, |m| m.min(first)));
    }

    /// Forgets the references of the records before `record` (the dense cells' stored position
    /// has passed them: no replay reads them).
    pub fn release_before(&self, record: u64) {
        let mut s = self.state.lock();
        let before = s.records.len();
        while s.records.front().is_some_and(|&(r, _)| r < record) {
            s.records.pop_front();
        }
        if s.records.len() != before {
            s.records_min = s.records.iter().map(|&(_, b)| b).min();
        }
    }

    /// Forgets every reference (the log was emptied); bodies in flight stay held.
    pub fn clear_references(&self) {
        let mut s = self.state.lock();
        s.records.clear();
        s.records_min = None;
    }

    /// After a replay: new bodies go after `end`, the end of the last body a live record
    /// points at.
    pub fn advance_head(&self, end: u64) {
        let mut s = self.state.lock();
        s.head = s.head.max(end);
    }

    /// Reads the body bytes at ring position `pos` into `out` (a replay's reads: through the
    /// file, so that an I/O error is an error and not a fault).
    pub fn read_at(&self, pos: u64, out: &mut [u8]) -> std::io::Result<()> {
        let off = pos % self.capacity;
        if off + out.len() as u64 > self.capacity {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "{} bytes at ring position {pos} run past the end of {} ({} bytes)",
                    out.len(),
                    self.path.display(),
                    self.capacity
                ),
            ));
        }
        self.file.read_exact_at(out, off)
    }

    /// Makes the bodies written so far durable (the store's `sync`: before a record that
    /// points at them is written).
    pub fn sync(&self) -> std::io::Result<()> {
        self.file.sync_data()
    }

    fn release(&self, pos: u64) {
        let mut s = self.state.lock();
        if let Some(i) = s.in_flight.iter().position(|&(p, _)| p == pos) {
            s.in_flight.swap_remove(i);
        }
    }

    /// The mapped bytes of `len` at ring position `pos`.
    fn ptr(&self, pos: u64) -> *mut u8 {
        // In bounds: a reservation never runs past the end of the file.
        self.map
            .as_mut_ptr()
            .wrapping_add((pos % self.capacity) as usize)
    }
}

/// A body's bytes in the ring, held in flight until dropped.
struct Body {
    ring: Arc<BodyRing>,
    pos: u64,
    len: usize,
}

impl AsRef<[u8]> for Body {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: the `len` bytes at `pos` are inside the mapping (`reserve` placed them
        // before the end of the file), which lives as long as `ring`. They are in flight while
        // `self` lives, so `reserve` gives them to no one else; once the reservation became
        // this `Body` nothing writes them.
        #[allow(unsafe_code)]
        unsafe {
            std::slice::from_raw_parts(self.ring.ptr(self.pos), self.len)
        }
    }
}

impl Drop for Body {
    fn drop(&mut self) {
        self.ring.release(self.pos);
    }
}

/// The ring's next bytes, reserved for one body: filled by the connection
/// ([`Reservation::as_mut_slice`]), then handed on as [`Bytes`].
pub struct Reservation {
    body: Body,
}

impl std::fmt::Debug for Reservation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reservation")
            .field("pos", &self.body.pos)
            .field("len", &self.body.len)
            .finish()
    }
}

impl Reservation {
    /// The reserved bytes, to read the body into.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `Body::as_ref`; the reservation is the only holder of these bytes
        // (in flight, given to no one else) and `&mut self` makes this borrow the only one.
        #[allow(unsafe_code)]
        unsafe {
            std::slice::from_raw_parts_mut(self.body.ring.ptr(self.body.pos), self.body.len)
        }
    }

    /// The filled body, as the bytes the engine applies and logs; its place in the ring stays
    /// held until the last of them is dropped.
    pub fn into_bytes(self) -> Bytes {
        Bytes::from_owner(self.body)
    }
}

/// The ring's path beside the push log's: `<db>.dense-bodies` for `<db>.dense-log`.
pub fn path_for(log_path: &Path) -> PathBuf {
    log_path.with_extension("dense-bodies")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring(capacity: u64) -> (tempfile::TempDir, Arc<BodyRing>) {
        let dir = tempfile::tempdir().unwrap();
        let ring = BodyRing::open(&dir.path().join("db.dense-log"), capacity)
            .unwrap()
            .expect("the test's file system preallocates");
        (dir, ring)
    }

    fn filled(ring: &Arc<BodyRing>, len: usize, byte: u8) -> Option<(u64, Bytes)> {
        let mut r = ring.reserve(len)?;
        r.as_mut_slice().fill(byte);
        let bytes = r.into_bytes();
        let pos = ring.locate(&bytes).unwrap();
        Some((pos, bytes))
    }

    #[test]
    fn a_body_is_read_back_where_it_was_received_and_located_by_its_bytes() {
        let (_dir, ring) = ring(1 << 20);
        let (pos, bytes) = filled(&ring, 100_000, 7).unwrap();
        assert_eq!(pos, 0);
        assert!(bytes.iter().all(|&b| b == 7));
        // A slice of it is located too, at its own position.
        assert_eq!(ring.locate(&bytes[4096..8192]), Some(4096));
        let (pos2, _b2) = filled(&ring, 100_000, 9).unwrap();
        assert_eq!(pos2, 100_032, "the next body starts on a 64-byte boundary");
        let mut back = vec![0u8; 100_000];
        ring.read_at(pos, &mut back).unwrap();
        assert!(back.iter().all(|&b| b == 7));
        // Memory elsewhere is not a body.
        let other = vec![0u8; 64];
        assert_eq!(ring.locate(&other), None);
    }

    #[test]
    fn bodies_in_flight_or_referenced_are_never_overwritten() {
        let (_dir, ring) = ring(1 << 20);
        let body = 100 << 10;
        // A body held in flight: the ring fills up to it and then refuses.
        let (first, held) = filled(&ring, body, 1).unwrap();
        let mut dropped = 0;
        while let Some((_, b)) = filled(&ring, body, 2) {
            drop(b);
            dropped += 1;
            assert!(dropped < 100, "the ring never refused");
        }
        assert!(dropped >= 8, "{dropped} bodies fitted beside the held one");
        assert!(
            held.iter().all(|&b| b == 1),
            "the held body was overwritten"
        );
        // Referenced by a record: still held after its bytes are dropped.
        ring.referenced(10, first);
        drop(held);
        assert!(filled(&ring, body, 3).is_none());
        // Once the dense cells' stored position passes the record, its bodies are free.
        ring.release_before(11);
        assert!(filled(&ring, body, 3).is_some());
        assert!(ring.held() <= body as u64 + ALIGN);
    }

    #[test]
    fn a_body_that_would_run_past_the_end_starts_the_next_lap() {
        let (_dir, ring) = ring(1 << 20);
        let body = 100 << 10;
        let mut last = 0;
        for _ in 0..12 {
            let (pos, b) = filled(&ring, body, 4).unwrap();
            assert!(pos % (1 << 20) + body as u64 <= 1 << 20);
            last = pos;
            drop(b);
        }
        assert!(last >= 1 << 20, "the ring wrapped: {last}");
        assert!(ring.reserve((1 << 20) / 8 + 1).is_none(), "over an eighth");
    }
}
