//! The receiver's side of a pull: how a table's values come back from the shards.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::{Encoding, ParseCodecError};

/// How a table's pulls travel.
///
/// Written as text (flags, job files) as `f32`, `fp16`, `bf16`, `int8`, `int4` or
/// `delta-topk:R`:
/// - `fp16`, `bf16`: every value rounded to 16 bits by the shard (half the bytes of f32);
/// - `int8`: one byte per value and one f32 scale per block ([`PullCodec::scale_block`]: a
///   sparse table's block holds whole rows), about 0.28 of f32's bytes; each value within half
///   a step (its block's largest magnitude / 254) of what the shard holds;
/// - `int4`: half a byte per value and the same f32 scales, about 0.16 of f32's bytes; each
///   value within half a step (its block's largest magnitude / 14) of what the shard holds;
/// - `delta-topk:R`: a dense chunk comes as the top `R` (a ratio in (0, 1]) of its change
///   since this client's last pull, as fp16 values with their indices, added to the client's
///   copy. The shard keeps the matching copy per client (within its replica memory budget);
///   what a pull leaves out stays in the difference and comes in later pulls. A chunk the
///   shard holds no copy for comes whole in f32. Sparse rows are pulled in fp16 under it.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum PullCodec {
    #[default]
    F32,
    F16,
    Bf16,
    Int8,
    Int4,
    DeltaTopK {
        ratio: f64,
    },
}

impl PullCodec {
    /// The encoding a pull asks the shard for (delta pulls ask f32 for whole chunks).
    pub fn encoding(&self) -> Encoding {
        match self {
            Self::F16 => Encoding::F16,
            Self::Bf16 => Encoding::Bf16,
            Self::Int8 => Encoding::Int8,
            Self::Int4 => Encoding::Int4,
            Self::F32 | Self::DeltaTopK { .. } => Encoding::F32,
        }
    }

    /// The values per scale of an int8 or int4 answer: for rows of `dim` values, the fewest whole rows
    /// that make at least 32 values (so a row never shares a scale with part of another, and a
    /// table of dim 1 still pays a byte and an eighth a value), at most 4096 values (rows
    /// longer than that are cut into blocks of 4096 across their ends); for a dense table
    /// (`dim` 0), 256.
    pub fn scale_block(dim: usize) -> usize {
        const MIN: usize = 32;
        const MAX: usize = 4096;
        if dim == 0 {
            return 256;
        }
        if dim > MAX {
            return MAX;
        }
        (MIN.div_ceil(dim) * dim).min(MAX / dim * dim)
    }

    /// Whether `encoding` rounds each row of `dim` values on its own, so that a row's values
    /// as pulled do not depend on the rows sent beside it: always but for int8 and int4 with rows
    /// shorter than (or cut across) its block. Only such rows can be held by a client and
    /// answered as unchanged.
    pub fn rows_stand_alone(encoding: Encoding, dim: usize) -> bool {
        match encoding {
            Encoding::F32 | Encoding::F16 | Encoding::Bf16 => dim > 0,
            Encoding::Int8 | Encoding::Int4 => dim > 0 && Self::scale_block(dim) == dim,
            _ => false,
        }
    }

    /// The ratio of a delta pull.
    pub fn delta_ratio(&self) -> Option<f64> {
        match *self {
            Self::DeltaTopK { ratio } => Some(ratio),
            _ => None,
        }
    }

    /// What a sparse table pulls when this codec is set for every table: delta pulls are of
    /// dense chunks, so rows then come in fp16 (a compressed pull was asked for; a row has no
    /// earlier copy on the client to send the change against).
    pub fn for_rows(self) -> Self {
        if self.delta_ratio().is_some() {
            Self::F16
        } else {
            self
        }
    }

    /// Refuses a ratio outside (0, 1].
    pub fn validate(&self) -> Result<(), ParseCodecError> {
        match self.delta_ratio() {
            Some(r) if !(r > 0.0 && r <= 1.0) => Err(ParseCodecError(format!(
                "the delta-topk ratio must be in (0, 1], got {r}"
            ))),
            _ => Ok(()),
        }
    }
}

