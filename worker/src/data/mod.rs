//! Data sets: loaders (IDX, CSV, LIBSVM), synthetic generators, deterministic sharding and
//! per-epoch shuffling, and a prefetching reader.
//!
//! A data set is named by a string (the job spec's `dataset`), parsed by [`DatasetSpec`]:
//!
//! | name | what |
//! | --- | --- |
//! | `fashion-mnist` | the four IDX files of Fashion-MNIST (Debian's `dataset-fashion-mnist`, or `--data DIR`) |
//! | `idx:DIR` | any IDX image/label set: `DIR/train-images*`, `train-labels*`, `t10k-*` or `test-*` |
//! | `adult` | the Adult census table (`adult.csv.gz`): categorical and bucketized numeric columns hashed to ids |
//! | `libsvm:TRAIN[,TEST]` | LIBSVM text files (sparse; the test file optional) |
//! | `synthetic-dense:N:DIM:CLASSES` | Gaussian clusters, generated per sample from the seed |
//! | `synthetic-ctr:N:IDS:FIELDS[:SEED]` | Zipf-distributed ids over `FIELDS` fields, labels from a planted logistic model; from `SEED` when given (the same set whatever the job's seed), else from the job's seed |

mod csv;
mod idx;
mod libsvm;
mod prefetch;
mod shard;
mod synth;

use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use csv::{TabularSchema, load_adult, load_csv};
pub use idx::{load_idx_dir, read_idx};
pub use libsvm::read_libsvm;
pub use prefetch::{PrefetchControl, Prefetcher};
pub use shard::{EpochOrder, ShardPlan};
pub use synth::{SyntheticCtr, SyntheticDense};

/// Where Debian's `dataset-fashion-mnist` package puts the files.
pub const FASHION_MNIST_DIR: &str = "/usr/share/datasets/fashion-mnist";

#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {detail}")]
    Format { path: PathBuf, detail: String },
    #[error("{0}")]
    Missing(String),
    #[error("bad data set name `{name}`: {detail}")]
    Spec { name: String, detail: String },
}

pub type Result<T, E = DataError> = std::result::Result<T, E>;

pub(crate) fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> DataError + '_ {
    move |source| DataError::Io {
        path: path.to_owned(),
        source,
    }
}

pub(crate) fn format_err(path: &Path, detail: impl Into<String>) -> DataError {
    DataError::Format {
        path: path.to_owned(),
        detail: detail.into(),
    }
}

/// What a model sees of an example.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Input {
    /// A dense vector of `dim` values.
    Dense { dim: usize },
    /// A bag of (u64 feature id, value) pairs.
    Sparse,
}

/// The features of a batch.
#[derive(Debug, Clone, PartialEq)]
pub enum Features {
    /// `rows x dim` values.
    Dense { dim: usize, values: Vec<f32> },
    /// Example `r` has features `ids[offsets[r]..offsets[r+1]]` with `values` alongside.
    Sparse {
        offsets: Vec<u32>,
        ids: Vec<u64>,
        values: Vec<f32>,
    },
}

/// A batch of examples, as the prefetcher hands it to the trainer.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    pub labels: Vec<u32>,
    pub features: Features,
    /// The worker's epoch the batch belongs to.
    pub epoch: u64,
}

