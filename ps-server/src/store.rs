//! Storage behind a trait. The engine writes through [`Store`]; RocksDB is the durable
//! implementation and [`MemoryStore`] keeps nothing (the in-memory mode, whose only copy of the
//! model is the engine's hot layer). No other crate links RocksDB.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use rocksdb::{
    BlockBasedOptions, Cache, ColumnFamilyDescriptor, DB, DBCompressionType, MemtableFactory,
    Options, SliceTransform, WriteOptions,
};

/// Length of a cell's key in the parameter and optimizer column families (table id, index).
pub const CELL_KEY_LEN: usize = 12;

/// The column families: parameters, optimizer state, metadata (table specs, applied push
/// ids, the shard's identity), and, for sparse tables that evict rows, each row's last push
/// time by row (`Touched`) and the rows by that time (`ByAge`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cf {
    Params,
    Optim,
    Meta,
    Touched,
    ByAge,
}

impl Cf {
    pub const ALL: [Cf; 5] = [Cf::Params, Cf::Optim, Cf::Meta, Cf::Touched, Cf::ByAge];

    pub fn name(self) -> &'static str {
        match self {
            Cf::Params => "params",
            Cf::Optim => "optim",
            Cf::Meta => "meta",
            Cf::Touched => "touched",
            Cf::ByAge => "by_age",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("RocksDB at {path}: {source}")]
    Rocks {
        path: String,
        source: rocksdb::Error,
    },
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
    #[error("this shard keeps no durable state (in-memory mode)")]
    NotDurable,
}

/// Called for each key and value of a scan; an error stops the scan.
pub type Visitor<'a> = dyn FnMut(&[u8], &[u8]) -> Result<(), StoreError> + 'a;

/// Called for each key and value of a [`Store::scan_range`]; `false` stops the scan.
pub type RangeVisitor<'a> = dyn FnMut(&[u8], &[u8]) -> Result<bool, StoreError> + 'a;

/// Called with the position and value of each key a [`Store::multi_get`] found.
pub type Found<'a> = dyn FnMut(usize, &[u8]) -> Result<(), StoreError> + 'a;

/// An atomic group of writes.
pub trait StoreBatch: Send {
    fn put(&mut self, cf: Cf, key: &[u8], value: &[u8]);
    fn delete(&mut self, cf: Cf, key: &[u8]);
    /// Deletes keys in `[from, to)`.
    fn delete_range(&mut self, cf: Cf, from: &[u8], to: &[u8]);
    /// Bytes of keys and values in the batch.
    fn size_bytes(&self) -> usize;
    /// Whether the batch holds no write.
    fn is_empty(&self) -> bool;
}

