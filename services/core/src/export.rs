//! The parts of a checkpoint's export for serving (`ExportCheckpoint`): a table's spec, then
//! its values. Shards send them; `psctl export` writes them as files.

use ps_proto::v1 as pb;

use crate::error::ValidationError;
use crate::table::TableSpec;

/// One part of an export, in the order [`ExportPart::Table`] then that table's values.
#[derive(Debug, Clone, PartialEq)]
pub enum ExportPart {
    Table(TableSpec),
    /// Values of a dense table from element `offset` of the whole tensor (row-major).
    Dense {
        offset: u64,
        values: Vec<f32>,
    },
    /// Sparse rows in ascending key order: the table's `dim` values per key.
    Rows {
        keys: Vec<u64>,
        values: Vec<f32>,
    },
    /// Keys (ascending) an earlier checkpoint held that this one does not.
    Deleted {
        keys: Vec<u64>,
    },
}

impl From<ExportPart> for pb::ExportPart {
    fn from(p: ExportPart) -> Self {
        use pb::export_part::Part;
        let part = match p {
            ExportPart::Table(spec) => Part::Table((&spec).into()),
            ExportPart::Dense { offset, values } => Part::Dense(pb::ExportDense {
                offset,
                values: bytemuck::cast_slice::<f32, u8>(&values).to_vec(),
            }),
            ExportPart::Rows { keys, values } => Part::Rows(pb::ExportRows {
                keys,
                values: bytemuck::cast_slice::<f32, u8>(&values).to_vec(),
            }),
            ExportPart::Deleted { keys } => Part::Deleted(pb::ExportDeleted { keys }),
        };
        Self { part: Some(part) }
    }
}

fn f32s(field: &'static str, bytes: &[u8]) -> Result<Vec<f32>, ValidationError> {
    if !bytes.len().is_multiple_of(4) {
        return Err(ValidationError::new(
            field,
            format!("{} bytes is not a whole number of f32", bytes.len()),
        ));
    }
    let mut out = vec![0.0; bytes.len() / 4];
    crate::payload::read_f32_le(bytes, &mut out);
    Ok(out)
}

impl TryFrom<pb::ExportPart> for ExportPart {
    type Error = ValidationError;

    fn try_from(p: pb::ExportPart) -> Result<Self, ValidationError> {
        use pb::export_part::Part;
        Ok(match p.part {
            None => return Err(ValidationError::new("part", "missing")),
            Some(Part::Table(spec)) => Self::Table(TableSpec::try_from(spec)?),
            Some(Part::Dense(d)) => Self::Dense {
                offset: d.offset,
                values: f32s("dense.values", &d.values)?,
            },
            Some(Part::Rows(r)) => Self::Rows {
                values: f32s("rows.values", &r.values)?,
                keys: r.keys,
            },
            Some(Part::Deleted(d)) => Self::Deleted { keys: d.keys },
        })
    }
}