impl Batch {
    pub fn empty(input: Input) -> Self {
        let features = match input {
            Input::Dense { dim } => Features::Dense {
                dim,
                values: Vec::new(),
            },
            Input::Sparse => Features::Sparse {
                offsets: vec![0],
                ids: Vec::new(),
                values: Vec::new(),
            },
        };
        Self {
            labels: Vec::new(),
            features,
            epoch: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.labels.len()
    }

    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// Rows `range` of this batch (for micro-batches).
    pub fn slice(&self, range: std::ops::Range<usize>) -> Batch {
        let features = match &self.features {
            Features::Dense { dim, values } => Features::Dense {
                dim: *dim,
                values: values[range.start * dim..range.end * dim].to_vec(),
            },
            Features::Sparse {
                offsets,
                ids,
                values,
            } => {
                let (s, e) = (offsets[range.start] as usize, offsets[range.end] as usize);
                Features::Sparse {
                    offsets: offsets[range.start..=range.end]
                        .iter()
                        .map(|o| o - s as u32)
                        .collect(),
                    ids: ids[s..e].to_vec(),
                    values: values[s..e].to_vec(),
                }
            }
        };
        Batch {
            labels: self.labels[range].to_vec(),
            features,
            epoch: self.epoch,
        }
    }
}

/// A set of labelled examples that can copy any of them into a batch.
pub trait Dataset: Send + Sync {
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Label classes (2 for a binary label).
    fn classes(&self) -> usize;
    fn input(&self) -> Input;
    /// Clears `out` and fills it with examples `indices`, in that order.
    fn gather(&self, indices: &[usize], out: &mut Batch);
}

/// Dense examples held in memory: bytes (images, scaled on the way out) or f32.
#[derive(Debug, Clone)]
pub struct DenseSet {
    pub dim: usize,
    pub classes: usize,
    pub labels: Vec<u32>,
    pub values: DenseValues,
}

#[derive(Debug, Clone)]
pub enum DenseValues {
    /// Bytes, each mapped to `byte * scale`.
    U8 {
        data: Vec<u8>,
        scale: f32,
    },
    F32(Vec<f32>),
}

impl Dataset for DenseSet {
    fn len(&self) -> usize {
        self.labels.len()
    }

    fn classes(&self) -> usize {
        self.classes
    }

    fn input(&self) -> Input {
        Input::Dense { dim: self.dim }
    }

    fn gather(&self, indices: &[usize], out: &mut Batch) {
        out.labels.clear();
        out.labels.extend(indices.iter().map(|&i| self.labels[i]));
        let dim = self.dim;
        let mut values = take_dense(out);
        values.reserve(indices.len() * dim);
        for &i in indices {
            match &self.values {
                DenseValues::U8 { data, scale } => values.extend(
                    data[i * dim..(i + 1) * dim]
                        .iter()
                        .map(|&b| f32::from(b) * scale),
                ),
                DenseValues::F32(data) => values.extend_from_slice(&data[i * dim..(i + 1) * dim]),
            }
        }
        out.features = Features::Dense { dim, values };
    }
}

/// The batch's dense buffer, emptied, to refill without allocating.
pub(crate) fn take_dense(out: &mut Batch) -> Vec<f32> {
    let empty = Features::Dense {
        dim: 0,
        values: Vec::new(),
    };
    match std::mem::replace(&mut out.features, empty) {
        Features::Dense { mut values, .. } => {
            values.clear();
            values
        }
        Features::Sparse { .. } => Vec::new(),
    }
}

/// The batch's sparse buffers, emptied, to refill without allocating.
pub(crate) fn take_sparse(out: &mut Batch) -> (Vec<u32>, Vec<u64>, Vec<f32>) {
    let empty = Features::Dense {
        dim: 0,
        values: Vec::new(),
    };
    let (mut offsets, mut ids, mut values) = match std::mem::replace(&mut out.features, empty) {
        Features::Sparse {
            offsets,
            ids,
            values,
        } => (offsets, ids, values),
        Features::Dense { .. } => Default::default(),
    };
    offsets.clear();
    ids.clear();
    values.clear();
    (offsets, ids, values)
}

/// Sparse examples held in memory, row after row (CSR).
#[derive(Debug, Clone, Default)]
pub struct SparseSet {
    pub classes: usize,
    pub labels: Vec<u32>,
    pub offsets: Vec<u64>,
    pub ids: Vec<u64>,
    pub values: Vec<f32>,
}

impl SparseSet {
    pub fn new(classes: usize) -> Self {
        Self {
            classes,
            offsets: vec![0],
            ..Default::default()
        }
    }

