//! Table specs: what a table holds, how it is initialized and how pushes update it.

use std::fmt;

use ps_proto::v1 as pb;
use serde::{Deserialize, Serialize};

use crate::error::ValidationError;
use crate::hash::fnv1a;

/// Values per dense chunk when a spec leaves it at 0: 1 MiB of f32.
pub const DEFAULT_CHUNK_ELEMS: u64 = 256 * 1024;
/// The largest dense tensor: 2^40 values (4 TiB of f32), far above any one model.
pub const MAX_DENSE_ELEMS: u64 = 1 << 40;
/// The widest sparse row.
pub const MAX_SPARSE_DIM: u32 = 1 << 16;
/// The largest dense chunk (64 Mi values, 256 MiB).
pub const MAX_CHUNK_ELEMS: u64 = 1 << 26;
const MAX_NAME_LEN: usize = 128;

/// A validated table name: 1 to 128 characters of `[A-Za-z0-9_.\-/]`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct TableName(String);

impl TableName {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The stable hash of the name, which seeds routing and initial values.
    pub fn hash64(&self) -> u64 {
        fnv1a(self.0.as_bytes())
    }
}

impl TryFrom<String> for TableName {
    type Error = ValidationError;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        if s.is_empty() {
            return Err(ValidationError::new("name", "a table name cannot be empty"));
        }
        if s.len() > MAX_NAME_LEN {
            return Err(ValidationError::new(
                "name",
                format!(
                    "`{}…` is {} bytes; the limit is {MAX_NAME_LEN}",
                    s.chars().take(16).collect::<String>(),
                    s.len()
                ),
            ));
        }
        if let Some(c) = s
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/')))
        {
            return Err(ValidationError::new(
                "name",
                format!("`{s}` holds {c:?}; use letters, digits and `_ - . /`"),
            ));
        }
        Ok(Self(s))
    }
}

impl TryFrom<&str> for TableName {
    type Error = ValidationError;

    fn try_from(s: &str) -> Result<Self, Self::Error> {
        Self::try_from(s.to_owned())
    }
}

impl From<TableName> for String {
    fn from(n: TableName) -> Self {
        n.0
    }
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The shape and chunking of a dense tensor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DenseShape {
    pub shape: Vec<u64>,
    pub chunk_elems: u64,
}

impl DenseShape {
    /// Number of values in the tensor (the product of the shape; 1 for a scalar).
    pub fn len(&self) -> u64 {
        self.shape.iter().product()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Number of chunks; the last may be short.
    pub fn num_chunks(&self) -> u64 {
        self.len().div_ceil(self.chunk_elems)
    }

    /// The element range of chunk `c`, or `None` past the end.
    pub fn chunk_range(&self, c: u64) -> Option<std::ops::Range<u64>> {
        let start = c.checked_mul(self.chunk_elems)?;
        let len = self.len();
        (start < len).then(|| start..(start + self.chunk_elems).min(len))
    }

    /// Number of values in chunk `c`, or `None` past the end.
    pub fn chunk_len(&self, c: u64) -> Option<usize> {
        self.chunk_range(c).map(|r| (r.end - r.start) as usize)
    }
}

/// Whether a table is one dense tensor or a map of sparse rows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum TableKind {
    Dense(DenseShape),
    Sparse { dim: u32 },
}

/// The server-side optimizer a table applies pushed gradients with.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum Optimizer {
    Sgd {
        learning_rate: f32,
    },
    Momentum {
        learning_rate: f32,
        momentum: f32,
        nesterov: bool,
    },
    Adagrad {
        learning_rate: f32,
        initial_accumulator: f32,
        epsilon: f32,
    },
    Adam {
        learning_rate: f32,
        beta1: f32,
        beta2: f32,
        epsilon: f32,
    },
    Ftrl {
        alpha: f32,
        beta: f32,
        l1: f32,
        l2: f32,
    },
}

impl Optimizer {
    pub fn sgd(learning_rate: f32) -> Self {
        Self::Sgd { learning_rate }
    }

    pub fn momentum(learning_rate: f32, momentum: f32) -> Self {
        Self::Momentum {
            learning_rate,
            momentum,
            nesterov: false,
        }
    }

    pub fn adagrad(learning_rate: f32) -> Self {
        Self::Adagrad {
            learning_rate,
            initial_accumulator: 0.1,
            epsilon: 1e-10,
        }
    }

