//! The sender's side: which codec a table uses, and the encoder that applies it.

use std::fmt;
use std::str::FromStr;

use bytes::Bytes;
use rand_xoshiro::Xoshiro256PlusPlus;
use rand_xoshiro::rand_core::SeedableRng;
use serde::{Deserialize, Serialize};

use crate::{Compression, Encoded, Encoding, Header, MAX_BLOCK, MAX_LEVELS, lz4, quant, sparse};

/// How the values of a sparse payload are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SparseValues {
    F32,
    #[default]
    F16,
}

impl SparseValues {
    fn encoding(self) -> Encoding {
        match self {
            Self::F32 => Encoding::SparseF32,
            Self::F16 => Encoding::SparseF16,
        }
    }
}

/// A gradient codec: what a sender does to a vector of f32 before it goes on the wire.
///
/// Written as text (flags, config files) as `f32`, `fp16`, `bf16`, `int8[:block]`, `int4[:block]`,
/// `sign[:block]`, `qsgd[:levels[:block]]`, `topk:ratio[:f32|f16]`, `randomk:ratio[:f32|f16]`,
/// for example `topk:0.01` or `qsgd:15:512`.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Codec {
    #[default]
    F32,
    F16,
    Bf16,
    /// One i8 per value and one scale per `block` values.
    Int8 {
        block: u32,
    },
    /// One 4-bit code per value (two a byte) and one scale per `block` values.
    Int4 {
        block: u32,
    },
    /// One bit per value and one scale (mean magnitude) per `block` values.
    Sign {
        block: u32,
    },
    /// QSGD with `levels` levels and one norm per `block` values.
    Qsgd {
        levels: u32,
        block: u32,
    },
    /// The `ratio · n` values of largest magnitude (at least one).
    TopK {
        ratio: f64,
        values: SparseValues,
    },
    /// `ratio · n` values chosen uniformly at random (at least one).
    RandomK {
        ratio: f64,
        values: SparseValues,
    },
}

/// Default values per scale for the blocked codecs.
pub const DEFAULT_BLOCK: u32 = 256;
/// Default QSGD levels.
pub const DEFAULT_LEVELS: u32 = 15;

impl Codec {
    /// True when the receiver gets back exactly what was sent: no residual to keep.
    pub fn is_lossless(&self) -> bool {
        matches!(self, Self::F32)
    }

    /// The number of entries a sparse codec keeps of `n` values.
    pub fn entries(ratio: f64, n: usize) -> usize {
        if n == 0 {
            return 0;
        }
        ((ratio * n as f64).ceil() as usize).clamp(1, n)
    }

    /// An upper bound of the bytes per value this codec produces for `n` values, before lz4
    /// (which never makes a payload bigger: it is dropped when it does not pay).
    pub fn max_bytes_per_value(&self) -> f64 {
        let scale = |block: u32| 4.0 / f64::from(block.max(1));
        match *self {
            Self::F32 => 4.0,
            Self::F16 | Self::Bf16 => 2.0,
            Self::Int8 { block } => 1.0 + scale(block),
            Self::Int4 { block } => 0.5 + scale(block),
            Self::Sign { block } => 0.125 + scale(block),
            Self::Qsgd { levels, block } => {
                f64::from(crate::qsgd_code_bits(levels)) / 8.0 + scale(block)
            }
            Self::TopK { ratio, values } | Self::RandomK { ratio, values } => {
                let vb = if values == SparseValues::F16 {
                    2.0
                } else {
                    4.0
                };
                ratio.clamp(0.0, 1.0) * (vb + sparse::MAX_VARINT_BYTES as f64)
            }
        }
    }