/// Where a shard's state lives.
pub trait Store: Send + Sync + 'static {
    type Batch: StoreBatch;

    fn batch(&self) -> Self::Batch;
    /// Writes the batch atomically; durable against a process crash when it returns (and
    /// against a machine crash with the sync option).
    fn write(&self, batch: Self::Batch) -> Result<(), StoreError>;
    /// Reads `keys` (a column family and a key each) from one consistent view of the store,
    /// calling `found(i, value)` for each `keys[i]` that is there, in order.
    fn multi_get(&self, keys: &[(Cf, &[u8])], found: &mut Found<'_>) -> Result<(), StoreError>;
    /// Calls `visit` for every key starting with `prefix`, in key order.
    fn scan(&self, cf: Cf, prefix: &[u8], visit: &mut Visitor<'_>) -> Result<(), StoreError>;
    /// Calls `visit` for every key in `[from, to)`, in key order, until it returns `false`.
    fn scan_range(
        &self,
        cf: Cf,
        from: &[u8],
        to: &[u8],
        visit: &mut RangeVisitor<'_>,
    ) -> Result<(), StoreError>;
    /// Writes a consistent snapshot to `dir` (which must not exist); returns its sequence number.
    fn checkpoint(&self, dir: &Path) -> Result<u64, StoreError>;
    /// Estimated bytes of live data.
    fn live_bytes(&self) -> u64;
    fn durable(&self) -> bool;
    /// Tells the store how many bytes of cells are rewritten by a typical round of pushes
    /// (every dense chunk this shard holds), so that it can size its write buffers to hold a
    /// few versions of them.
    fn working_set_hint(&self, _bytes: u64) {}
    /// The database directory of a durable store (what lives beside it, such as the dense
    /// log, is named after it); `None` in memory.
    fn location(&self) -> Option<&Path> {
        None
    }
}

/// RocksDB tunables, settable in the TOML config file.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RocksOptions {
    /// fsync the WAL on every group commit (survives machine crashes, not only process crashes).
    pub sync: bool,
    pub write_buffer_mib: usize,
    pub max_write_buffers: i32,
    pub max_total_wal_mib: u64,
    pub background_jobs: i32,
    /// WAL files kept for reuse: appending to a fresh file makes the kernel allocate and zero
    /// page-cache pages (0.4-0.8 GB/s on the machines measured), overwriting a recycled file
    /// does not (3-7 GB/s). 0 turns recycling off.
    pub recycle_wal_files: usize,
    /// Size of the push log beside the database (`<db>.dense-log`, named when it held dense
    /// gradients only), in MiB: the gradients of dense pushes and of the sparse rows written
    /// back are logged there; an image of the dense cells in the log (or, for cells over a
    /// quarter of it, a snapshot into RocksDB) and writing back the oldest dirty rows free it.
    /// A larger log lets a hot row take more updates between two writes into RocksDB (the
    /// hot-set rate of `ps-bench --store`: 1.2-1.3 M key updates per shard CPU second at
    /// 512 MiB, 1.4 M at 1 GiB), and a restart reads more of it (0.4-0.5 s, 0.6-0.7 s). 0
    /// writes every update into RocksDB instead.
    pub dense_log_mib: u64,
    /// Size of the push bodies' ring beside the push log (`<db>.dense-bodies`), in MiB; unset:
    /// as large as the push log. The bodies of dense pushes of 64 KiB or more that come by the
    /// bulk stream are received straight into it, and the log's records point at them there
    /// instead of holding a second copy of the values (`body_ring.rs`): at 1 M floats a
    /// durable shard's goodput rises to about its in-memory figure (README, *Performance*).
    /// When it is three quarters held, an image of the dense cells frees it, so it sets how
    /// often images are written as the log's size did. 0: no ring, every body is copied into
    /// the log.
    pub dense_body_mib: Option<u64>,
    /// RocksDB's block cache, for the sparse rows read past the shard's own row cache.
    pub block_cache_mib: usize,
    /// Level-0 files that start a compaction into level 1 (writes slow down at twice as many
    /// and stop at three times). Written-back rows rewrite the hot rows again and again: the
    /// more level-0 files a compaction takes, the more versions of a row it drops at once.
    pub level0_compaction_trigger: i32,
    /// The size level 1 may reach before it is compacted into level 2, in MiB.
    pub level_base_mib: u64,
    /// Flushes and compactions read and write their files with direct I/O, past the page
    /// cache (where the filesystem takes it; otherwise through the page cache, with a
    /// warning). Measured with `ps-bench --store`: with the hot set in the row cache, where the
    /// kernel's page-cache copies were a fifth of the shard's CPU, 1.01-1.41x key updates per
    /// shard CPU second (7 pairs, median 1.09x; RocksDB's threads used no less CPU); with a
    /// tenth of the table cached, the row-cache misses then read the disk instead of the page
    /// cache, at half the rate. So off by default.
    pub direct_io: bool,
    /// Sparse rows still being updated when the push log needs the room of their older
    /// updates are written into the log again as images (*relogged*) instead of back into
    /// RocksDB (`engine/writeback.rs`); false writes every such row back, as before.
    pub relog_rows: bool,
}

impl Default for RocksOptions {
    fn default() -> Self {
        Self {
            sync: false,
            write_buffer_mib: 16,
            max_write_buffers: 2,
            max_total_wal_mib: 64,
            background_jobs: 2,
            recycle_wal_files: 4,
            dense_log_mib: 1024,
            dense_body_mib: None,
            block_cache_mib: 64,
            level0_compaction_trigger: 16,
            level_base_mib: 1024,
            direct_io: false,
            relog_rows: true,
        }
    }
}

/// The durable store.
pub struct RocksStore {
    db: Arc<DB>,
    path: PathBuf,
    sync: bool,
    /// The configured write-buffer size: the floor of the adaptive one.
    base_write_buffer: u64,
}