    pub fn adam(learning_rate: f32) -> Self {
        Self::Adam {
            learning_rate,
            beta1: 0.9,
            beta2: 0.999,
            epsilon: 1e-8,
        }
    }

    pub fn ftrl(alpha: f32, beta: f32, l1: f32, l2: f32) -> Self {
        Self::Ftrl {
            alpha,
            beta,
            l1,
            l2,
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Self::Sgd { .. } => "sgd",
            Self::Momentum { .. } => "momentum",
            Self::Adagrad { .. } => "adagrad",
            Self::Adam { .. } => "adam",
            Self::Ftrl { .. } => "ftrl",
        }
    }

    /// Optimizer-state values kept per parameter value.
    pub fn state_slots(&self) -> usize {
        match self {
            Self::Sgd { .. } => 0,
            Self::Momentum { .. } | Self::Adagrad { .. } => 1,
            Self::Adam { .. } | Self::Ftrl { .. } => 2,
        }
    }

    fn validate(&self) -> Result<(), ValidationError> {
        fn positive(field: &str, v: f32) -> Result<(), ValidationError> {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(ValidationError::new(
                    field,
                    format!("must be a finite number > 0, got {v}"),
                ))
            }
        }
        fn non_negative(field: &str, v: f32) -> Result<(), ValidationError> {
            if v.is_finite() && v >= 0.0 {
                Ok(())
            } else {
                Err(ValidationError::new(
                    field,
                    format!("must be a finite number >= 0, got {v}"),
                ))
            }
        }
        fn unit(field: &str, v: f32) -> Result<(), ValidationError> {
            if v.is_finite() && (0.0..1.0).contains(&v) {
                Ok(())
            } else {
                Err(ValidationError::new(
                    field,
                    format!("must be in [0, 1), got {v}"),
                ))
            }
        }
        match *self {
            Self::Sgd { learning_rate } => positive("sgd.learning_rate", learning_rate),
            Self::Momentum {
                learning_rate,
                momentum,
                ..
            } => {
                positive("momentum.learning_rate", learning_rate)?;
                unit("momentum.momentum", momentum)
            }
            Self::Adagrad {
                learning_rate,
                initial_accumulator,
                epsilon,
            } => {
                positive("adagrad.learning_rate", learning_rate)?;
                non_negative("adagrad.initial_accumulator", initial_accumulator)?;
                positive("adagrad.epsilon", epsilon)
            }
            Self::Adam {
                learning_rate,
                beta1,
                beta2,
                epsilon,
            } => {
                positive("adam.learning_rate", learning_rate)?;
                unit("adam.beta1", beta1)?;
                unit("adam.beta2", beta2)?;
                positive("adam.epsilon", epsilon)
            }
            Self::Ftrl {
                alpha,
                beta,
                l1,
                l2,
            } => {
                positive("ftrl.alpha", alpha)?;
                non_negative("ftrl.beta", beta)?;
                non_negative("ftrl.l1", l1)?;
                non_negative("ftrl.l2", l2)
            }
        }
    }
}

/// How rows and tensors get their first values.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum InitializerKind {
    Zeros,
    Uniform { low: f32, high: f32 },
    Normal { mean: f32, stddev: f32 },
}

/// An initializer with its seed. See [`crate::init`] for how values are derived.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Initializer {
    pub kind: InitializerKind,
    pub seed: u64,
}

impl Initializer {
    pub const ZEROS: Self = Self {
        kind: InitializerKind::Zeros,
        seed: 0,
    };

    pub fn uniform(low: f32, high: f32, seed: u64) -> Self {
        Self {
            kind: InitializerKind::Uniform { low, high },
            seed,
        }
    }

    pub fn normal(mean: f32, stddev: f32, seed: u64) -> Self {
        Self {
            kind: InitializerKind::Normal { mean, stddev },
            seed,
        }
    }

    fn validate(&self) -> Result<(), ValidationError> {
        match self.kind {
            InitializerKind::Zeros => Ok(()),
            InitializerKind::Uniform { low, high } => {
                if low.is_finite() && high.is_finite() && low < high {
                    Ok(())
                } else {
                    Err(ValidationError::new(
                        "uniform",
                        format!("needs finite low < high, got [{low}, {high})"),
                    ))
                }
            }
            InitializerKind::Normal { mean, stddev } => {
                if mean.is_finite() && stddev.is_finite() && stddev >= 0.0 {
                    Ok(())
                } else {
                    Err(ValidationError::new(
                        "normal",
                        format!("needs a finite mean and stddev >= 0, got ({mean}, {stddev})"),
                    ))
                }
            }
        }
    }
}

