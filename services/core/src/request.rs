//! Validated push and pull requests. Checks that need the table's spec (shape, chunk bounds,
//! row width) are made by the shard that holds it; everything else is checked here.

use ps_proto::v1 as pb;

use crate::error::ValidationError;
use crate::payload::{Encoding, Payload, accept_from_pb};
use crate::table::TableName;

/// Identity of one push, for exactly-once application.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PushId {
    pub client_id: u64,
    pub seq: u64,
    /// The client will never retry a sequence number below this one.
    pub min_unacked_seq: u64,
}

impl TryFrom<Option<pb::PushId>> for PushId {
    type Error = ValidationError;

    fn try_from(p: Option<pb::PushId>) -> Result<Self, Self::Error> {
        let p = p.ok_or_else(|| {
            ValidationError::new(
                "push_id",
                "every push carries (client_id, seq) so a retry is applied once",
            )
        })?;
        if p.client_id == 0 {
            return Err(ValidationError::new(
                "push_id.client_id",
                "0 is reserved; use a random u64",
            ));
        }
        if p.min_unacked_seq > p.seq {
            return Err(ValidationError::new(
                "push_id.min_unacked_seq",
                format!(
                    "{} is above seq {}: a push in flight cannot be below the client's own floor",
                    p.min_unacked_seq, p.seq
                ),
            ));
        }
        Ok(Self {
            client_id: p.client_id,
            seq: p.seq,
            min_unacked_seq: p.min_unacked_seq,
        })
    }
}

impl From<PushId> for pb::PushId {
    fn from(p: PushId) -> Self {
        pb::PushId {
            client_id: p.client_id,
            seq: p.seq,
            min_unacked_seq: p.min_unacked_seq,
        }
    }
}

/// A run of whole chunks of a dense table.
#[derive(Debug, Clone, PartialEq)]
pub struct DenseSlice {
    pub chunk: u64,
    pub values: Payload,
}

impl TryFrom<pb::DenseSlice> for DenseSlice {
    type Error = ValidationError;

    fn try_from(s: pb::DenseSlice) -> Result<Self, Self::Error> {
        let values = s
            .values
            .ok_or_else(|| ValidationError::new("values", "a slice needs its values"))
            .and_then(|v| Payload::try_from(v).map_err(|e| e.within("values")))?;
        Ok(Self {
            chunk: s.chunk,
            values,
        })
    }
}