    /// Checks the parameters.
    pub fn validate(&self) -> Result<(), ParseCodecError> {
        let bad = |m: String| Err(ParseCodecError(m));
        match *self {
            Self::Int8 { block }
            | Self::Int4 { block }
            | Self::Sign { block }
            | Self::Qsgd { block, .. }
                if !(1..=MAX_BLOCK).contains(&block) =>
            {
                bad(format!("block {block} is out of range 1..={MAX_BLOCK}"))
            }
            Self::Qsgd { levels, .. } if !(1..=MAX_LEVELS).contains(&levels) => {
                bad(format!("levels {levels} is out of range 1..={MAX_LEVELS}"))
            }
            Self::TopK { ratio, .. } | Self::RandomK { ratio, .. }
                if !(ratio > 0.0 && ratio <= 1.0) =>
            {
                bad(format!("ratio {ratio} is out of range (0, 1]"))
            }
            _ => Ok(()),
        }
    }
}

impl fmt::Display for Codec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let vals = |v: SparseValues| match v {
            SparseValues::F32 => "f32",
            SparseValues::F16 => "f16",
        };
        match *self {
            Self::F32 => write!(f, "f32"),
            Self::F16 => write!(f, "fp16"),
            Self::Bf16 => write!(f, "bf16"),
            Self::Int8 { block } => write!(f, "int8:{block}"),
            Self::Int4 { block } => write!(f, "int4:{block}"),
            Self::Sign { block } => write!(f, "sign:{block}"),
            Self::Qsgd { levels, block } => write!(f, "qsgd:{levels}:{block}"),
            Self::TopK { ratio, values } => write!(f, "topk:{ratio}:{}", vals(values)),
            Self::RandomK { ratio, values } => write!(f, "randomk:{ratio}:{}", vals(values)),
        }
    }
}

/// A codec name that does not parse, or parameters out of range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad codec: {0}")]
pub struct ParseCodecError(pub String);

impl FromStr for Codec {
    type Err = ParseCodecError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut parts = s.split(':');
        let name = parts.next().unwrap_or_default().to_ascii_lowercase();
        let args: Vec<&str> = parts.collect();
        let num = |i: usize, default: u32| -> Result<u32, ParseCodecError> {
            args.get(i).map_or(Ok(default), |a| {
                a.parse()
                    .map_err(|_| ParseCodecError(format!("`{a}` in `{s}` is not a number")))
            })
        };
        let ratio = || -> Result<f64, ParseCodecError> {
            let a = args.first().ok_or_else(|| {
                ParseCodecError(format!("`{s}` needs a ratio, as in `{name}:0.01`"))
            })?;
            a.parse()
                .map_err(|_| ParseCodecError(format!("`{a}` in `{s}` is not a ratio")))
        };
        let values = || match args.get(1).copied() {
            None | Some("f16" | "fp16") => Ok(SparseValues::F16),
            Some("f32") => Ok(SparseValues::F32),
            Some(other) => Err(ParseCodecError(format!(
                "sparse values are f32 or f16, not `{other}`"
            ))),
        };
        let max_args = match name.as_str() {
            "f32" | "fp16" | "f16" | "bf16" => 0,
            "int8" | "int4" | "sign" => 1,
            _ => 2,
        };
        if args.len() > max_args {
            return Err(ParseCodecError(format!("too many parameters in `{s}`")));
        }
        let codec = match name.as_str() {
            "f32" => Self::F32,
            "fp16" | "f16" => Self::F16,
            "bf16" => Self::Bf16,
            "int8" => Self::Int8 {
                block: num(0, DEFAULT_BLOCK)?,
            },
            "int4" => Self::Int4 {
                block: num(0, DEFAULT_BLOCK)?,
            },
            "sign" => Self::Sign {
                block: num(0, DEFAULT_BLOCK)?,
            },
            "qsgd" => Self::Qsgd {
                levels: num(0, DEFAULT_LEVELS)?,
                block: num(1, DEFAULT_BLOCK)?,
            },
            "topk" => Self::TopK {
                ratio: ratio()?,
                values: values()?,
            },
            "randomk" => Self::RandomK {
                ratio: ratio()?,
                values: values()?,
            },
            _ => {
                return Err(ParseCodecError(format!(
                    "unknown codec `{s}`; known: f32, fp16, bf16, int8[:block], int4[:block], \
                     sign[:block], qsgd[:levels[:block]], topk:ratio[:f16|f32], randomk:ratio[:f16|f32]"
                )));
            }
        };
        codec.validate()?;
        Ok(codec)
    }
}