/// What a push holding a NaN or an infinity does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum NonFinitePolicy {
    /// The whole push is refused with `invalid_argument`.
    #[default]
    Reject,
    /// The sparse rows (dense chunks) holding one are skipped and counted.
    Skip,
}

/// A complete, validated table spec: defaults filled in, every field checked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TableSpec {
    pub name: TableName,
    pub kind: TableKind,
    pub optimizer: Optimizer,
    pub initializer: Initializer,
    pub non_finite: NonFinitePolicy,
    /// Sparse tables: an id's row is stored only once the id was pushed this many times (0 and
    /// 1: on its first push). See `SparseSpec.admit_after`.
    #[serde(default)]
    pub admit_after: u32,
    /// Sparse tables on durable shards: a row not pushed for this many seconds is evicted (0:
    /// never). See `SparseSpec.ttl_seconds`.
    #[serde(default)]
    pub ttl_seconds: u64,
    /// Sparse tables on durable shards: a row not pushed for this many job clocks is evicted
    /// (0: never; not with `ttl_seconds`). See `SparseSpec.ttl_clocks`.
    #[serde(default)]
    pub ttl_clocks: u64,
    /// Sparse tables on durable shards: the most rows the table holds, over all shards (each of
    /// N shards holds at most `ceil(max_rows / N)`); past it the least recently pushed rows are
    /// evicted (0: no cap). See `SparseSpec.max_rows`.
    #[serde(default)]
    pub max_rows: u64,
    /// Sparse tables: the name whose hash places the table's ids on the shards, so that tables
    /// placed alike keep each id's rows on one shard (`None`: the table's own name). See
    /// `SparseSpec.placed_with` and [`TableSpec::placement_hash`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placed_with: Option<TableName>,
}

/// The most pushes admission may wait for: the sketch counts to `u16::MAX`.
pub const MAX_ADMIT_AFTER: u32 = 10_000;

/// The longest time to live a sparse table may set: ten years (row touch times are kept in
/// whole seconds as u32s).
pub const MAX_TTL_SECONDS: u64 = 10 * 365 * 86_400;

/// The largest row cap a sparse table may set.
pub const MAX_ROWS_CAP: u64 = 1 << 48;

/// The longest time to live in job clocks (row stamps are u32s).
pub const MAX_TTL_CLOCKS: u64 = u32::MAX as u64;

impl TableSpec {
    /// A dense table of `shape` with SGD at 0.01 and zeros; chain the setters to change them.
    pub fn dense(name: &str, shape: &[u64]) -> Result<Self, ValidationError> {
        Self {
            name: TableName::try_from(name)?,
            kind: TableKind::Dense(DenseShape {
                shape: shape.to_vec(),
                chunk_elems: DEFAULT_CHUNK_ELEMS,
            }),
            optimizer: Optimizer::sgd(0.01),
            initializer: Initializer::ZEROS,
            non_finite: NonFinitePolicy::Reject,
            admit_after: 0,
            ttl_seconds: 0,
            ttl_clocks: 0,
            max_rows: 0,
            placed_with: None,
        }
        .validated()
    }

    /// A sparse table of rows of `dim` values with SGD at 0.01 and zeros.
    pub fn sparse(name: &str, dim: u32) -> Result<Self, ValidationError> {
        Self {
            name: TableName::try_from(name)?,
            kind: TableKind::Sparse { dim },
            optimizer: Optimizer::sgd(0.01),
            initializer: Initializer::ZEROS,
            non_finite: NonFinitePolicy::Reject,
            admit_after: 0,
            ttl_seconds: 0,
            ttl_clocks: 0,
            max_rows: 0,
            placed_with: None,
        }
        .validated()
    }

    pub fn with_optimizer(mut self, optimizer: Optimizer) -> Result<Self, ValidationError> {
        self.optimizer = optimizer;
        self.validated()
    }

    pub fn with_initializer(mut self, initializer: Initializer) -> Result<Self, ValidationError> {
        self.initializer = initializer;
        self.validated()
    }

    pub fn with_chunk_elems(mut self, chunk_elems: u64) -> Result<Self, ValidationError> {
        if let TableKind::Dense(d) = &mut self.kind {
            d.chunk_elems = chunk_elems;
        }
        self.validated()
    }

