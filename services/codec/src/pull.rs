//! The receiver's side of a pull: how a table's values come back from the shards.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::{Encoding, ParseCodecError};

/// How a table's pulls travel.
///
/// Written as text (flags, job files) as `f32`, `fp16`, `bf16` or `delta-topk:R`:
/// - `fp16`, `bf16`: every value rounded to 16 bits by the shard (half the bytes of f32);
/// - `delta-topk:R`: a dense chunk comes as the top `R` (a ratio in (0, 1]) of its change
///   since this client's last pull, as fp16 values with their indices, added to the client's
///   copy. The shard keeps the matching copy per client (within its replica memory budget);
///   what a pull leaves out stays in the difference and comes in later pulls. A chunk the
///   shard holds no copy for comes whole in f32. Sparse rows are pulled in f32 under it.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum PullCodec {
    #[default]
    F32,
    F16,
    Bf16,
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
            Self::F32 | Self::DeltaTopK { .. } => Encoding::F32,
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
    /// dense chunks, so rows then come in f32.
    pub fn for_rows(self) -> Self {
        if self.delta_ratio().is_some() {
            Self::F32
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
                "delta-topk" => {
                    return Err(ParseCodecError(format!(
                        "`{s}` needs a ratio, as in `delta-topk:0.1`"
                    )));
                }
                _ => {
                    return Err(ParseCodecError(format!(
                        "`{s}` is not a pull codec; use f32, fp16, bf16 or delta-topk:RATIO"
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
                    "`{s}` is not a pull codec; use f32, fp16, bf16 or delta-topk:RATIO"
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
            PullCodec::F32
        );
        assert_eq!(PullCodec::F16.for_rows(), PullCodec::F16);
        for (bad, says) in [
            ("int8", "not a pull codec"),
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
