//! What the engine keeps in the store's metadata column family, and how it reads stored bytes
//! back: every read of disk data checks its length first.

use ps_core::TableName;
use ps_core::TableSpec;

use crate::store::StoreError;

/// `t<name>` → the table's record ([`StoredTable`]).
pub(super) const META_TABLE: u8 = b't';
/// The next table id (little-endian u32).
pub(super) const META_NEXT_ID: &[u8] = b"n";
/// The shard's identity ([`StoredIdentity`]).
pub(super) const META_IDENTITY: &[u8] = b"s";
/// `d<client><seq>` → an applied push id above its client's floor.
pub(super) const META_DEDUP: u8 = b'd';
/// `f<client>` → the client's floor (little-endian u64).
pub(super) const META_FLOOR: u8 = b'f';
/// The push-log position the dense cells in the store cover (little-endian u64).
pub(super) const META_LOG_POS: &[u8] = b"l";
/// The log position the sparse rows in the store cover: every update logged before it is in
/// the store (little-endian u64; absent: the same as [`META_LOG_POS`]).
pub(super) const META_ROWS_LOG_POS: &[u8] = b"w";

/// `r<table id>` → the rows a sparse table has on this shard (little-endian u64).
pub(super) const META_ROWS: u8 = b'r';

pub(super) fn rows_key(table_id: u32) -> [u8; 5] {
    let mut k = [0u8; 5];
    k[0] = META_ROWS;
    k[1..].copy_from_slice(&table_id.to_be_bytes());
    k
}

/// The store key of cell `index` of table `table_id`: table id, then index, big-endian (cells
/// of a table are contiguous and sorted).
pub(super) fn cell_key(table_id: u32, index: u64) -> [u8; 12] {
    let mut k = [0u8; 12];
    k[..4].copy_from_slice(&table_id.to_be_bytes());
    k[4..].copy_from_slice(&index.to_be_bytes());
    k
}

/// The `Cf::ByAge` key of row `id` of table `table_id` last pushed at `touched` (seconds since
/// the Unix epoch): table id, time, id, big-endian, so a table's rows sort oldest first.
pub(super) fn age_key(table_id: u32, touched: u32, id: u64) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..4].copy_from_slice(&table_id.to_be_bytes());
    k[4..8].copy_from_slice(&touched.to_be_bytes());
    k[8..].copy_from_slice(&id.to_be_bytes());
    k
}

/// The (time, id) of a `Cf::ByAge` key ([`age_key`]).
pub(super) fn read_age_key(k: &[u8]) -> Result<(u32, u64), StoreError> {
    if k.len() != 16 {
        return Err(StoreError::Corrupt(format!(
            "a row-age key of {} bytes; expected 16",
            k.len()
        )));
    }
    let time = u32::from_be_bytes([k[4], k[5], k[6], k[7]]);
    Ok((time, be_u64(&k[8..])?))
}

/// A `Cf::Touched` value: the row's last push time, little-endian u32 seconds.
pub(super) fn read_touched(v: &[u8]) -> Result<u32, StoreError> {
    v.try_into().map(u32::from_le_bytes).map_err(|_| {
        StoreError::Corrupt(format!(
            "a row's push time of {} bytes; expected 4",
            v.len()
        ))
    })
}

pub(super) fn dedup_key(client: u64, seq: u64) -> [u8; 17] {
    let mut k = [0u8; 17];
    k[0] = META_DEDUP;
    k[1..9].copy_from_slice(&client.to_be_bytes());
    k[9..].copy_from_slice(&seq.to_be_bytes());
    k
}

pub(super) fn floor_key(client: u64) -> [u8; 9] {
    let mut k = [0u8; 9];
    k[0] = META_FLOOR;
    k[1..].copy_from_slice(&client.to_be_bytes());
    k
}

pub(super) fn table_key(name: &TableName) -> Vec<u8> {
    let mut k = vec![META_TABLE];
    k.extend_from_slice(name.as_str().as_bytes());
    k
}

pub(super) fn be_u64(b: &[u8]) -> Result<u64, StoreError> {
    b.try_into()
        .map(u64::from_be_bytes)
        .map_err(|_| StoreError::Corrupt(format!("expected 8 bytes, found {}", b.len())))
}

pub(super) fn le_u64(b: &[u8]) -> Result<u64, StoreError> {
    b.try_into()
        .map(u64::from_le_bytes)
        .map_err(|_| StoreError::Corrupt(format!("expected 8 bytes, found {}", b.len())))
}

/// Reads stored little-endian f32s into `out`, which must be exactly their length.
pub(super) fn read_f32s(bytes: &[u8], out: &mut [f32]) -> Result<(), StoreError> {
    if bytes.len() != out.len() * 4 {
        return Err(StoreError::Corrupt(format!(
            "a stored cell holds {} bytes; its table needs {}",
            bytes.len(),
            out.len() * 4
        )));
    }
    ps_core::payload::read_f32_le(bytes, out);
    Ok(())
}

/// A table's record.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub(super) struct StoredTable {
    pub(super) id: u32,
    pub(super) spec: TableSpec,
}

impl StoredTable {
    /// The record stored under table key `key` (named in the error when it does not parse).
    pub(super) fn read(key: &[u8], value: &[u8]) -> Result<Self, StoreError> {
        serde_json::from_slice(value).map_err(|e| {
            StoreError::Corrupt(format!(
                "table record {:?}: {e}",
                String::from_utf8_lossy(key)
            ))
        })
    }
}

/// Which shard of which cluster a data directory belongs to.
#[derive(Debug, serde::Serialize, serde::Deserialize, PartialEq)]
pub(super) struct StoredIdentity {
    pub(super) shard_index: u32,
    pub(super) num_shards: u32,
    pub(super) virtual_nodes: u32,
}

impl std::fmt::Display for StoredIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} of {} (virtual nodes {})",
            self.shard_index, self.num_shards, self.virtual_nodes
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn age_keys_sort_by_table_then_time_and_read_back() {
        assert!(age_key(1, u32::MAX, u64::MAX) < age_key(2, 0, 0));
        assert!(age_key(1, 255, u64::MAX) < age_key(1, 256, 0));
        assert_eq!(
            read_age_key(&age_key(3, 77, 1 << 40)).unwrap(),
            (77, 1 << 40)
        );
        assert!(read_age_key(&[0; 12]).is_err());
        assert!(read_touched(&[1, 2]).is_err());
    }

    #[test]
    fn dedup_keys_sort_by_client_then_seq() {
        assert!(dedup_key(1, u64::MAX) < dedup_key(2, 0));
        assert!(dedup_key(1, 255) < dedup_key(1, 256));
    }
}