    /// Stores an id's row only once the id was pushed `n` times (sparse tables).
    pub fn with_admit_after(mut self, n: u32) -> Result<Self, ValidationError> {
        self.admit_after = n;
        self.validated()
    }

    /// Evicts a row not pushed for `seconds` (sparse tables; 0: never).
    pub fn with_ttl_seconds(mut self, seconds: u64) -> Result<Self, ValidationError> {
        self.ttl_seconds = seconds;
        self.validated()
    }

    /// Evicts a row not pushed for `clocks` job clocks (sparse tables; 0: never).
    pub fn with_ttl_clocks(mut self, clocks: u64) -> Result<Self, ValidationError> {
        self.ttl_clocks = clocks;
        self.validated()
    }

    /// Holds at most `rows` rows, evicting the least recently pushed past it (sparse tables;
    /// 0: no cap).
    pub fn with_max_rows(mut self, rows: u64) -> Result<Self, ValidationError> {
        self.max_rows = rows;
        self.validated()
    }

    /// Places the ids of this sparse table as table `name` places its own (see
    /// [`TableSpec::placement_hash`]); its own name means the default placement.
    pub fn placed_with(mut self, name: &str) -> Result<Self, ValidationError> {
        self.placed_with = Some(
            TableName::try_from(name)
                .map_err(|e| ValidationError::new("sparse.placed_with", e.reason))?,
        );
        self.validated()
    }

    /// The hash the consistent-hash ring places this table's sparse ids (and dense chunks) by:
    /// that of [`TableSpec::placed_with`]'s name, or of the table's own. Two sparse tables with
    /// the same placement hash keep each id's rows on the same shard.
    pub fn placement_hash(&self) -> u64 {
        self.placed_with.as_ref().unwrap_or(&self.name).hash64()
    }

    /// Whether rows of this table are evicted by age or count (TTL or a row cap).
    pub fn evicts_rows(&self) -> bool {
        self.ttl_seconds > 0 || self.ttl_clocks > 0 || self.max_rows > 0
    }

    pub fn with_non_finite(mut self, policy: NonFinitePolicy) -> Self {
        self.non_finite = policy;
        self
    }

    /// Values in one row: the sparse dim, or 1 for dense tables.
    pub fn row_dim(&self) -> usize {
        match &self.kind {
            TableKind::Dense(_) => 1,
            TableKind::Sparse { dim } => *dim as usize,
        }
    }

    pub fn dense_shape(&self) -> Option<&DenseShape> {
        match &self.kind {
            TableKind::Dense(d) => Some(d),
            TableKind::Sparse { .. } => None,
        }
    }