/// When lz4 goes on top of a codec's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Lz4Policy {
    pub enabled: bool,
    /// Keep the compressed bytes only if they are at least this fraction smaller.
    pub min_saving: f64,
    /// Payloads smaller than this are not tried.
    pub min_bytes: usize,
}

impl Default for Lz4Policy {
    fn default() -> Self {
        Self {
            enabled: true,
            min_saving: 0.10,
            min_bytes: 1024,
        }
    }
}

/// A codec with the rules around it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CompressOptions {
    pub codec: Codec,
    /// Payloads of fewer values go as plain f32: compressing them saves too little to matter.
    pub min_values: usize,
    pub lz4: Lz4Policy,
    /// Whether the sender keeps what the codec dropped and adds it to the next gradient. On by
    /// default for the biased codecs (fp16, bf16, int8, int4, sign, top-k, random-k), where it is
    /// what keeps training on course; off by default for QSGD, which is unbiased on its own and
    /// whose variance at few levels makes a residual grow instead of shrink.
    pub error_feedback: bool,
}

impl Default for CompressOptions {
    fn default() -> Self {
        Self {
            codec: Codec::F32,
            min_values: 1024,
            lz4: Lz4Policy::default(),
            error_feedback: true,
        }
    }
}

impl CompressOptions {
    /// `codec` with the defaults around it, error feedback as the codec wants it.
    pub fn new(codec: Codec) -> Self {
        Self {
            codec,
            error_feedback: !matches!(codec, Codec::Qsgd { .. }),
            ..Self::default()
        }
    }

    /// Whether a sender with these options keeps a residual.
    pub fn keeps_residual(&self) -> bool {
        self.error_feedback && !self.codec.is_lossless()
    }

    /// Whether a sender with these options keeps a residual per embedding row: as
    /// [`CompressOptions::keeps_residual`], except under fp16 and bf16. Rounding to the
    /// nearest half-precision value loses at most half a unit in its last place (a relative
    /// 2^-11 for fp16, 2^-8 for bf16), while a residual per row costs a lookup and an insert
    /// in a table of every row pushed, most of them cache misses: on the CTR-shaped wide &
    /// deep model, 1.5 ms of encoding a step against 0.45 without it, for the same accuracy
    /// (EXPERIMENTS.md). A dense tensor's residual is one contiguous vector and stays.
    pub fn keeps_row_residual(&self) -> bool {
        self.keeps_residual() && !matches!(self.codec, Codec::F16 | Codec::Bf16)
    }
}

/// Encodes vectors with one [`CompressOptions`]. Holds the seeded generator that QSGD and
/// random-k draw from, so a run is reproducible from its seed.
#[derive(Debug, Clone)]
pub struct Encoder {
    opts: CompressOptions,
    rng: Xoshiro256PlusPlus,
}

impl Encoder {
    pub fn new(opts: CompressOptions, seed: u64) -> Self {
        Self {
            opts,
            rng: Xoshiro256PlusPlus::seed_from_u64(seed),
        }
    }

    pub fn options(&self) -> &CompressOptions {
        &self.opts
    }

    /// Changes the codec from the next encode on; the generator keeps its stream.
    pub fn set_codec(&mut self, codec: Codec) {
        self.opts.codec = codec;
    }

    /// Runs `f` with this encoder choosing its codec for `whole` values, not for each call's
    /// own: the parts of one payload (a sparse push's requests to each shard, a dense push's
    /// chunks) then all take the codec the whole would (a part under `min_values` is
    /// compressed when the whole is not under it, and the parts of a whole under it all go as
    /// f32). `floor` raises `min_values` for this payload (0: the options' own).
    pub fn for_parts_of<R>(
        &mut self,
        whole: usize,
        floor: usize,
        f: impl FnOnce(&mut Self) -> R,
    ) -> R {
        let min = self.opts.min_values;
        self.opts.min_values = if whole < min.max(floor) {
            usize::MAX
        } else {
            0
        };
        let r = f(self);
        self.opts.min_values = min;
        r
    }