    /// Appends one example.
    pub fn push(&mut self, label: u32, features: impl IntoIterator<Item = (u64, f32)>) {
        for (id, v) in features {
            self.ids.push(id);
            self.values.push(v);
        }
        self.offsets.push(self.ids.len() as u64);
        self.labels.push(label);
    }
}

impl Dataset for SparseSet {
    fn len(&self) -> usize {
        self.labels.len()
    }

    fn classes(&self) -> usize {
        self.classes
    }

    fn input(&self) -> Input {
        Input::Sparse
    }

    fn gather(&self, indices: &[usize], out: &mut Batch) {
        out.labels.clear();
        out.labels.extend(indices.iter().map(|&i| self.labels[i]));
        let (mut offsets, mut ids, mut values) = take_sparse(out);
        offsets.push(0);
        for &i in indices {
            let (s, e) = (self.offsets[i] as usize, self.offsets[i + 1] as usize);
            ids.extend_from_slice(&self.ids[s..e]);
            values.extend_from_slice(&self.values[s..e]);
            offsets.push(ids.len() as u32);
        }
        out.features = Features::Sparse {
            offsets,
            ids,
            values,
        };
    }
}

/// A training set and a test set.
#[derive(Clone)]
pub struct Split {
    pub train: Arc<dyn Dataset>,
    pub test: Arc<dyn Dataset>,
}

impl std::fmt::Debug for Split {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Split")
            .field("train", &self.train.len())
            .field("test", &self.test.len())
            .field("input", &self.train.input())
            .finish()
    }
}

/// A data set by name (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub enum DatasetSpec {
    FashionMnist,
    Idx(PathBuf),
    Adult,
    Libsvm {
        train: PathBuf,
        test: Option<PathBuf>,
    },
    SyntheticDense {
        n: usize,
        dim: usize,
        classes: usize,
    },
    SyntheticCtr {
        n: usize,
        ids: u64,
        fields: usize,
        /// The set's own seed, in place of the job's.
        seed: Option<u64>,
    },
}

fn spec_err(name: &str, detail: impl Into<String>) -> DataError {
    DataError::Spec {
        name: name.to_owned(),
        detail: detail.into(),
    }
}

fn numbers<const K: usize>(name: &str, rest: &str) -> Result<[u64; K]> {
    let parts: Vec<&str> = rest.split(':').collect();
    if parts.len() != K {
        return Err(spec_err(
            name,
            format!("expected {K} numbers after the kind"),
        ));
    }
    let mut out = [0u64; K];
    for (o, p) in out.iter_mut().zip(parts) {
        *o = p
            .parse()
            .ok()
            .filter(|&v| v > 0)
            .ok_or_else(|| spec_err(name, format!("`{p}` is not a positive number")))?;
    }
    Ok(out)
}

impl DatasetSpec {
    pub fn parse(name: &str) -> Result<Self> {
        let (kind, rest) = name.split_once(':').unwrap_or((name, ""));
        Ok(match kind {
            "fashion-mnist" | "fmnist" => Self::FashionMnist,
            "adult" => Self::Adult,
            "idx" if !rest.is_empty() => Self::Idx(rest.into()),
            "libsvm" if !rest.is_empty() => {
                let mut files = rest.splitn(2, ',');
                Self::Libsvm {
                    train: files.next().unwrap_or_default().into(),
                    test: files.next().map(PathBuf::from),
                }
            }
            "synthetic-dense" => {
                let [n, dim, classes] = numbers::<3>(name, rest)?;
                if classes < 2 {
                    return Err(spec_err(name, "needs at least 2 classes"));
                }
                Self::SyntheticDense {
                    n: n as usize,
                    dim: dim as usize,
                    classes: classes as usize,
                }
            }
            "synthetic-ctr" => {
                let (dims, seed) = match rest.rsplit_once(':') {
                    Some((dims, seed)) if rest.matches(':').count() == 3 => {
                        let [seed] = numbers::<1>(name, seed)?;
                        (dims, Some(seed))
                    }
                    _ => (rest, None),
                };
                let [n, ids, fields] = numbers::<3>(name, dims)?;
                Self::SyntheticCtr {
                    n: n as usize,
                    ids,
                    fields: fields as usize,
                    seed,
                }
            }
            _ => {
                return Err(spec_err(
                    name,
                    "use fashion-mnist, idx:DIR, adult, libsvm:TRAIN[,TEST], \
                     synthetic-dense:N:DIM:CLASSES or synthetic-ctr:N:IDS:FIELDS[:SEED]",
                ));
            }
        })
    }