    /// Checks the invariants every stored spec holds (and drops a `placed_with` that names
    /// the table itself: that is the default placement).
    pub fn validated(mut self) -> Result<Self, ValidationError> {
        if self.placed_with.as_ref() == Some(&self.name) {
            self.placed_with = None;
        }
        match &self.kind {
            TableKind::Dense(d) => {
                let mut len: u64 = 1;
                for (i, &s) in d.shape.iter().enumerate() {
                    if s == 0 {
                        return Err(ValidationError::new(
                            "dense.shape",
                            format!("dimension {i} is 0; every dimension must be >= 1"),
                        ));
                    }
                    len = len
                        .checked_mul(s)
                        .filter(|l| *l <= MAX_DENSE_ELEMS)
                        .ok_or_else(|| {
                            ValidationError::new(
                                "dense.shape",
                                format!("{:?} holds more than {MAX_DENSE_ELEMS} values", d.shape),
                            )
                        })?;
                }
                if d.chunk_elems == 0 || d.chunk_elems > MAX_CHUNK_ELEMS {
                    return Err(ValidationError::new(
                        "dense.chunk_elems",
                        format!("must be in 1..={MAX_CHUNK_ELEMS}, got {}", d.chunk_elems),
                    ));
                }
                if matches!(self.optimizer, Optimizer::Ftrl { .. }) {
                    return Err(ValidationError::new(
                        "optimizer",
                        "FTRL-proximal is for sparse tables; use sgd, momentum, adagrad or adam",
                    ));
                }
                if self.admit_after > 1 {
                    return Err(ValidationError::new(
                        "sparse.admit_after",
                        "admission is for sparse tables; every dense value is stored",
                    ));
                }
                if self.evicts_rows() {
                    return Err(ValidationError::new(
                        if self.ttl_seconds > 0 {
                            "sparse.ttl_seconds"
                        } else if self.ttl_clocks > 0 {
                            "sparse.ttl_clocks"
                        } else {
                            "sparse.max_rows"
                        },
                        "eviction is for sparse tables; dense values are never evicted",
                    ));
                }
                if self.placed_with.is_some() {
                    return Err(ValidationError::new(
                        "sparse.placed_with",
                        "placement by another table's name is for sparse tables; a dense \
                         table's chunks are placed by its own",
                    ));
                }
            }
            TableKind::Sparse { dim } => {
                if *dim == 0 || *dim > MAX_SPARSE_DIM {
                    return Err(ValidationError::new(
                        "sparse.dim",
                        format!("must be in 1..={MAX_SPARSE_DIM}, got {dim}"),
                    ));
                }
                if self.ttl_seconds > 0 && self.ttl_clocks > 0 {
                    return Err(ValidationError::new(
                        "sparse.ttl_clocks",
                        "a table ages its rows by seconds or by job clocks, not both",
                    ));
                }
                for (field, value, max, meaning) in [
                    (
                        "sparse.admit_after",
                        u64::from(self.admit_after),
                        u64::from(MAX_ADMIT_AFTER),
                        "",
                    ),
                    (
                        "sparse.ttl_seconds",
                        self.ttl_seconds,
                        MAX_TTL_SECONDS,
                        " (ten years)",
                    ),
                    ("sparse.ttl_clocks", self.ttl_clocks, MAX_TTL_CLOCKS, ""),
                    ("sparse.max_rows", self.max_rows, MAX_ROWS_CAP, ""),
                ] {
                    if value > max {
                        return Err(ValidationError::new(
                            field,
                            format!("must be at most {max}{meaning}, got {value}"),
                        ));
                    }
                }
            }
        }
        self.optimizer
            .validate()
            .map_err(|e| e.within("optimizer"))?;
        self.initializer
            .validate()
            .map_err(|e| e.within("initializer"))?;
        Ok(self)
    }