    /// The codec this encoder will apply to `n` values.
    pub fn codec_for(&self, n: usize) -> Codec {
        let sparse_too_big = u32::try_from(n).is_err()
            && matches!(self.opts.codec, Codec::TopK { .. } | Codec::RandomK { .. });
        if n < self.opts.min_values {
            Codec::F32
        } else if sparse_too_big {
            Codec::F16
        } else {
            self.opts.codec
        }
    }

    /// Whether lz4 is worth trying on `raw` under these options: enabled, big enough, and the
    /// sample test says it may save `min_saving`.
    fn lz4_may_pay(&self, raw: &[u8]) -> bool {
        let lz = self.opts.lz4;
        lz.enabled && raw.len() >= lz.min_bytes && lz4::worth_trying(raw, lz.min_saving)
    }

    /// Whether [`Encoder::encode`] would send `values` as they are, plain uncompressed f32:
    /// the codec is f32 for them and lz4 would not be tried. A sender may then send them from
    /// its own memory without encoding.
    pub fn sends_plain(&self, values: &[f32]) -> bool {
        self.codec_for(values.len()) == Codec::F32
            && !self.lz4_may_pay(bytemuck::cast_slice(values))
    }

    /// Encodes `values`.
    pub fn encode(&mut self, values: &[f32]) -> Encoded {
        let mut buf = Vec::new();
        let header = self.encode_into(values, &mut buf);
        Encoded {
            header,
            data: Bytes::from(buf),
        }
    }

    /// Encodes `values` into `buf` (cleared first; its capacity is reused) and returns the
    /// header. A sender that keeps one buffer avoids faulting in fresh pages on every push.
    pub fn encode_into(&mut self, values: &[f32], buf: &mut Vec<u8>) -> Header {
        buf.clear();
        let n = values.len();
        let codec = self.codec_for(n);
        let mut header = Header {
            num_values: n as u64,
            ..Header::default()
        };
        let raw = buf;
        match codec {
            Codec::F32 => raw.extend_from_slice(bytemuck::cast_slice(values)),
            Codec::F16 => {
                header.encoding = Encoding::F16;
                quant::encode_f16(values, raw);
            }
            Codec::Bf16 => {
                header.encoding = Encoding::Bf16;
                quant::encode_bf16(values, raw);
            }
            Codec::Int8 { block } => {
                header.encoding = Encoding::Int8;
                header.block_size = block;
                quant::encode_int8(values, block as usize, raw);
            }
            Codec::Int4 { block } => {
                header.encoding = Encoding::Int4;
                header.block_size = block;
                quant::encode_int4(values, block as usize, raw);
            }
            Codec::Sign { block } => {
                header.encoding = Encoding::Sign;
                header.block_size = block;
                quant::encode_sign(values, block as usize, raw);
            }
            Codec::Qsgd { levels, block } => {
                header.encoding = Encoding::Qsgd;
                header.block_size = block;
                header.levels = levels;
                quant::encode_qsgd(values, block as usize, levels, &mut self.rng, raw);
            }
            Codec::TopK { ratio, values: v } => {
                let (idx, picked) = sparse::top_k_entries(values, Codec::entries(ratio, n));
                header.encoding = v.encoding();
                header.num_entries = idx.len() as u64;
                sparse::encode_entries(&idx, &picked, header.encoding, raw);
            }
            Codec::RandomK { ratio, values: v } => {
                let idx = sparse::random_k(n, Codec::entries(ratio, n), &mut self.rng);
                let picked: Vec<f32> = idx.iter().map(|&i| values[i as usize]).collect();
                header.encoding = v.encoding();
                header.num_entries = idx.len() as u64;
                sparse::encode_entries(&idx, &picked, header.encoding, raw);
            }
        }
        header.raw_len = raw.len() as u64;
        let lz = self.opts.lz4;
        if self.lz4_may_pay(raw) {
            let packed = lz4::compress(raw);
            if (packed.len() as f64) <= raw.len() as f64 * (1.0 - lz.min_saving) {
                header.compression = Compression::Lz4;
                *raw = packed;
            }
        }
        header
    }
}