impl From<DenseSlice> for pb::DenseSlice {
    fn from(s: DenseSlice) -> Self {
        pb::DenseSlice {
            chunk: s.chunk,
            values: Some(s.values.into()),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct PushDense {
    pub table: TableName,
    pub push_id: PushId,
    pub map_epoch: u64,
    pub slices: Vec<DenseSlice>,
}

impl TryFrom<pb::PushDenseRequest> for PushDense {
    type Error = ValidationError;

    fn try_from(r: pb::PushDenseRequest) -> Result<Self, Self::Error> {
        let slices = r
            .slices
            .into_iter()
            .enumerate()
            .map(|(i, s)| DenseSlice::try_from(s).map_err(|e| e.within(&format!("slices[{i}]"))))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            table: TableName::try_from(r.table).map_err(|e| e.within("table"))?,
            push_id: PushId::try_from(r.push_id)?,
            map_epoch: r.map_epoch,
            slices,
        })
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct PullDense {
    pub table: TableName,
    pub chunks: Vec<u64>,
    pub accept: Encoding,
    pub map_epoch: u64,
    pub delta: Option<DeltaPull>,
}

/// A pull of the top-k of each chunk's change since the client's last pull.
#[derive(Debug, Clone, PartialEq)]
pub struct DeltaPull {
    pub client_id: u64,
    pub ratio: f64,
    /// Per requested chunk: the replica version the client holds (0: none).
    pub versions: Vec<u64>,
}

impl TryFrom<pb::PullDenseRequest> for PullDense {
    type Error = ValidationError;

    fn try_from(r: pb::PullDenseRequest) -> Result<Self, Self::Error> {
        let delta = match r.delta {
            None => None,
            Some(d) => {
                if d.client_id == 0 {
                    return Err(ValidationError::new(
                        "delta.client_id",
                        "0 is reserved; use the client's id",
                    ));
                }
                if !(d.ratio > 0.0 && d.ratio <= 1.0) {
                    return Err(ValidationError::new(
                        "delta.ratio",
                        format!("{} is outside (0, 1]", d.ratio),
                    ));
                }
                if d.versions.len() != r.chunks.len() {
                    return Err(ValidationError::new(
                        "delta.versions",
                        format!(
                            "{} versions for {} chunks: give one per chunk (0 for none)",
                            d.versions.len(),
                            r.chunks.len()
                        ),
                    ));
                }
                Some(DeltaPull {
                    client_id: d.client_id,
                    ratio: d.ratio,
                    versions: d.versions,
                })
            }
        };
        Ok(Self {
            table: TableName::try_from(r.table).map_err(|e| e.within("table"))?,
            chunks: r.chunks,
            accept: accept_from_pb(r.accept)?,
            map_epoch: r.map_epoch,
            delta,
        })
    }
}

/// A sparse request's ids from the wire: `ids` (varints) or `fixed_ids` (8-byte words), never
/// both.
fn ids_from_pb(ids: Vec<u64>, fixed_ids: Vec<u64>) -> Result<Vec<u64>, ValidationError> {
    match (ids.is_empty(), fixed_ids.is_empty()) {
        (_, true) => Ok(ids),
        (true, false) => Ok(fixed_ids),
        (false, false) => Err(ValidationError::new(
            "fixed_ids",
            format!(
                "{} ids in `ids` and {} in `fixed_ids`: a request sends its ids in one of them",
                ids.len(),
                fixed_ids.len()
            ),
        )),
    }
}

/// A sparse request's ids as it sends them: in `ids` (varints) or `fixed_ids` (8-byte words).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WireIds {
    pub ids: Vec<u64>,
    pub fixed_ids: Vec<u64>,
}

/// `ids` as a sparse request sends them: as 8-byte words where that is shorter than their
/// varints (hashed ids, at about 9.5 bytes a varint), else as varints.
pub fn ids_to_pb(ids: Vec<u64>) -> WireIds {
    let varints: usize = ids.iter().map(|&id| varint_len(id)).sum();
    if varints > 8 * ids.len() {
        WireIds {
            ids: Vec::new(),
            fixed_ids: ids,
        }
    } else {
        WireIds {
            ids,
            fixed_ids: Vec::new(),
        }
    }
}

/// Bytes of `v` as a protobuf varint.
fn varint_len(v: u64) -> usize {
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

#[derive(Debug, Clone, PartialEq)]
pub struct PushSparse {
    pub table: TableName,
    pub push_id: PushId,
    pub map_epoch: u64,
    pub ids: Vec<u64>,
    pub values: Payload,
    /// The job clock the gradients were computed at, when the client says.
    pub clock: Option<u64>,
}

impl PushSparse {
    /// Checks that the rows match the ids for a table of rows of `dim` values.
    pub fn check_dim(&self, dim: usize) -> Result<(), ValidationError> {
        let want = self.ids.len().checked_mul(dim);
        if want != Some(self.values.len()) {
            return Err(ValidationError::new(
                "values",
                format!(
                    "{} ids of dim {dim} need {} values, but the payload holds {}",
                    self.ids.len(),
                    want.map_or_else(|| "too many".to_owned(), |w| w.to_string()),
                    self.values.len()
                ),
            ));
        }
        Ok(())
    }
}

impl TryFrom<pb::PushSparseRequest> for PushSparse {
    type Error = ValidationError;

    fn try_from(r: pb::PushSparseRequest) -> Result<Self, Self::Error> {
        let values = r
            .values
            .ok_or_else(|| ValidationError::new("values", "a sparse push needs its rows"))
            .and_then(|v| Payload::try_from(v).map_err(|e| e.within("values")))?;
        Ok(Self {
            table: TableName::try_from(r.table).map_err(|e| e.within("table"))?,
            push_id: PushId::try_from(r.push_id)?,
            map_epoch: r.map_epoch,
            ids: ids_from_pb(r.ids, r.fixed_ids)?,
            values,
            clock: r.clock,
        })
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct PullSparse {
    pub table: TableName,
    pub ids: Vec<u64>,
    pub accept: Encoding,
    pub map_epoch: u64,
    /// The rows the client holds (empty: none).
    pub held: Held,
    /// More tables read for the same ids (`PullSparseRequest.also`), in order.
    pub also: Vec<PullSparseAlso>,
}

/// Another table of a sparse pull, read for the request's ids.
#[derive(Debug, Clone, PartialEq)]
pub struct PullSparseAlso {
    pub table: TableName,
    pub accept: Encoding,
    /// The rows the client holds of this table (empty: none).
    pub held: Held,
}

/// The most tables one sparse pull reads besides its own.
pub const MAX_PULL_ALSO: usize = 15;

impl TryFrom<pb::PullSparseRequest> for PullSparse {
    type Error = ValidationError;

    fn try_from(r: pb::PullSparseRequest) -> Result<Self, Self::Error> {
        let ids = ids_from_pb(r.ids, r.fixed_ids)?;
        let held = Held {
            mask: r.held,
            digests: r.held_digests,
        };
        held.check(ids.len())?;
        if r.also.len() > MAX_PULL_ALSO {
            return Err(ValidationError::new(
                "also",
                format!(
                    "{} more tables; one pull reads at most {MAX_PULL_ALSO} besides its own",
                    r.also.len()
                ),
            ));
        }
        let n = ids.len();
        let also = r
            .also
            .into_iter()
            .enumerate()
            .map(|(i, a)| {
                let within = |e: ValidationError| e.within(&format!("also[{i}]"));
                let held = Held {
                    mask: a.held,
                    digests: a.held_digests,
                };
                held.check(n).map_err(within)?;
                Ok(PullSparseAlso {
                    table: TableName::try_from(a.table)
                        .map_err(|e| ValidationError::new(format!("also[{i}].table"), e.reason))?,
                    accept: accept_from_pb(a.accept).map_err(within)?,
                    held,
                })
            })
            .collect::<Result<_, ValidationError>>()?;
        Ok(Self {
            table: TableName::try_from(r.table).map_err(|e| e.within("table"))?,
            ids,
            accept: accept_from_pb(r.accept)?,
            map_epoch: r.map_epoch,
            held,
            also,
        })
    }
}

/// A bit per row of a request (bit `i % 8` of byte `i / 8`), and values for the rows whose bit
/// is set, in order: a pull's held rows and their digests (`PullSparseRequest.held`), or with
/// no values, an answer's unchanged rows (`PullSparseResponse.unchanged`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Held {
    pub mask: Vec<u8>,
    /// [`crate::hash::row_digest`] of each held row's values as the client got them.
    pub digests: Vec<u64>,
}

impl Held {
    /// A mask of `rows` bits, all clear.
    pub fn clear(rows: usize) -> Self {
        Self {
            mask: vec![0; rows.div_ceil(8)],
            digests: Vec::new(),
        }
    }

    /// Whether no row is marked.
    pub fn is_empty(&self) -> bool {
        self.mask.iter().all(|&b| b == 0)
    }

    /// Whether row `i` is marked.
    pub fn has(&self, i: usize) -> bool {
        self.mask.get(i / 8).is_some_and(|b| b >> (i % 8) & 1 == 1)
    }

    /// Marks row `i` (within the mask's rows).
    pub fn mark(&mut self, i: usize) {
        self.mask[i / 8] |= 1 << (i % 8);
    }

    /// Rows marked.
    pub fn count(&self) -> usize {
        self.mask.iter().map(|b| b.count_ones() as usize).sum()
    }

    /// Refuses a mask that is not one bit per row of `rows` (bits past the last clear), or
    /// digests that are not one per marked row. Both empty: none held.
    pub fn check(&self, rows: usize) -> Result<(), ValidationError> {
        if self.mask.is_empty() && self.digests.is_empty() {
            return Ok(());
        }
        self.check_mask(rows)?;
        if self.count() != self.digests.len() {
            return Err(ValidationError::new(
                "held_digests",
                format!(
                    "{} digests for {} held rows; one per held row",
                    self.digests.len(),
                    self.count()
                ),
            ));
        }
        Ok(())
    }

    /// Refuses a mask that is not one bit per row of `rows` (bits past the last clear).
    pub fn check_mask(&self, rows: usize) -> Result<(), ValidationError> {
        if self.mask.len() != rows.div_ceil(8) {
            return Err(ValidationError::new(
                "held",
                format!(
                    "{} bytes for {rows} ids; a bit per id takes {}",
                    self.mask.len(),
                    rows.div_ceil(8)
                ),
            ));
        }
        if !rows.is_multiple_of(8) && self.mask.last().is_some_and(|b| b >> (rows % 8) != 0) {
            return Err(ValidationError::new("held", "bits set past the last id"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_rows_are_checked_against_the_ids() {
        let pull = |ids: usize, held: &[u8], digests: Vec<u64>| {
            PullSparse::try_from(pb::PullSparseRequest {
                table: "emb".into(),
                ids: (0..ids as u64).collect(),
                held: held.to_vec(),
                held_digests: digests,
                ..Default::default()
            })
        };
        let ok = pull(10, &[0b0000_0101, 0b10], vec![1, 2, 3]).unwrap();
        assert!(ok.held.has(0) && !ok.held.has(1) && ok.held.has(2) && ok.held.has(9));
        assert_eq!(ok.held.count(), 3);
        assert!(pull(10, &[], vec![]).unwrap().held.is_empty());
        let field = |e: ValidationError| (e.field, e.reason);
        assert_eq!(
            field(pull(10, &[1], vec![1]).unwrap_err()).0,
            "held",
            "one byte for ten ids"
        );
        assert!(
            field(pull(10, &[1, 0b100], vec![1, 2]).unwrap_err())
                .1
                .contains("past the last id")
        );
        assert_eq!(
            field(pull(10, &[1, 0], vec![1, 2]).unwrap_err()).0,
            "held_digests"
        );
        assert_eq!(field(pull(8, &[], vec![7]).unwrap_err()).0, "held");
        // The other tables' held rows and encodings are checked alike, named by position.
        let with_also = |also: Vec<pb::PullSparseAlso>| {
            PullSparse::try_from(pb::PullSparseRequest {
                table: "emb".into(),
                ids: (0..10).collect(),
                also,
                ..Default::default()
            })
        };
        let part = |table: &str, held: &[u8], digests: Vec<u64>, accept| pb::PullSparseAlso {
            table: table.into(),
            accept,
            held: held.to_vec(),
            held_digests: digests,
        };
        let ok = with_also(vec![part("wide", &[1, 0], vec![5], 4)]).unwrap();
        assert_eq!(ok.also[0].table.as_str(), "wide");
        assert_eq!(ok.also[0].accept, Encoding::Int8);
        assert!(ok.also[0].held.has(0));
        for (also, want) in [
            (
                vec![part("w", &[], vec![], 0), part("x", &[1], vec![1], 0)],
                "also[1].held",
            ),
            (vec![part("w", &[1, 0], vec![], 0)], "also[0].held_digests"),
            (vec![part("", &[], vec![], 0)], "also[0].table"),
            (vec![part("w", &[], vec![], 5)], "also[0].accept"),
            (vec![part("w", &[], vec![], 0); 16], "also"),
        ] {
            assert_eq!(field(with_also(also).unwrap_err()).0, want);
        }
    }

    #[test]
    fn ids_go_as_words_where_that_is_shorter() {
        let hashed: Vec<u64> = (1..=100u64).map(crate::hash::mix64).collect();
        assert_eq!(ids_to_pb(hashed.clone()).fixed_ids, hashed);
        let small: Vec<u64> = (0..100).collect();
        assert_eq!(ids_to_pb(small.clone()).ids, small);
        for ids in [hashed, small] {
            let WireIds {
                ids: varint,
                fixed_ids: fixed,
            } = ids_to_pb(ids.clone());
            let push = PushSparse::try_from(pb::PushSparseRequest {
                table: "emb".into(),
                push_id: Some(pb::PushId {
                    client_id: 1,
                    seq: 1,
                    min_unacked_seq: 0,
                }),
                ids: varint.clone(),
                fixed_ids: fixed.clone(),
                values: Some(Payload::from_f32(&vec![0.0; ids.len()]).into()),
                ..Default::default()
            })
            .unwrap();
            assert_eq!(push.ids, ids);
            let pull = PullSparse::try_from(pb::PullSparseRequest {
                table: "emb".into(),
                ids: varint,
                fixed_ids: fixed,
                ..Default::default()
            })
            .unwrap();
            assert_eq!(pull.ids, ids);
        }
        assert_eq!((0..=(1u64 << 7)).map(varint_len).max(), Some(2));
        assert_eq!(varint_len(0), 1);
        assert_eq!(varint_len(u64::MAX), 10);
        // Both: refused, naming the field.
        let both = PullSparse::try_from(pb::PullSparseRequest {
            table: "emb".into(),
            ids: vec![1],
            fixed_ids: vec![2],
            ..Default::default()
        });
        assert_eq!(both.unwrap_err().field, "fixed_ids");
    }

    #[test]
    fn push_id_is_required_and_checked() {
        assert_eq!(PushId::try_from(None).unwrap_err().field, "push_id");
        let e = PushId::try_from(Some(pb::PushId {
            client_id: 0,
            seq: 1,
            min_unacked_seq: 0,
        }))
        .unwrap_err();
        assert_eq!(e.field, "push_id.client_id");
        let e = PushId::try_from(Some(pb::PushId {
            client_id: 3,
            seq: 1,
            min_unacked_seq: 2,
        }))
        .unwrap_err();
        assert_eq!(e.field, "push_id.min_unacked_seq");
    }

    #[test]
    fn sparse_rows_must_match_ids() {
        let p = PushSparse {
            table: TableName::try_from("e").unwrap(),
            push_id: PushId {
                client_id: 1,
                seq: 1,
                min_unacked_seq: 0,
            },
            map_epoch: 0,
            ids: vec![1, 2, 3],
            values: Payload::from_f32(&[0.0; 8]),
            clock: None,
        };
        assert!(
            p.check_dim(4)
                .unwrap_err()
                .reason
                .contains("3 ids of dim 4 need 12 values")
        );
        assert!(p.check_dim(1).is_err());
        let ok = PushSparse {
            values: Payload::from_f32(&[0.0; 12]),
            ..p
        };
        ok.check_dim(4).unwrap();
    }
}