    /// Says how `other` differs from `self`, for `already_exists` messages.
    pub fn difference(&self, other: &TableSpec) -> Option<String> {
        if self.kind != other.kind {
            Some(format!("kind/shape {:?} vs {:?}", self.kind, other.kind))
        } else if self.optimizer != other.optimizer {
            Some(format!(
                "optimizer {:?} vs {:?}",
                self.optimizer, other.optimizer
            ))
        } else if self.initializer != other.initializer {
            Some(format!(
                "initializer {:?} vs {:?}",
                self.initializer, other.initializer
            ))
        } else if self.non_finite != other.non_finite {
            Some(format!(
                "non_finite {:?} vs {:?}",
                self.non_finite, other.non_finite
            ))
        } else if self.admit_after.max(1) != other.admit_after.max(1) {
            Some(format!(
                "admit_after {} vs {}",
                self.admit_after, other.admit_after
            ))
        } else if self.ttl_seconds != other.ttl_seconds {
            Some(format!(
                "ttl_seconds {} vs {}",
                self.ttl_seconds, other.ttl_seconds
            ))
        } else if self.ttl_clocks != other.ttl_clocks {
            Some(format!(
                "ttl_clocks {} vs {}",
                self.ttl_clocks, other.ttl_clocks
            ))
        } else if self.max_rows != other.max_rows {
            Some(format!("max_rows {} vs {}", self.max_rows, other.max_rows))
        } else if self.placed_with != other.placed_with {
            let name = |p: &Option<TableName>| {
                p.as_ref()
                    .map_or_else(|| "its own name".to_owned(), |n| format!("`{n}`"))
            };
            Some(format!(
                "placed_with {} vs {}",
                name(&self.placed_with),
                name(&other.placed_with)
            ))
        } else {
            None
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Wire conversions

impl TryFrom<pb::TableSpec> for TableSpec {
    type Error = ValidationError;

    fn try_from(p: pb::TableSpec) -> Result<Self, Self::Error> {
        let name = TableName::try_from(p.name)?;
        let (mut admit_after, mut ttl_seconds, mut ttl_clocks, mut max_rows) = (0, 0, 0, 0);
        let mut placed_with = None;
        let kind = match p.kind {
            Some(pb::table_spec::Kind::Dense(d)) => TableKind::Dense(DenseShape {
                shape: d.shape,
                chunk_elems: if d.chunk_elems == 0 {
                    DEFAULT_CHUNK_ELEMS
                } else {
                    d.chunk_elems
                },
            }),
            Some(pb::table_spec::Kind::Sparse(s)) => {
                admit_after = s.admit_after;
                ttl_seconds = s.ttl_seconds;
                ttl_clocks = s.ttl_clocks;
                max_rows = s.max_rows;
                if !s.placed_with.is_empty() {
                    placed_with = Some(
                        TableName::try_from(s.placed_with)
                            .map_err(|e| ValidationError::new("sparse.placed_with", e.reason))?,
                    );
                }
                TableKind::Sparse { dim: s.dim }
            }
            None => {
                return Err(ValidationError::new(
                    "kind",
                    "set either `dense` or `sparse`",
                ));
            }
        };
        let optimizer = match p.optimizer.and_then(|o| o.kind) {
            Some(pb::optimizer::Kind::Sgd(o)) => Optimizer::Sgd {
                learning_rate: o.learning_rate,
            },
            Some(pb::optimizer::Kind::Momentum(o)) => Optimizer::Momentum {
                learning_rate: o.learning_rate,
                momentum: o.momentum,
                nesterov: o.nesterov,
            },
            Some(pb::optimizer::Kind::Adagrad(o)) => Optimizer::Adagrad {
                learning_rate: o.learning_rate,
                initial_accumulator: o.initial_accumulator,
                epsilon: if o.epsilon == 0.0 { 1e-10 } else { o.epsilon },
            },
            Some(pb::optimizer::Kind::Adam(o)) => Optimizer::Adam {
                learning_rate: o.learning_rate,
                beta1: o.beta1,
                beta2: o.beta2,
                epsilon: if o.epsilon == 0.0 { 1e-8 } else { o.epsilon },
            },
            Some(pb::optimizer::Kind::Ftrl(o)) => Optimizer::Ftrl {
                alpha: o.alpha,
                beta: o.beta,
                l1: o.l1,
                l2: o.l2,
            },
            None => {
                return Err(ValidationError::new(
                    "optimizer",
                    "set one of sgd, momentum, adagrad, adam or ftrl",
                ));
            }
        };
        let initializer = match p.initializer {
            None => Initializer::ZEROS,
            Some(i) => Initializer {
                kind: match i.kind {
                    None | Some(pb::initializer::Kind::Zeros(_)) => InitializerKind::Zeros,
                    Some(pb::initializer::Kind::Uniform(u)) => InitializerKind::Uniform {
                        low: u.low,
                        high: u.high,
                    },
                    Some(pb::initializer::Kind::Normal(n)) => InitializerKind::Normal {
                        mean: n.mean,
                        stddev: n.stddev,
                    },
                },
                seed: i.seed,
            },
        };
        let non_finite = match pb::NonFinitePolicy::try_from(p.non_finite) {
            Ok(pb::NonFinitePolicy::Unspecified | pb::NonFinitePolicy::Reject) => {
                NonFinitePolicy::Reject
            }
            Ok(pb::NonFinitePolicy::Skip) => NonFinitePolicy::Skip,
            Err(_) => {
                return Err(ValidationError::new(
                    "non_finite",
                    format!("unknown policy {}", p.non_finite),
                ));
            }
        };
        TableSpec {
            name,
            kind,
            optimizer,
            initializer,
            non_finite,
            admit_after,
            ttl_seconds,
            ttl_clocks,
            max_rows,
            placed_with,
        }
        .validated()
        .map_err(|e| e.within("spec"))
    }
}

impl From<&TableSpec> for pb::TableSpec {
    fn from(s: &TableSpec) -> Self {
        let kind = match &s.kind {
            TableKind::Dense(d) => pb::table_spec::Kind::Dense(pb::DenseSpec {
                shape: d.shape.clone(),
                chunk_elems: d.chunk_elems,
            }),
            TableKind::Sparse { dim } => pb::table_spec::Kind::Sparse(pb::SparseSpec {
                dim: *dim,
                admit_after: s.admit_after,
                ttl_seconds: s.ttl_seconds,
                ttl_clocks: s.ttl_clocks,
                max_rows: s.max_rows,
                placed_with: s
                    .placed_with
                    .as_ref()
                    .map(|n| n.to_string())
                    .unwrap_or_default(),
            }),
        };
        let optimizer = match s.optimizer {
            Optimizer::Sgd { learning_rate } => pb::optimizer::Kind::Sgd(pb::Sgd { learning_rate }),
            Optimizer::Momentum {
                learning_rate,
                momentum,
                nesterov,
            } => pb::optimizer::Kind::Momentum(pb::Momentum {
                learning_rate,
                momentum,
                nesterov,
            }),
            Optimizer::Adagrad {
                learning_rate,
                initial_accumulator,
                epsilon,
            } => pb::optimizer::Kind::Adagrad(pb::Adagrad {
                learning_rate,
                initial_accumulator,
                epsilon,
            }),
            Optimizer::Adam {
                learning_rate,
                beta1,
                beta2,
                epsilon,
            } => pb::optimizer::Kind::Adam(pb::Adam {
                learning_rate,
                beta1,
                beta2,
                epsilon,
            }),
            Optimizer::Ftrl {
                alpha,
                beta,
                l1,
                l2,
            } => pb::optimizer::Kind::Ftrl(pb::Ftrl {
                alpha,
                beta,
                l1,
                l2,
            }),
        };
        let init = match s.initializer.kind {
            InitializerKind::Zeros => pb::initializer::Kind::Zeros(pb::Zeros {}),
            InitializerKind::Uniform { low, high } => {
                pb::initializer::Kind::Uniform(pb::Uniform { low, high })
            }
            InitializerKind::Normal { mean, stddev } => {
                pb::initializer::Kind::Normal(pb::Normal { mean, stddev })
            }
        };
        pb::TableSpec {
            name: s.name.as_str().to_owned(),
            kind: Some(kind),
            optimizer: Some(pb::Optimizer {
                kind: Some(optimizer),
            }),
            initializer: Some(pb::Initializer {
                kind: Some(init),
                seed: s.initializer.seed,
            }),
            non_finite: match s.non_finite {
                NonFinitePolicy::Reject => pb::NonFinitePolicy::Reject,
                NonFinitePolicy::Skip => pb::NonFinitePolicy::Skip,
            } as i32,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_round_trip_preserves_the_spec() {
        let spec = TableSpec::sparse("emb/user", 16)
            .unwrap()
            .with_optimizer(Optimizer::ftrl(0.1, 1.0, 0.01, 0.001))
            .unwrap()
            .with_initializer(Initializer::normal(0.0, 0.01, 7))
            .unwrap()
            .with_non_finite(NonFinitePolicy::Skip);
        let back = TableSpec::try_from(pb::TableSpec::from(&spec)).unwrap();
        assert_eq!(back, spec);
        let json = serde_json::to_string(&spec).unwrap();
        assert_eq!(serde_json::from_str::<TableSpec>(&json).unwrap(), spec);
    }

    #[test]
    fn bad_specs_name_the_field() {
        let e = TableSpec::dense("w", &[3, 0]).unwrap_err();
        assert_eq!(e.field, "dense.shape");
        let e = TableSpec::sparse("e", 0).unwrap_err();
        assert_eq!(e.field, "sparse.dim");
        let e = TableSpec::dense("w", &[4])
            .unwrap()
            .with_optimizer(Optimizer::ftrl(0.1, 1.0, 0.0, 0.0));
        assert_eq!(e.unwrap_err().field, "optimizer");
        let e = TableSpec::dense("w", &[4])
            .unwrap()
            .with_optimizer(Optimizer::sgd(-1.0));
        assert_eq!(e.unwrap_err().field, "optimizer.sgd.learning_rate");
        let e = TableSpec::dense("bad name", &[4]).unwrap_err();
        assert_eq!(e.field, "name");
        let e = TableSpec::dense("w", &[1 << 30, 1 << 30]).unwrap_err();
        assert!(e.reason.contains("more than"), "{e}");
    }

    #[test]
    fn missing_oneofs_are_refused() {
        let e = TableSpec::try_from(pb::TableSpec {
            name: "t".into(),
            ..Default::default()
        })
        .unwrap_err();
        assert_eq!(e.field, "kind");
    }

    #[test]
    fn chunk_geometry() {
        let d = DenseShape {
            shape: vec![10],
            chunk_elems: 4,
        };
        assert_eq!(d.num_chunks(), 3);
        assert_eq!(d.chunk_range(2), Some(8..10));
        assert_eq!(d.chunk_len(1), Some(4));
        assert_eq!(d.chunk_range(3), None);
        assert_eq!(d.chunk_range(u64::MAX), None);
    }
}