impl std::fmt::Debug for RocksStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RocksStore")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl RocksStore {
    /// Opens (or creates) the database under `path`, replaying its WAL.
    pub fn open(path: &Path, opts: &RocksOptions) -> Result<Self, StoreError> {
        Self::open_mode(path, opts, false)
    }

    /// Opens the database under `path` to read only (a checkpoint, for export): nothing in
    /// the directory is written, so its files keep matching their manifest.
    pub fn open_read_only(path: &Path, opts: &RocksOptions) -> Result<Self, StoreError> {
        Self::open_mode(path, opts, true)
    }

    fn open_mode(path: &Path, opts: &RocksOptions, read_only: bool) -> Result<Self, StoreError> {
        let err = |source| StoreError::Rocks {
            path: path.display().to_string(),
            source,
        };
        let mut db_opts = Options::default();
        db_opts.create_if_missing(!read_only);
        db_opts.create_missing_column_families(!read_only);
        db_opts.set_max_total_wal_size(opts.max_total_wal_mib << 20);
        db_opts.set_max_background_jobs(opts.background_jobs);
        db_opts.set_enable_pipelined_write(true);
        // One writer thread writes; the metadata's vector memtable takes no concurrent inserts.
        db_opts.set_allow_concurrent_memtable_write(false);
        db_opts.set_recycle_log_file_num(opts.recycle_wal_files);
        if opts.direct_io && !read_only {
            let works = direct_io_works(path);
            if !works {
                tracing::warn!(path = %path.display(), "direct I/O is refused here; flushes and compactions go through the page cache");
            }
            db_opts.set_use_direct_io_for_flush_and_compaction(works);
        }
        // Sparse rows missing from the shard's cache are read here by key: a block cache for
        // the blocks they are in, a Bloom filter per file so that an id never pushed (every
        // new row) costs no block read.
        let block_cache = Cache::new_lru_cache(opts.block_cache_mib << 20);
        let cf_opts = |cf: Cf| {
            let mut o = Options::default();
            // Float mantissas do not compress; spend no CPU trying.
            o.set_compression_type(DBCompressionType::None);
            o.set_write_buffer_size(opts.write_buffer_mib << 20);
            o.set_max_write_buffer_number(opts.max_write_buffers);
            // Measured with rows written back (`ps-bench --store`, the hot set): trigger 16
            // and a 1 GiB level 1 against RocksDB's 4 and 256 MiB, 0.81 M against 0.70-0.73 M
            // key updates per shard CPU second; a tenth of the table cached and a table that
            // evicts rows within the noise.
            let trigger = opts.level0_compaction_trigger.max(1);
            o.set_level_zero_file_num_compaction_trigger(trigger);
            o.set_level_zero_slowdown_writes_trigger(trigger.saturating_mul(2));
            o.set_level_zero_stop_writes_trigger(trigger.saturating_mul(3));
            o.set_max_bytes_for_level_base(opts.level_base_mib.max(1) << 20);
            let mut table = BlockBasedOptions::default();
            table.set_block_cache(&block_cache);
            table.set_bloom_filter(10.0, false);
            table.set_cache_index_and_filter_blocks(true);
            table.set_pin_l0_filter_and_index_blocks_in_cache(true);
            o.set_block_based_table_factory(&table);
            if cf == Cf::Meta {
                // Metadata is read only at start-up, by scans: an append-only vector, sorted
                // when flushed, takes its writes (push ids) cheapest.
                o.set_memtable_factory(MemtableFactory::Vector);
            } else if cf == Cf::ByAge {
                // Read by range from the oldest entry: the default skip list keeps key order.
            } else {
                // Cells reach the store in key-sorted batches (rows written back, dense
                // snapshots) and are read by key: the default skip list takes sorted inserts
                // along one path, and its flush has nothing to sort. A hash memtable (chosen
                // when every pushed row was written through at a random key) was sorted into a
                // skip list at each flush: `ps-bench --store` on the hot set, two sets of three
                // interleaved pairs, 1.74-1.78 M key updates per shard CPU second against
                // 1.53-1.67 M, then (with the prefetching lookups) 1.40-1.62 M against
                // 1.53-1.59 M: within the noise to +10%, and 15-30 MiB less RSS. The prefix
                // extractor (the whole 12-byte key), which the hash memtable needed, stays: the
                // files written with it keep their filters, and scans ask for total order.
                o.set_prefix_extractor(SliceTransform::create_fixed_prefix(CELL_KEY_LEN));
            }
            o
        };
        let db = if read_only {
            // A database written before a column family existed (an older checkpoint) opens
            // without it: reads of it then fail with `Corrupt`, the others work.
            let present = DB::list_cf(&db_opts, path).map_err(err)?;
            let cfs = Cf::ALL
                .into_iter()
                .filter(|cf| present.iter().any(|p| p == cf.name()))
                .map(|cf| ColumnFamilyDescriptor::new(cf.name(), cf_opts(cf)));
            DB::open_cf_descriptors_read_only(&db_opts, path, cfs, false).map_err(err)?
        } else {
            let cfs = Cf::ALL.map(|cf| ColumnFamilyDescriptor::new(cf.name(), cf_opts(cf)));
            DB::open_cf_descriptors(&db_opts, path, cfs).map_err(err)?
        };
        Ok(Self {
            db: Arc::new(db),
            path: path.to_owned(),
            sync: opts.sync,
            base_write_buffer: (opts.write_buffer_mib as u64) << 20,
        })
    }

    fn err(&self, source: rocksdb::Error) -> StoreError {
        StoreError::Rocks {
            path: self.path.display().to_string(),
            source,
        }
    }

    /// Calls `visit` for the keys from `from` (below `to`, when given) in key order, whatever
    /// the column family's prefix extractor, until it returns `false`.
    fn iterate(
        &self,
        cf: Cf,
        from: &[u8],
        to: Option<&[u8]>,
        visit: &mut RangeVisitor<'_>,
    ) -> Result<(), StoreError> {
        let mut ro = rocksdb::ReadOptions::default();
        ro.set_total_order_seek(true);
        if let Some(to) = to {
            // The bound stops the iterator at `to` without stepping over deleted keys past it.
            ro.set_iterate_upper_bound(to.to_vec());
        }
        let it = self.db.iterator_cf_opt(
            self.cf(cf)?,
            ro,
            rocksdb::IteratorMode::From(from, rocksdb::Direction::Forward),
        );
        for item in it {
            let (k, v) = item.map_err(|e| self.err(e))?;
            if !visit(&k, &v)? {
                break;
            }
        }
        Ok(())
    }

    fn cf(&self, cf: Cf) -> Result<&rocksdb::ColumnFamily, StoreError> {
        self.db
            .cf_handle(cf.name())
            .ok_or_else(|| StoreError::Corrupt(format!("column family {} is missing", cf.name())))
    }
}

