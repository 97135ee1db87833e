//! Job specs: what a training job runs (tables, consistency model, shards, workers, data,
//! checkpoints), validated once, from the wire (`TryFrom<pb::JobSpec>`) or from a TOML file
//! ([`JobSpec::from_toml`]).

use std::fmt;

use ps_codec::{Codec, PullCodec};
use ps_proto::v1 as pb;
use serde::{Deserialize, Serialize};

use crate::ValidationError;
use crate::table::{Initializer, NonFinitePolicy, Optimizer, TableKind, TableSpec};

/// How far apart the workers' clocks may drift. BSP and ASP are SSP with a bound of 0 and of
/// infinity: [`Consistency::bound`] is the one number the policy uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Consistency {
    Bsp,
    Ssp(u64),
    Asp,
}

impl Consistency {
    /// The staleness bound s: a worker may start clock c once every live worker has finished
    /// clock c - s - 1 (has finished at least c - s clocks). `None` is unbounded.
    pub fn bound(self) -> Option<u64> {
        match self {
            Self::Bsp => Some(0),
            Self::Ssp(s) => Some(s),
            Self::Asp => None,
        }
    }
}

impl fmt::Display for Consistency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Bsp => f.write_str("BSP"),
            Self::Ssp(s) => write!(f, "SSP({s})"),
            Self::Asp => f.write_str("ASP"),
        }
    }
}

/// A table of a job, the codec its gradients travel in and how its pulls come back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobTable {
    pub spec: TableSpec,
    pub codec: Codec,
    /// (Absent from state files written before it: f32.)
    #[serde(default)]
    pub pull: PullCodec,
}

impl JobTable {
    /// A table whose pushes and pulls travel as f32.
    pub fn plain(spec: TableSpec) -> Self {
        Self {
            spec,
            codec: Codec::default(),
            pull: PullCodec::default(),
        }
    }
}

/// A validated job spec. The name is the job's id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobSpec {
    pub name: String,
    pub tables: Vec<JobTable>,
    pub consistency: Consistency,
    pub num_shards: u32,
    pub num_workers: u32,
    /// Parts the data set is cut into (at least 1).
    pub data_shards: u32,
    pub dataset: String,
    pub model: String,
    /// Clocks between coordinated checkpoints; 0 = on demand only.
    pub checkpoint_every: u64,
    /// The newest complete checkpoints kept (older ones are deleted); 0 = all. (Absent from
    /// state files written before it: keep all.)
    #[serde(default)]
    pub keep_checkpoints: u32,
    /// Examples per clock over all workers; 0 = the workers decide.
    pub global_batch: u64,
    pub balance_batches: bool,
    /// Clocks after which the job has succeeded; 0 = no end.
    pub max_clocks: u64,
    /// Lease of members, in ms; 0 = the scheduler's default.
    pub lease_ms: u64,
    /// Seed of the workers' data cut and order.
    pub seed: u64,
}

/// Upper bounds that keep one spec from asking the scheduler for unbounded memory.
pub const MAX_WORKERS: u32 = 100_000;
pub const MAX_SHARDS: u32 = 4096;
pub const MAX_JOB_TABLES: usize = 1024;

fn check_job_name(name: &str) -> Result<(), ValidationError> {
    if name.is_empty()
        || name.len() > 64
        || name.starts_with('.')
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
    {
        return Err(ValidationError::new(
            "name",
            format!(
                "job name `{name}` must be 1 to 64 characters of [A-Za-z0-9_.-], not starting with `.`"
            ),
        ));
    }
    Ok(())
}

