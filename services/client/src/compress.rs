//! Per-table compression state of a client: the codec a table's pushes use, the encoding its
//! pulls ask for, and the sender-side error feedback that lossy codecs need.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use ps_codec::{Codec, CompressOptions, Encoder, ErrorFeedback, PullCodec, RowErrorFeedback};
use ps_core::{Encoding, TableName};

use crate::admin::table_name;
use crate::held::HeldRows;
use crate::{ClientError, PsClient};

/// How one table's values travel.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TableCodec {
    /// Gradients pushed: the codec, the size below which values go as f32, lz4.
    pub push: CompressOptions,
    /// Values pulled: f32, fp16 or bf16, or dense pulls as the top `ratio` of each chunk's
    /// change since this client's last pull (the shard keeps a replica per client; the rest of
    /// the change comes in later pulls).
    pub pull: PullCodec,
}

impl Default for TableCodec {
    fn default() -> Self {
        Self {
            push: CompressOptions::default(),
            pull: PullCodec::F32,
        }
    }
}

impl TableCodec {
    /// Bytes a pulled value takes on the wire, for sizing pull requests.
    pub(crate) fn pull_bytes_per_value(&self) -> f64 {
        if self.pull.encoding() == Encoding::F32 {
            4.0
        } else {
            2.0
        }
    }

    pub(crate) fn check(&self) -> Result<(), ClientError> {
        self.push
            .codec
            .validate()
            .map_err(|e| ClientError::InvalidInput(e.to_string()))?;
        self.pull
            .validate()
            .map_err(|e| ClientError::InvalidInput(e.to_string()))
    }
}

/// What a client keeps per table to compress its pushes.
#[derive(Debug)]
pub(crate) struct Sender {
    pub enc: Encoder,
    /// Residual of a dense tensor (its full length once used).
    pub dense: ErrorFeedback,
    /// Residuals of embedding rows.
    pub rows: Option<RowErrorFeedback>,
}

impl Sender {
    /// Whether this table keeps a residual: a lossy codec with error feedback on.
    pub fn lossy(&self) -> bool {
        self.enc.options().keeps_residual()
    }
}

/// This client's copy of a dense table as delta pulls built it, with the shard's replica
/// version of each chunk. Locked for a whole delta pull, so that answers apply in order.
#[derive(Debug, Default)]
pub(crate) struct DeltaReplica {
    pub values: Vec<f32>,
    pub versions: HashMap<u64, u64>,
}

/// What the client keeps for one table.
#[derive(Debug, Clone)]
pub(crate) struct TableState {
    pub codec: TableCodec,
    pub sender: Arc<Mutex<Sender>>,
    pub replica: Arc<tokio::sync::Mutex<DeltaReplica>>,
    /// A sparse table's rows as last pulled ([`crate::ClientConfig::held_rows_mib`]).
    pub held: Arc<Mutex<Option<HeldRows>>>,
}

/// A dense push whose values, as plain f32, would cross the client's link in less than this
/// goes as plain f32 whatever its table's codec: compressing it saves under this much a step,
/// while a lossy codec's error feedback delays what it holds back and costs clocks. On the
/// Adult wide & deep model at 1 Gbit/s (a 2,048-value layer, 0.07 ms of the link), top-k
/// pushes needed 110 clocks to 84.4% against f32's 94 (10 seeds each). Sparse pushes are
/// not held to it: a sparse codec that sends a few rows also saves their ids and the shard's
/// work on the rest (on the CTR-shaped set at 1 Gbit/s, a step's top-k pushes took 1.7-1.9
/// ms, and 3.0 with its 2,300-row wide table sent in f32 under the same floor).
pub const WORTH_COMPRESSING: Duration = Duration::from_micros(500);

/// The fewest values a dense push must hold to be compressed on a link of `mbps` megabits per
/// second ([`WORTH_COMPRESSING`]); 0 when the link is not known.
pub fn push_floor(mbps: Option<f64>) -> usize {
    mbps.map_or(0, |m| {
        let bytes = m * 1e6 / 8.0 * WORTH_COMPRESSING.as_secs_f64();
        (bytes / 4.0) as usize
    })
}

/// The codecs of every table this client has touched.
#[derive(Debug)]
pub(crate) struct Codecs {
    default: TableCodec,
    seed: u64,
    /// Dense pushes of fewer values go as f32 whatever the codec ([`push_floor`] of the
    /// client's link).
    floor: usize,
    tables: Mutex<HashMap<TableName, TableState>>,
}

impl Codecs {
    pub fn new(default: TableCodec, seed: u64, floor: usize) -> Self {
        Self {
            default,
            seed,
            floor,
            tables: Mutex::new(HashMap::new()),
        }
    }