/// Whether files under `dir` (created if missing) take direct I/O: one block written from a
/// block-aligned buffer with `O_DIRECT`, as RocksDB writes. Some filesystems refuse it (tmpfs
/// before Linux 6.6, some overlay and network ones), and RocksDB would fail its first flush.
fn direct_io_works(dir: &Path) -> bool {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    const BLOCK: usize = 4096;
    if std::fs::create_dir_all(dir).is_err() {
        return false;
    }
    let probe = dir.join(".direct-io-probe");
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(nix::libc::O_DIRECT)
        .open(&probe)
        .and_then(|mut file| {
            let buf = vec![0u8; 2 * BLOCK];
            let at = buf.as_ptr().align_offset(BLOCK);
            file.write_all(&buf[at..at + BLOCK])
        });
    let _ = std::fs::remove_file(&probe);
    written.is_ok()
}

/// A RocksDB write batch plus the column-family handles it writes to.
pub struct RocksBatch {
    batch: rocksdb::WriteBatch,
    db: Arc<DB>,
}

impl RocksBatch {
    fn with_cf(
        &mut self,
        cf: Cf,
        f: impl FnOnce(&mut rocksdb::WriteBatch, &rocksdb::ColumnFamily),
    ) {
        // Every column family is created at open, so the handle exists.
        if let Some(h) = self.db.cf_handle(cf.name()) {
            f(&mut self.batch, h);
        }
    }
}