impl JobSpec {
    /// Checks what every stored spec holds, filling `data_shards` when it is 0.
    pub fn validated(mut self) -> Result<Self, ValidationError> {
        check_job_name(&self.name)?;
        if self.num_shards == 0 || self.num_shards > MAX_SHARDS {
            return Err(ValidationError::new(
                "num_shards",
                format!("must be in 1..={MAX_SHARDS}, got {}", self.num_shards),
            ));
        }
        if self.num_workers == 0 || self.num_workers > MAX_WORKERS {
            return Err(ValidationError::new(
                "num_workers",
                format!("must be in 1..={MAX_WORKERS}, got {}", self.num_workers),
            ));
        }
        if self.data_shards == 0 {
            self.data_shards = self.num_workers;
        }
        if self.data_shards > MAX_WORKERS {
            return Err(ValidationError::new(
                "data_shards",
                format!("must be at most {MAX_WORKERS}, got {}", self.data_shards),
            ));
        }
        if self.tables.len() > MAX_JOB_TABLES {
            return Err(ValidationError::new(
                "tables",
                format!("at most {MAX_JOB_TABLES} tables, got {}", self.tables.len()),
            ));
        }
        for (i, t) in self.tables.iter().enumerate() {
            if self.tables[..i].iter().any(|o| o.spec.name == t.spec.name) {
                return Err(ValidationError::new(
                    format!("tables[{i}].spec.name"),
                    format!("table `{}` is listed twice", t.spec.name),
                ));
            }
            check_pull(&t.spec, t.pull).map_err(|e| e.within(&format!("tables[{i}]")))?;
        }
        // The model and the dataset are the workers' to interpret; the scheduler only keeps
        // them, so they are bounded and printable.
        for (field, v) in [("model", &self.model), ("dataset", &self.dataset)] {
            if v.len() > 256 || v.chars().any(char::is_control) {
                return Err(ValidationError::new(
                    field,
                    format!(
                        "must be at most 256 bytes with no control characters, got {} bytes",
                        v.len()
                    ),
                ));
            }
        }
        if self.balance_batches && self.global_batch == 0 {
            return Err(ValidationError::new(
                "balance_batches",
                "needs a global_batch to divide between the workers",
            ));
        }
        if self.global_batch != 0 && self.global_batch < u64::from(self.num_workers) {
            return Err(ValidationError::new(
                "global_batch",
                format!(
                    "{} examples cannot give each of {} workers at least one",
                    self.global_batch, self.num_workers
                ),
            ));
        }
        if self.lease_ms != 0 && !(100..=3_600_000).contains(&self.lease_ms) {
            return Err(ValidationError::new(
                "lease_ms",
                format!(
                    "must be 0 (default) or in 100..=3600000, got {}",
                    self.lease_ms
                ),
            ));
        }
        Ok(self)
    }

    /// Parses and validates the TOML form (see `examples/jobs/` and the README).
    pub fn from_toml(text: &str) -> Result<Self, ValidationError> {
        Self::from_toml_for_model(text, |_| Ok(Vec::new()))
    }

    /// Parses the TOML form, adding the tables the job's model needs (`model_tables(spec)`, each
    /// with its initializer and default optimizer) that `tables` does not list. A
    /// `[model_tables]` section sets what those tables share: its optimizer settings (when it
    /// names any) replace the model's defaults; its codec and non-finite policy apply.
    ///
    /// A job that names a model trains exactly the model's tables: a listed table the model
    /// does not train, or one of another kind or shape than the model's, is refused with the
    /// model's tables in the message (a table nobody pushes would silently never train).
    pub fn from_toml_for_model(
        text: &str,
        model_tables: impl FnOnce(&JobSpec) -> Result<Vec<TableSpec>, ValidationError>,
    ) -> Result<Self, ValidationError> {
        let mut t: JobToml =
            toml::from_str(text).map_err(|e| ValidationError::new("toml", e.to_string()))?;
        let shared = t.model_tables.take();
        let mut spec = t.into_spec()?;
        let wanted = model_tables(&spec)?;
        if !spec.model.is_empty() {
            check_model_tables(&spec, &wanted)?;
        }
        for table in wanted {
            if spec.table(table.name.as_str()).is_some() {
                continue;
            }
            let table = match &shared {
                None => JobTable::plain(table),
                Some(s) => {
                    let spec = if s.sets_optimizer() {
                        table.with_optimizer(s.optimizer()?)?
                    } else {
                        table
                    };
                    s.finish(spec, true)?
                }
            };
            spec.tables.push(table);
        }
        spec.validated()
    }

    pub fn table(&self, name: &str) -> Option<&JobTable> {
        self.tables.iter().find(|t| t.spec.name.as_str() == name)
    }
}