    /// The input and label classes, known without loading the data (for planning tables).
    pub fn shape(&self) -> (Input, usize) {
        match self {
            Self::FashionMnist | Self::Idx(_) => (Input::Dense { dim: 784 }, 10),
            Self::SyntheticDense { dim, classes, .. } => (Input::Dense { dim: *dim }, *classes),
            Self::Adult | Self::Libsvm { .. } | Self::SyntheticCtr { .. } => (Input::Sparse, 2),
        }
    }

    /// Loads the data. `dir` overrides where the named real data sets are looked for
    /// (Fashion-MNIST's directory, or the Adult file or its directory); `seed` drives the
    /// synthetic sets and the Adult test split.
    pub fn load(&self, dir: Option<&Path>, seed: u64) -> Result<Split> {
        match self {
            Self::FashionMnist => {
                let dir = dir.unwrap_or(Path::new(FASHION_MNIST_DIR));
                // The files, not the folder: a container's missing bind mount is an empty one.
                if !dir.join("train-images-idx3-ubyte.gz").exists() {
                    return Err(DataError::Missing(format!(
                        "Fashion-MNIST is not at {}: install it with \
                         `sudo apt-get install -y dataset-fashion-mnist` (Debian/Ubuntu), or pass \
                         --data DIR with the four IDX files (train-images-idx3-ubyte.gz, \
                         train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz, \
                         t10k-labels-idx1-ubyte.gz)",
                        dir.display()
                    )));
                }
                load_idx_dir(dir)
            }
            Self::Idx(d) => load_idx_dir(dir.unwrap_or(d)),
            Self::Adult => {
                let path = match dir {
                    Some(d) if d.is_dir() => d.join("adult.csv.gz"),
                    Some(f) => f.to_owned(),
                    None => default_adult_path().ok_or_else(|| {
                        DataError::Missing(
                            "adult.csv.gz was not found in ../shared/data, ../../shared/data or \
                             $PS_DATA_DIR: pass --data PATH to the file"
                                .into(),
                        )
                    })?,
                };
                load_adult(&path, seed)
            }
            Self::Libsvm { train, test } => {
                let mut tr = read_libsvm(train)?;
                let mut te = match test {
                    Some(t) => read_libsvm(t)?,
                    None => SparseSet::new(tr.classes),
                };
                let classes = tr.classes.max(te.classes);
                tr.classes = classes;
                te.classes = classes;
                Ok(Split {
                    train: Arc::new(tr),
                    test: Arc::new(te),
                })
            }
            Self::SyntheticDense { n, dim, classes } => {
                let test_n = (n / 6).max(1);
                Ok(Split {
                    train: Arc::new(SyntheticDense::new(*n, *dim, *classes, seed, 0)),
                    test: Arc::new(SyntheticDense::new(test_n, *dim, *classes, seed, 1)),
                })
            }
            Self::SyntheticCtr {
                n,
                ids,
                fields,
                seed: own,
            } => {
                let test_n = (n / 6).max(1);
                let seed = own.unwrap_or(seed);
                Ok(Split {
                    train: Arc::new(SyntheticCtr::new(*n, *ids, *fields, seed, 0)),
                    test: Arc::new(SyntheticCtr::new(test_n, *ids, *fields, seed, 1)),
                })
            }
        }
    }
}