impl StoreBatch for RocksBatch {
    fn put(&mut self, cf: Cf, key: &[u8], value: &[u8]) {
        self.with_cf(cf, |b, h| b.put_cf(h, key, value));
    }

    fn delete(&mut self, cf: Cf, key: &[u8]) {
        self.with_cf(cf, |b, h| b.delete_cf(h, key));
    }

    fn delete_range(&mut self, cf: Cf, from: &[u8], to: &[u8]) {
        self.with_cf(cf, |b, h| b.delete_range_cf(h, from, to));
    }

    fn size_bytes(&self) -> usize {
        self.batch.size_in_bytes()
    }

    fn is_empty(&self) -> bool {
        self.batch.is_empty()
    }
}

impl Store for RocksStore {
    type Batch = RocksBatch;

    fn batch(&self) -> RocksBatch {
        RocksBatch {
            batch: rocksdb::WriteBatch::default(),
            db: self.db.clone(),
        }
    }

    fn write(&self, batch: RocksBatch) -> Result<(), StoreError> {
        let mut wo = WriteOptions::default();
        wo.set_sync(self.sync);
        self.db.write_opt(batch.batch, &wo).map_err(|e| self.err(e))
    }

    fn multi_get(&self, keys: &[(Cf, &[u8])], found: &mut Found<'_>) -> Result<(), StoreError> {
        if keys.is_empty() {
            return Ok(());
        }
        let mut cfs_keys = Vec::with_capacity(keys.len());
        for &(cf, key) in keys {
            cfs_keys.push((self.cf(cf)?, key));
        }
        // One snapshot for every key: a row's parameters and its optimizer state are read as
        // one group commit left them.
        let snapshot = self.db.snapshot();
        let mut ro = rocksdb::ReadOptions::default();
        ro.set_snapshot(&snapshot);
        let values = self.db.multi_get_cf_opt(cfs_keys, &ro);
        for (i, v) in values.into_iter().enumerate() {
            if let Some(v) = v.map_err(|e| self.err(e))? {
                found(i, &v)?;
            }
        }
        Ok(())
    }

    fn scan(&self, cf: Cf, prefix: &[u8], visit: &mut Visitor<'_>) -> Result<(), StoreError> {
        self.iterate(cf, prefix, None, &mut |k, v| {
            if !k.starts_with(prefix) {
                return Ok(false);
            }
            visit(k, v).map(|()| true)
        })
    }

    fn scan_range(
        &self,
        cf: Cf,
        from: &[u8],
        to: &[u8],
        visit: &mut RangeVisitor<'_>,
    ) -> Result<(), StoreError> {
        self.iterate(cf, from, Some(to), visit)
    }

    fn checkpoint(&self, dir: &Path) -> Result<u64, StoreError> {
        let cp = rocksdb::checkpoint::Checkpoint::new(&self.db).map_err(|e| self.err(e))?;
        let seq = self.db.latest_sequence_number();
        cp.create_checkpoint(dir).map_err(|e| self.err(e))?;
        Ok(seq)
    }

    fn live_bytes(&self) -> u64 {
        Cf::ALL
            .iter()
            .filter_map(|cf| {
                let h = self.db.cf_handle(cf.name())?;
                self.db
                    .property_int_value_cf(h, "rocksdb.estimate-live-data-size")
                    .ok()
                    .flatten()
            })
            .sum()
    }

    fn durable(&self) -> bool {
        true
    }

    fn location(&self) -> Option<&Path> {
        Some(&self.path)
    }

    fn working_set_hint(&self, bytes: u64) {
        // A memtable that holds two versions of every dense chunk flushes only the newest one;
        // one smaller than a single push turns every push into a flush of the whole tensor.
        let size = (bytes.saturating_mul(2))
            .clamp(self.base_write_buffer, 1 << 30)
            .to_string();
        for cf in [Cf::Params, Cf::Optim] {
            if let Some(h) = self.db.cf_handle(cf.name())
                && let Err(e) = self
                    .db
                    .set_options_cf(h, &[("write_buffer_size", size.as_str())])
            {
                tracing::warn!(error = %e, "could not resize the write buffer");
            }
        }
    }
}

/// The in-memory mode: writes are counted and dropped.
#[derive(Debug, Default)]
pub struct MemoryStore {
    written: AtomicU64,
}