/// A table's kind and shape in words: `dense [784, 10]`, `sparse dim 8`.
fn kind_text(kind: &TableKind) -> String {
    match kind {
        TableKind::Dense(d) => format!("dense {:?}", d.shape),
        TableKind::Sparse { dim } => format!("sparse dim {dim}"),
    }
}

/// Checks that every table `spec` lists is one of `model`'s, of the same kind and shape.
fn check_model_tables(spec: &JobSpec, model: &[TableSpec]) -> Result<(), ValidationError> {
    let trained = || {
        model
            .iter()
            .map(|t| format!("`{}` ({})", t.name, kind_text(&t.kind)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    for (i, listed) in spec.tables.iter().enumerate() {
        let field = format!("tables[{i}]");
        let Some(m) = model.iter().find(|m| m.name == listed.spec.name) else {
            return Err(ValidationError::new(
                field,
                format!(
                    "table `{}` is not one model `{}` trains, so nothing would ever push it; the \
                     model trains {}: list those (by these names) or set what they share in \
                     [model_tables]",
                    listed.spec.name,
                    spec.model,
                    trained()
                ),
            ));
        };
        let same = match (&listed.spec.kind, &m.kind) {
            (TableKind::Dense(a), TableKind::Dense(b)) => a.shape == b.shape,
            (TableKind::Sparse { dim: a }, TableKind::Sparse { dim: b }) => a == b,
            _ => false,
        };
        if !same {
            return Err(ValidationError::new(
                field,
                format!(
                    "table `{}` is declared {}, but model `{}` trains it as {}",
                    listed.spec.name,
                    kind_text(&listed.spec.kind),
                    spec.model,
                    kind_text(&m.kind)
                ),
            ));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Wire conversions

impl TryFrom<pb::JobSpec> for JobSpec {
    type Error = ValidationError;

    fn try_from(p: pb::JobSpec) -> Result<Self, Self::Error> {
        let consistency = match pb::ConsistencyModel::try_from(p.consistency) {
            Ok(pb::ConsistencyModel::Bsp) => Consistency::Bsp,
            Ok(pb::ConsistencyModel::Asp) => Consistency::Asp,
            Ok(pb::ConsistencyModel::Ssp) => {
                let s = u64::try_from(p.staleness).map_err(|_| {
                    ValidationError::new(
                        "staleness",
                        format!("the SSP bound must be >= 0, got {}", p.staleness),
                    )
                })?;
                Consistency::Ssp(s)
            }
            _ => {
                return Err(ValidationError::new(
                    "consistency",
                    format!(
                        "{} is not a consistency model; use BSP, SSP or ASP",
                        p.consistency
                    ),
                ));
            }
        };
        if !matches!(consistency, Consistency::Ssp(_)) && p.staleness != 0 {
            return Err(ValidationError::new(
                "staleness",
                format!(
                    "is for SSP only; {consistency} has none (got {})",
                    p.staleness
                ),
            ));
        }
        let tables = p
            .tables
            .into_iter()
            .enumerate()
            .map(|(i, t)| {
                let at = format!("tables[{i}]");
                let spec = t
                    .spec
                    .ok_or_else(|| ValidationError::new(format!("{at}.spec"), "missing"))
                    .and_then(|s| TableSpec::try_from(s).map_err(|e| e.within(&at)))?;
                let codec = parse_codec(&t.codec).map_err(|e| e.within(&at))?;
                let pull = parse_pull_codec(&t.pull_codec).map_err(|e| e.within(&at))?;
                Ok(JobTable { spec, codec, pull })
            })
            .collect::<Result<_, ValidationError>>()?;
        JobSpec {
            name: p.name,
            tables,
            consistency,
            num_shards: p.num_shards,
            num_workers: p.num_workers,
            data_shards: p.data_shards,
            dataset: p.dataset,
            model: p.model,
            checkpoint_every: p.checkpoint_every,
            keep_checkpoints: p.keep_checkpoints,
            global_batch: p.global_batch,
            balance_batches: p.balance_batches,
            max_clocks: p.max_clocks,
            lease_ms: p.lease_ms,
            seed: p.seed,
        }
        .validated()
    }
}

fn parse_pull_codec(text: &str) -> Result<PullCodec, ValidationError> {
    if text.is_empty() {
        return Ok(PullCodec::F32);
    }
    text.parse::<PullCodec>()
        .map_err(|e| ValidationError::new("pull_codec", format!("`{text}`: {e}")))
}

/// Delta pulls are of dense tables: a sparse table's rows have no chunk to diff.
fn check_pull(spec: &TableSpec, pull: PullCodec) -> Result<(), ValidationError> {
    if pull.delta_ratio().is_some() && spec.dense_shape().is_none() {
        return Err(ValidationError::new(
            "pull_codec",
            format!(
                "`{pull}` is for dense tables; sparse table `{}` pulls in f32, fp16, bf16, int8 or \
                 int4",
                spec.name
            ),
        ));
    }
    Ok(())
}

fn parse_codec(text: &str) -> Result<Codec, ValidationError> {
    if text.is_empty() {
        return Ok(Codec::F32);
    }
    text.parse::<Codec>()
        .map_err(|e| ValidationError::new("codec", format!("`{text}`: {e}")))
}

impl From<&JobSpec> for pb::JobSpec {
    fn from(s: &JobSpec) -> Self {
        let (consistency, staleness) = match s.consistency {
            Consistency::Bsp => (pb::ConsistencyModel::Bsp, 0),
            Consistency::Ssp(b) => (
                pb::ConsistencyModel::Ssp,
                i64::try_from(b).unwrap_or(i64::MAX),
            ),
            Consistency::Asp => (pb::ConsistencyModel::Asp, 0),
        };
        pb::JobSpec {
            name: s.name.clone(),
            tables: s
                .tables
                .iter()
                .map(|t| pb::JobTable {
                    spec: Some((&t.spec).into()),
                    codec: t.codec.to_string(),
                    pull_codec: t.pull.to_string(),
                })
                .collect(),
            consistency: consistency as i32,
            staleness,
            num_shards: s.num_shards,
            num_workers: s.num_workers,
            data_shards: s.data_shards,
            dataset: s.dataset.clone(),
            model: s.model.clone(),
            checkpoint_every: s.checkpoint_every,
            keep_checkpoints: s.keep_checkpoints,
            global_batch: s.global_batch,
            balance_batches: s.balance_batches,
            max_clocks: s.max_clocks,
            lease_ms: s.lease_ms,
            seed: s.seed,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The TOML form

/// A job file: flat keys a user can write by hand.
///
/// ```toml
/// name = "fmnist"
/// consistency = "ssp"      # bsp | ssp | asp
/// staleness = 2
/// num_shards = 2
/// num_workers = 2
/// dataset = "fashion-mnist"
/// model = "softmax"
/// checkpoint_every = 100
/// keep_checkpoints = 3     # the newest three; older ones are deleted (0: keep all)
/// global_batch = 256
/// balance_batches = true
///
/// [[tables]]
/// name = "softmax/w"
/// shape = [785, 10]        # dense; `dim = 16` makes a sparse table (`admit_after = 3`:
///                          # an id's row is stored from its third push; `ttl_seconds`,
///                          # `max_rows`: rows evicted by age or past a cap)
/// optimizer = "momentum"   # sgd | momentum | adagrad | adam | ftrl
/// learning_rate = 0.1
/// momentum = 0.9
/// codec = "fp16"
/// pull_codec = "fp16"     # f32 | fp16 | bf16 | int8 | delta-topk:0.1 (dense tables)
///
/// [model_tables]           # what the model's tables not listed above share
/// optimizer = "adagrad"
/// pull_codec = "delta-topk:0.02"
/// row_pull_codec = "int8"  # the sparse tables' (default: pull_codec, fp16 under delta-topk)
/// ```
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JobToml {
    name: String,
    #[serde(default)]
    tables: Vec<TableToml>,
    consistency: String,
    #[serde(default)]
    staleness: i64,
    num_shards: u32,
    num_workers: u32,
    #[serde(default)]
    data_shards: u32,
    #[serde(default)]
    dataset: String,
    #[serde(default)]
    model: String,
    #[serde(default)]
    checkpoint_every: u64,
    #[serde(default)]
    keep_checkpoints: u32,
    #[serde(default)]
    global_batch: u64,
    #[serde(default)]
    balance_batches: bool,
    #[serde(default)]
    max_clocks: u64,
    #[serde(default)]
    lease_ms: u64,
    #[serde(default)]
    seed: u64,
    /// Settings (optimizer, learning rate, codec, ...) for the tables the model names that
    /// `tables` does not list; see [`JobSpec::from_toml_for_model`].
    model_tables: Option<TableToml>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TableToml {
    #[serde(default)]
    name: String,
    shape: Option<Vec<u64>>,
    dim: Option<u32>,
    chunk_elems: Option<u64>,
    /// sgd (the default) | momentum | adagrad | adam | ftrl
    optimizer: Option<String>,
    learning_rate: Option<f32>,
    momentum: Option<f32>,
    #[serde(default)]
    nesterov: bool,
    beta1: Option<f32>,
    beta2: Option<f32>,
    epsilon: Option<f32>,
    initial_accumulator: Option<f32>,
    alpha: Option<f32>,
    beta: Option<f32>,
    l1: Option<f32>,
    l2: Option<f32>,
    /// zeros | uniform | normal
    init: Option<String>,
    init_low: Option<f32>,
    init_high: Option<f32>,
    init_mean: Option<f32>,
    init_stddev: Option<f32>,
    #[serde(default)]
    seed: u64,
    /// reject | skip
    non_finite: Option<String>,
    /// Sparse tables: store an id's row once it was pushed this many times.
    #[serde(default)]
    admit_after: u32,
    /// Sparse tables on durable shards: evict a row not pushed for this many seconds.
    #[serde(default)]
    ttl_seconds: u64,
    /// Sparse tables on durable shards: evict a row not pushed for this many job clocks.
    #[serde(default)]
    ttl_clocks: u64,
    /// Sparse tables on durable shards: the most rows the table holds.
    #[serde(default)]
    max_rows: u64,
    #[serde(default)]
    codec: String,
    /// f32 (the default) | fp16 | bf16 | int8 | int4 | delta-topk:RATIO (dense tables only)
    #[serde(default)]
    pull_codec: String,
    /// In `[model_tables]` only: the sparse tables' pull codec, where it should differ from
    /// `pull_codec` (which the dense tables take).
    #[serde(default)]
    row_pull_codec: String,
}

impl TableToml {
    fn into_spec(self) -> Result<JobTable, ValidationError> {
        let mut spec = match (&self.shape, self.dim) {
            (Some(shape), None) => TableSpec::dense(&self.name, shape)?,
            (None, Some(dim)) => TableSpec::sparse(&self.name, dim)?,
            _ => {
                return Err(ValidationError::new(
                    "shape",
                    format!(
                        "table `{}` needs either `shape` (dense) or `dim` (sparse)",
                        self.name
                    ),
                ));
            }
        };
        if let Some(c) = self.chunk_elems {
            spec = spec.with_chunk_elems(c)?;
        }
        spec = spec.with_optimizer(self.optimizer()?)?;
        self.finish(spec, false)
    }

    /// Whether the file sets the optimizer at all.
    fn sets_optimizer(&self) -> bool {
        self.optimizer.is_some() || self.learning_rate.is_some()
    }

    fn optimizer(&self) -> Result<Optimizer, ValidationError> {
        let lr = self.learning_rate.unwrap_or(0.01);
        let optimizer = match self.optimizer.as_deref().unwrap_or("sgd") {
            "sgd" => Optimizer::sgd(lr),
            "momentum" => Optimizer::Momentum {
                learning_rate: lr,
                momentum: self.momentum.unwrap_or(0.9),
                nesterov: self.nesterov,
            },
            "adagrad" => {
                let mut o = Optimizer::adagrad(lr);
                if let Optimizer::Adagrad {
                    initial_accumulator,
                    epsilon,
                    ..
                } = &mut o
                {
                    *initial_accumulator = self.initial_accumulator.unwrap_or(*initial_accumulator);
                    *epsilon = self.epsilon.unwrap_or(*epsilon);
                }
                o
            }
            "adam" => {
                let mut o = Optimizer::adam(lr);
                if let Optimizer::Adam {
                    beta1,
                    beta2,
                    epsilon,
                    ..
                } = &mut o
                {
                    *beta1 = self.beta1.unwrap_or(*beta1);
                    *beta2 = self.beta2.unwrap_or(*beta2);
                    *epsilon = self.epsilon.unwrap_or(*epsilon);
                }
                o
            }
            "ftrl" => Optimizer::ftrl(
                self.alpha.unwrap_or(0.05),
                self.beta.unwrap_or(1.0),
                self.l1.unwrap_or(0.0),
                self.l2.unwrap_or(0.0),
            ),
            other => {
                return Err(ValidationError::new(
                    "optimizer",
                    format!(
                        "unknown optimizer `{other}` for table `{}`; use sgd, momentum, adagrad, adam or ftrl",
                        self.name
                    ),
                ));
            }
        };
        Ok(optimizer)
    }

    /// Applies the initializer (when the file names one; the spec keeps its own otherwise),
    /// the non-finite policy and the codecs to `spec`. Settings `shared` by every model table
    /// give delta pulls to the dense ones only; sparse tables keep f32 pulls.
    fn finish(&self, mut spec: TableSpec, shared: bool) -> Result<JobTable, ValidationError> {
        let init = match self.init.as_deref() {
            None => spec.initializer,
            Some("zeros") => Initializer::ZEROS,
            Some("uniform") => Initializer::uniform(
                self.init_low.unwrap_or(-0.05),
                self.init_high.unwrap_or(0.05),
                self.seed,
            ),
            Some("normal") => Initializer::normal(
                self.init_mean.unwrap_or(0.0),
                self.init_stddev.unwrap_or(0.01),
                self.seed,
            ),
            Some(other) => {
                return Err(ValidationError::new(
                    "init",
                    format!("unknown initializer `{other}`; use zeros, uniform or normal"),
                ));
            }
        };
        spec = spec.with_initializer(init)?;
        spec = match self.non_finite.as_deref() {
            None | Some("reject") => spec,
            Some("skip") => spec.with_non_finite(NonFinitePolicy::Skip),
            Some(other) => {
                return Err(ValidationError::new(
                    "non_finite",
                    format!("`{other}`: use reject or skip"),
                ));
            }
        };
        if self.admit_after > 0 {
            spec = spec.with_admit_after(self.admit_after)?;
        }
        if self.ttl_seconds > 0 {
            spec = spec.with_ttl_seconds(self.ttl_seconds)?;
        }
        if self.ttl_clocks > 0 {
            spec = spec.with_ttl_clocks(self.ttl_clocks)?;
        }
        if self.max_rows > 0 {
            spec = spec.with_max_rows(self.max_rows)?;
        }
        let codec = parse_codec(&self.codec)?;
        let mut pull = parse_pull_codec(&self.pull_codec)?;
        let row_pull = match self.row_pull_codec.as_str() {
            "" => None,
            text if shared => Some(
                parse_pull_codec(text)
                    .map_err(|e| ValidationError::new("row_pull_codec", e.reason))?,
            ),
            _ => {
                return Err(ValidationError::new(
                    "row_pull_codec",
                    format!(
                        "table `{}`: row_pull_codec belongs in [model_tables]; a listed table \
                         sets its own pull_codec",
                        self.name
                    ),
                ));
            }
        };
        if shared && spec.dense_shape().is_none() {
            pull = row_pull.unwrap_or_else(|| pull.for_rows());
        }
        check_pull(&spec, pull)?;
        Ok(JobTable {
            spec: spec.validated()?,
            codec,
            pull,
        })
    }
}

impl JobToml {
    fn into_spec(self) -> Result<JobSpec, ValidationError> {
        let consistency = match self.consistency.to_ascii_lowercase().as_str() {
            "bsp" => Consistency::Bsp,
            "asp" => Consistency::Asp,
            "ssp" => Consistency::Ssp(u64::try_from(self.staleness).map_err(|_| {
                ValidationError::new(
                    "staleness",
                    format!("the SSP bound must be >= 0, got {}", self.staleness),
                )
            })?),
            other => {
                return Err(ValidationError::new(
                    "consistency",
                    format!("`{other}` is not a consistency model; use bsp, ssp or asp"),
                ));
            }
        };
        let tables = self
            .tables
            .into_iter()
            .enumerate()
            .map(|(i, t)| t.into_spec().map_err(|e| e.within(&format!("tables[{i}]"))))
            .collect::<Result<_, _>>()?;
        JobSpec {
            name: self.name,
            tables,
            consistency,
            num_shards: self.num_shards,
            num_workers: self.num_workers,
            data_shards: self.data_shards,
            dataset: self.dataset,
            model: self.model,
            checkpoint_every: self.checkpoint_every,
            keep_checkpoints: self.keep_checkpoints,
            global_batch: self.global_batch,
            balance_batches: self.balance_batches,
            max_clocks: self.max_clocks,
            lease_ms: self.lease_ms,
            seed: self.seed,
        }
        .validated()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const JOB: &str = r#"
name = "fmnist"
consistency = "ssp"
staleness = 2
num_shards = 2
num_workers = 3
global_batch = 300
balance_batches = true

[[tables]]
name = "w"
shape = [785, 10]
optimizer = "momentum"
learning_rate = 0.1
codec = "fp16"
pull_codec = "delta-topk:0.1"

[[tables]]
name = "emb"
dim = 8
optimizer = "adagrad"
init = "normal"
seed = 7
admit_after = 4
ttl_seconds = 86400
max_rows = 1000000
"#;

    #[test]
    fn toml_and_wire_forms_agree() {
        let spec = JobSpec::from_toml(JOB).unwrap();
        assert_eq!(spec.consistency, Consistency::Ssp(2));
        assert_eq!(spec.data_shards, 3, "defaults to num_workers");
        assert_eq!(spec.tables[0].codec, Codec::F16);
        assert_eq!(spec.tables[0].pull, PullCodec::DeltaTopK { ratio: 0.1 });
        assert_eq!(spec.tables[1].pull, PullCodec::F32);
        assert_eq!(spec.tables[1].spec.admit_after, 4);
        assert_eq!(spec.tables[1].spec.ttl_seconds, 86_400);
        assert_eq!(spec.tables[1].spec.max_rows, 1_000_000);
        let back = JobSpec::try_from(pb::JobSpec::from(&spec)).unwrap();
        assert_eq!(back, spec);
    }

    #[test]
    fn the_shipped_job_file_parses() {
        let spec =
            JobSpec::from_toml(include_str!("../../../scheduler/jobs/fashion-mnist.toml")).unwrap();
        assert_eq!(spec.consistency, Consistency::Ssp(2));
        assert!(spec.balance_batches);
    }

    #[test]
    fn bad_specs_say_what_is_wrong() {
        let cases = [
            (
                JOB.replace("\"momentum\"", "\"rmsprop\""),
                "unknown optimizer `rmsprop`",
            ),
            (
                JOB.replace("staleness = 2", "staleness = -1"),
                "must be >= 0",
            ),
            (
                JOB.replace("num_shards = 2", "num_shards = 0"),
                "num_shards",
            ),
            (
                JOB.replace("\"ssp\"", "\"lockstep\""),
                "not a consistency model",
            ),
            (JOB.replace("\"fp16\"", "\"fp12\""), "codec"),
            (
                JOB.replace("delta-topk:0.1", "delta-topk:2"),
                "must be in (0, 1]",
            ),
            (
                JOB.replace("max_rows = 1000000", "pull_codec = \"delta-topk:0.1\""),
                "is for dense tables",
            ),
            (
                JOB.replace("codec = \"fp16\"", "admit_after = 2"),
                "admission is for sparse tables",
            ),
            (
                JOB.replace("codec = \"fp16\"", "max_rows = 5"),
                "eviction is for sparse tables",
            ),
            (
                JOB.replace("ttl_seconds = 86400", "ttl_seconds = 999999999999"),
                "ten years",
            ),
            (
                JOB.replace("ttl_seconds = 86400", "ttl_seconds = 5\nttl_clocks = 5"),
                "not both",
            ),
            (
                JOB.replace("global_batch = 300", "global_batch = 2"),
                "at least one",
            ),
        ];
        for (text, want) in cases {
            let e = JobSpec::from_toml(&text).unwrap_err().to_string();
            assert!(e.contains(want), "{e} should mention {want}");
        }
        let mut wire = pb::JobSpec::from(&JobSpec::from_toml(JOB).unwrap());
        wire.staleness = -3;
        let e = JobSpec::try_from(wire).unwrap_err();
        assert_eq!(e.field, "staleness");
        // The wire form is checked as the file is.
        let mut wire = pb::JobSpec::from(&JobSpec::from_toml(JOB).unwrap());
        wire.tables[1].pull_codec = "delta-topk:0.5".into();
        let e = JobSpec::try_from(wire).unwrap_err();
        assert!(e.to_string().contains("is for dense tables"), "{e}");
    }

    /// Pull codecs shared by every model table: delta pulls go to the dense tables, and the
    /// sparse ones pull in fp16 (they have no chunks to diff).
    #[test]
    fn a_shared_delta_pull_codec_leaves_sparse_tables_in_fp16() {
        let text = r#"
name = "wd"
consistency = "bsp"
num_shards = 1
num_workers = 1
model = "wd"

[model_tables]
pull_codec = "delta-topk:0.25"
"#;
        let dense_and_sparse = |_: &JobSpec| -> Result<Vec<TableSpec>, ValidationError> {
            Ok(vec![
                TableSpec::dense("d", &[4, 4])?,
                TableSpec::sparse("s", 8)?,
            ])
        };
        let spec = JobSpec::from_toml_for_model(text, dense_and_sparse).unwrap();
        assert_eq!(spec.tables[0].pull, PullCodec::DeltaTopK { ratio: 0.25 });
        assert_eq!(spec.tables[1].pull, PullCodec::F16);
        let fp16 = JobSpec::from_toml_for_model(&text.replace("delta-topk:0.25", "fp16"), |_| {
            Ok(vec![TableSpec::sparse("s", 8)?])
        })
        .unwrap();
        assert_eq!(fp16.tables[0].pull, PullCodec::F16);
        // The rows' own codec beside the dense tables' delta pulls.
        let rows = text.replace(
            "pull_codec = \"delta-topk:0.25\"",
            "pull_codec = \"delta-topk:0.25\"\nrow_pull_codec = \"int8\"",
        );
        let spec = JobSpec::from_toml_for_model(&rows, dense_and_sparse).unwrap();
        assert_eq!(spec.tables[0].pull, PullCodec::DeltaTopK { ratio: 0.25 });
        assert_eq!(spec.tables[1].pull, PullCodec::Int8);
        for (bad, says) in [
            ("row_pull_codec = \"delta-topk:0.1\"", "for dense tables"),
            ("row_pull_codec = \"sign\"", "not a pull codec"),
        ] {
            let e = JobSpec::from_toml_for_model(
                &text.replace("pull_codec = \"delta-topk:0.25\"", bad),
                |_| Ok(vec![TableSpec::sparse("s", 8)?]),
            )
            .unwrap_err();
            assert!(e.to_string().contains(says), "{bad}: {e}");
        }
        // Refused where no table would take it too, and in a listed table.
        let e = JobSpec::from_toml_for_model(
            &text.replace(
                "pull_codec = \"delta-topk:0.25\"",
                "row_pull_codec = \"sign\"",
            ),
            |_| Ok(vec![TableSpec::dense("d", &[4, 4])?]),
        )
        .unwrap_err();
        assert!(e.to_string().contains("not a pull codec"), "{e}");
        let listed =
            format!("{text}\n[[tables]]\nname = \"s\"\ndim = 8\nrow_pull_codec = \"int8\"\n");
        let e = JobSpec::from_toml_for_model(&listed, |_| Ok(vec![TableSpec::sparse("s", 8)?]))
            .unwrap_err();
        assert!(e.to_string().contains("belongs in [model_tables]"), "{e}");
    }
}