    fn state(&self, name: &TableName, codec: TableCodec) -> TableState {
        // Each table draws from its own stream: the seed mixed with the table's name.
        let seed = self.seed ^ name.hash64();
        TableState {
            codec,
            sender: Arc::new(Mutex::new(Sender {
                enc: Encoder::new(codec.push, seed),
                dense: ErrorFeedback::default(),
                rows: None,
            })),
            replica: Arc::default(),
            held: Arc::default(),
        }
    }

    /// The fewest values a dense push must hold to be compressed ([`push_floor`] of the
    /// client's link; the codec's own `min_values` applies as well).
    pub fn dense_floor(&self) -> usize {
        self.floor
    }

    /// The table's codec and its state.
    pub fn state_of(&self, name: &TableName) -> TableState {
        let mut tables = self.tables.lock();
        if let Some(t) = tables.get(name) {
            return t.clone();
        }
        let t = self.state(name, self.default);
        tables.insert(name.clone(), t.clone());
        t
    }

    /// The table's codec and its sender state.
    pub fn get(&self, name: &TableName) -> (TableCodec, Arc<Mutex<Sender>>) {
        let t = self.state_of(name);
        (t.codec, t.sender)
    }

    /// Sets a table's codec; what its residual and replica held before are dropped.
    pub fn set(&self, name: TableName, codec: TableCodec) {
        let t = self.state(&name, codec);
        self.tables.lock().insert(name, t);
    }

    /// Sets the ratio of a top-k or random-k table's pushes from the next push on, keeping
    /// the residual (a sparsity warm-up moves the ratio while training).
    pub fn set_ratio(&self, name: &TableName, ratio: f64) -> Result<(), ClientError> {
        let (sender, codec) = {
            let mut tables = self.tables.lock();
            let t = tables
                .entry(name.clone())
                .or_insert_with(|| self.state(name, self.default));
            let codec = match t.codec.push.codec {
                Codec::TopK { values, .. } => Codec::TopK { ratio, values },
                Codec::RandomK { values, .. } => Codec::RandomK { ratio, values },
                other => {
                    return Err(ClientError::InvalidInput(format!(
                        "table {name} pushes with {other}, which has no ratio to set"
                    )));
                }
            };
            codec
                .validate()
                .map_err(|e| ClientError::InvalidInput(e.to_string()))?;
            t.codec.push.codec = codec;
            (t.sender.clone(), codec)
        };
        // Like a push, lock the sender once the table map is let go.
        sender.lock().enc.set_codec(codec);
        Ok(())
    }

    /// Forgets a table (it was dropped).
    pub fn forget(&self, name: &TableName) {
        self.tables.lock().remove(name);
    }
}

impl PsClient {
    /// Sets how table `name` travels from now on: the codec of its pushes (with error feedback
    /// kept by this client when the codec is lossy) and the encoding of its pulls. A residual
    /// kept under the previous codec is dropped.
    pub fn set_table_codec(&self, name: &str, codec: TableCodec) -> Result<(), ClientError> {
        codec.check()?;
        self.inner.codecs.set(table_name(name)?, codec);
        Ok(())
    }

    /// Sets the ratio of table `name`'s top-k or random-k pushes from the next push on,
    /// keeping what its residual owes: for a sparsity warm-up, which sends a larger share in
    /// the first epochs. Any other codec is an `InvalidInput` error, as is a ratio outside
    /// (0, 1].
    pub fn set_push_ratio(&self, name: &str, ratio: f64) -> Result<(), ClientError> {
        self.inner.codecs.set_ratio(&table_name(name)?, ratio)
    }

    /// How table `name` travels.
    pub fn table_codec(&self, name: &str) -> Result<TableCodec, ClientError> {
        Ok(self.inner.codecs.get(&table_name(name)?).0)
    }

    /// What this client still owes dense table `name`: the part of its gradients that a lossy
    /// codec has not sent yet (error feedback adds it to the next push). Empty before the first
    /// lossy push.
    pub fn dense_residual(&self, name: &str) -> Result<Vec<f32>, ClientError> {
        let (_, sender) = self.inner.codecs.get(&table_name(name)?);
        Ok(sender.lock().dense.residual().to_vec())
    }

    /// What this client still owes row `id` of sparse table `name`, if anything.
    pub fn row_residual(&self, name: &str, id: u64) -> Result<Option<Vec<f32>>, ClientError> {
        let (_, sender) = self.inner.codecs.get(&table_name(name)?);
        let guard = sender.lock();
        Ok(guard
            .rows
            .as_ref()
            .and_then(|r| r.residual(id))
            .map(<[f32]>::to_vec))
    }

    /// Of sparse table `name`'s row residuals: how many rows hold one now, and how many gave
    /// theirs up to make room ([`crate::ClientConfig::row_residual_mib`]) over the client's life.
    pub fn row_residuals(&self, name: &str) -> Result<(usize, u64), ClientError> {
        let (_, sender) = self.inner.codecs.get(&table_name(name)?);
        let guard = sender.lock();
        Ok(guard
            .rows
            .as_ref()
            .map_or((0, 0), |r| (r.len(), r.evicted())))
    }
}