#[derive(Debug, Default)]
pub struct MemoryBatch {
    bytes: usize,
    writes: usize,
}

impl StoreBatch for MemoryBatch {
    fn put(&mut self, _: Cf, key: &[u8], value: &[u8]) {
        self.bytes += key.len() + value.len();
        self.writes += 1;
    }

    fn delete(&mut self, _: Cf, key: &[u8]) {
        self.bytes += key.len();
        self.writes += 1;
    }

    fn delete_range(&mut self, _: Cf, from: &[u8], to: &[u8]) {
        self.bytes += from.len() + to.len();
        self.writes += 1;
    }

    fn size_bytes(&self) -> usize {
        self.bytes
    }

    fn is_empty(&self) -> bool {
        self.writes == 0
    }
}

impl Store for MemoryStore {
    type Batch = MemoryBatch;

    fn batch(&self) -> MemoryBatch {
        MemoryBatch::default()
    }

    fn write(&self, batch: MemoryBatch) -> Result<(), StoreError> {
        self.written
            .fetch_add(batch.bytes as u64, Ordering::Relaxed);
        Ok(())
    }

    fn multi_get(&self, _: &[(Cf, &[u8])], _: &mut Found<'_>) -> Result<(), StoreError> {
        Ok(())
    }

    fn scan(&self, _: Cf, _: &[u8], _: &mut Visitor<'_>) -> Result<(), StoreError> {
        Ok(())
    }

    fn scan_range(
        &self,
        _: Cf,
        _: &[u8],
        _: &[u8],
        _: &mut RangeVisitor<'_>,
    ) -> Result<(), StoreError> {
        Ok(())
    }

    fn checkpoint(&self, _: &Path) -> Result<u64, StoreError> {
        Err(StoreError::NotDurable)
    }

    fn live_bytes(&self) -> u64 {
        0
    }

    fn durable(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows written, flushed into files and compacted with direct I/O (or through the page
    /// cache where the filesystem refuses it) read back the same after a reopen.
    #[test]
    fn rows_flushed_and_compacted_with_direct_io_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let opts = RocksOptions {
            direct_io: true,
            write_buffer_mib: 1,
            ..RocksOptions::default()
        };
        let key = |i: u32| {
            let mut k = [0u8; CELL_KEY_LEN];
            k[4..8].copy_from_slice(&i.to_be_bytes());
            k
        };
        let value = |i: u32| vec![(i % 251) as u8; 600];
        {
            let store = RocksStore::open(dir.path(), &opts).unwrap();
            // Several memtables' worth, each batch rewriting some rows of the one before.
            for round in 0..8u32 {
                let mut batch = store.batch();
                for i in round * 500..round * 500 + 1000 {
                    batch.put(Cf::Params, &key(i), &value(i));
                }
                store.write(batch).unwrap();
            }
            let cf = store.cf(Cf::Params).unwrap();
            store.db.flush_cf(cf).unwrap();
            store.db.compact_range_cf(cf, None::<&[u8]>, None::<&[u8]>);
            assert!(
                !store.db.live_files().unwrap().is_empty(),
                "nothing was flushed"
            );
        }
        // RocksDB took the setting where the filesystem takes direct I/O.
        let options = std::fs::read_dir(dir.path())
            .unwrap()
            .filter_map(|e| e.ok())
            .find(|e| e.file_name().to_string_lossy().starts_with("OPTIONS-"))
            .map(|e| std::fs::read_to_string(e.path()).unwrap())
            .expect("RocksDB's options file");
        assert_eq!(
            options.contains("use_direct_io_for_flush_and_compaction=true"),
            direct_io_works(dir.path()),
        );
        let store = RocksStore::open(dir.path(), &opts).unwrap();
        let keys: Vec<[u8; CELL_KEY_LEN]> = (0..4500).map(key).collect();
        let asked: Vec<(Cf, &[u8])> = keys.iter().map(|k| (Cf::Params, &k[..])).collect();
        let mut found = 0u32;
        store
            .multi_get(&asked, &mut |i, v| {
                assert_eq!(v, value(i as u32).as_slice(), "row {i}");
                found += 1;
                Ok(())
            })
            .unwrap();
        assert_eq!(found, 4500);
    }
}