impl fmt::Display for PullCodec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::F32 => f.write_str("f32"),
            Self::F16 => f.write_str("fp16"),
            Self::Bf16 => f.write_str("bf16"),
            Self::Int8 => f.write_str("int8"),
            Self::Int4 => f.write_str("int4"),
            Self::DeltaTopK { ratio } => write!(f, "delta-topk:{ratio}"),
        }
    }
}

impl FromStr for PullCodec {
    type Err = ParseCodecError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let lower = s.to_ascii_lowercase();
        let codec = match lower.split_once(':') {
            None => match lower.as_str() {
                "f32" => Self::F32,
                "fp16" | "f16" => Self::F16,
                "bf16" => Self::Bf16,
                "int8" => Self::Int8,
                "int4" => Self::Int4,
                "delta-topk" => {
                    return Err(ParseCodecError(format!(
                        "`{s}` needs a ratio, as in `delta-topk:0.1`"
                    )));
                }
                _ => {
                    return Err(ParseCodecError(format!(
                        "`{s}` is not a pull codec; use f32, fp16, bf16, int8, int4 or delta-topk:RATIO"
                    )));
                }
            },
            Some(("delta-topk", r)) => Self::DeltaTopK {
                ratio: r
                    .parse()
                    .map_err(|_| ParseCodecError(format!("`{r}` in `{s}` is not a ratio")))?,
            },
            Some(_) => {
                return Err(ParseCodecError(format!(
                    "`{s}` is not a pull codec; use f32, fp16, bf16, int8, int4 or delta-topk:RATIO"
                )));
            }
        };
        codec.validate()?;
        Ok(codec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pull_codecs_round_trip_through_text_and_bad_ones_are_refused() {
        for c in [
            PullCodec::F32,
            PullCodec::F16,
            PullCodec::Bf16,
            PullCodec::Int8,
            PullCodec::Int4,
            PullCodec::DeltaTopK { ratio: 0.05 },
        ] {
            assert_eq!(c.to_string().parse::<PullCodec>().unwrap(), c);
        }
        assert_eq!("F16".parse::<PullCodec>().unwrap(), PullCodec::F16);
        assert_eq!(
            PullCodec::DeltaTopK { ratio: 0.1 }.encoding(),
            Encoding::F32
        );
        assert_eq!(PullCodec::Bf16.encoding(), Encoding::Bf16);
        assert_eq!(
            PullCodec::DeltaTopK { ratio: 0.1 }.for_rows(),
            PullCodec::F16
        );
        assert_eq!(PullCodec::Int8.for_rows(), PullCodec::Int8);
        assert!(PullCodec::rows_stand_alone(Encoding::Int8, 32));
        assert!(PullCodec::rows_stand_alone(Encoding::Int8, 4096));
        assert!(!PullCodec::rows_stand_alone(Encoding::Int8, 1));
        assert!(!PullCodec::rows_stand_alone(Encoding::Int8, 5000));
        assert!(PullCodec::rows_stand_alone(Encoding::F16, 1));
        assert!(!PullCodec::rows_stand_alone(Encoding::Sign, 32));
        assert_eq!(PullCodec::Int8.encoding(), Encoding::Int8);
        assert_eq!(PullCodec::Int4.encoding(), Encoding::Int4);
        assert_eq!(PullCodec::Int4.for_rows(), PullCodec::Int4);
        assert!(PullCodec::rows_stand_alone(Encoding::Int4, 32));
        assert!(!PullCodec::rows_stand_alone(Encoding::Int4, 1));
        // Whole rows per scale, at least 32 values, at most 4096.
        for (dim, block) in [
            (0, 256),
            (1, 32),
            (3, 33),
            (32, 32),
            (48, 48),
            (64, 64),
            (4096, 4096),
            (5000, 4096),
            (3000, 3000),
        ] {
            assert_eq!(PullCodec::scale_block(dim), block, "dim {dim}");
        }
        assert_eq!(PullCodec::F16.for_rows(), PullCodec::F16);
        for (bad, says) in [
            ("int8:64", "not a pull codec"),
            ("int4:64", "not a pull codec"),
            ("delta-topk", "needs a ratio"),
            ("delta-topk:0", "(0, 1]"),
            ("delta-topk:1.5", "(0, 1]"),
            ("delta-topk:NaN", "(0, 1]"),
            ("delta-topk:x", "not a ratio"),
            ("topk:0.1", "not a pull codec"),
        ] {
            let e = bad.parse::<PullCodec>().unwrap_err().to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