/// Where the Adult table is found when no path is given: `$PS_DATA_DIR`, then the shared data
/// folder beside the checkout.
fn default_adult_path() -> Option<PathBuf> {
    let mut candidates = Vec::new();
    if let Ok(d) = std::env::var("PS_DATA_DIR") {
        candidates.push(PathBuf::from(d).join("adult.csv.gz"));
    }
    for up in ["../shared/data", "../../shared/data"] {
        candidates.push(PathBuf::from(up).join("adult.csv.gz"));
    }
    candidates.into_iter().find(|p| p.exists())
}

/// Reads a whole file, un-gzipping it when it starts with the gzip magic.
pub fn read_maybe_gz(path: &Path) -> Result<Vec<u8>> {
    use std::io::Read;
    let raw = std::fs::read(path).map_err(io_err(path))?;
    if raw.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::with_capacity(raw.len() * 4);
        flate2::read::MultiGzDecoder::new(&raw[..])
            .read_to_end(&mut out)
            .map_err(io_err(path))?;
        Ok(out)
    } else {
        Ok(raw)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_bad_names_say_why() {
        assert_eq!(
            DatasetSpec::parse("fashion-mnist").unwrap(),
            DatasetSpec::FashionMnist
        );
        assert_eq!(
            DatasetSpec::parse("synthetic-dense:1000:20:4").unwrap(),
            DatasetSpec::SyntheticDense {
                n: 1000,
                dim: 20,
                classes: 4
            }
        );
        assert_eq!(
            DatasetSpec::parse("synthetic-ctr:100:50:4").unwrap(),
            DatasetSpec::SyntheticCtr {
                n: 100,
                ids: 50,
                fields: 4,
                seed: None
            }
        );
        // A set of its own seed: the same examples whatever the job's seed.
        let own = DatasetSpec::parse("synthetic-ctr:100:50:4:7").unwrap();
        assert_eq!(
            own,
            DatasetSpec::SyntheticCtr {
                n: 100,
                ids: 50,
                fields: 4,
                seed: Some(7)
            }
        );
        let (a, b, c) = (
            own.load(None, 1).unwrap(),
            own.load(None, 2).unwrap(),
            DatasetSpec::parse("synthetic-ctr:100:50:4")
                .unwrap()
                .load(None, 2)
                .unwrap(),
        );
        let batches = [a, b, c].map(|s| {
            let mut out = Batch::empty(Input::Sparse);
            s.train.gather(&[0, 1, 2, 3], &mut out);
            out
        });
        assert_eq!(batches[0], batches[1]);
        assert_ne!(batches[0], batches[2]);
        for bad in [
            "mnist2",
            "synthetic-dense:10:0:3",
            "synthetic-ctr:5",
            "synthetic-ctr:5:5:5:0",
            "synthetic-ctr:5:5:5:5:5",
            "idx:",
        ] {
            let e = DatasetSpec::parse(bad).unwrap_err().to_string();
            assert!(e.contains(bad), "{e}");
        }
    }

    #[test]
    fn batches_slice_into_micro_batches() {
        let mut s = SparseSet::new(2);
        s.push(1, [(5, 1.0), (6, 2.0)]);
        s.push(0, [(7, 1.0)]);
        s.push(1, []);
        let mut b = Batch::empty(Input::Sparse);
        s.gather(&[2, 0, 1], &mut b);
        assert_eq!(b.labels, vec![1, 1, 0]);
        let tail = b.slice(1..3);
        assert_eq!(
            tail.features,
            Features::Sparse {
                offsets: vec![0, 2, 3],
                ids: vec![5, 6, 7],
                values: vec![1.0, 2.0, 1.0]
            }
        );
    }
}
