//! IDX files (the MNIST family's format): a magic number naming the element type and the number
//! of dimensions, the dimensions as big-endian u32, then the elements. Gzip or raw, any name.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{DataError, DenseSet, DenseValues, Result, Split, format_err, io_err, read_maybe_gz};

/// Reads an IDX file of unsigned bytes: its dimensions and its elements.
pub fn read_idx(path: &Path) -> Result<(Vec<usize>, Vec<u8>)> {
    let bytes = read_maybe_gz(path)?;
    if bytes.len() < 4 || bytes[0] != 0 || bytes[1] != 0 {
        return Err(format_err(path, "not an IDX file (bad magic number)"));
    }
    if bytes[2] != 0x08 {
        return Err(format_err(
            path,
            format!(
                "IDX element type 0x{:02x} is not unsigned bytes (0x08)",
                bytes[2]
            ),
        ));
    }
    let ndims = usize::from(bytes[3]);
    if ndims == 0 {
        return Err(format_err(path, "IDX file with no dimensions"));
    }
    let header = 4 + 4 * ndims;
    let dims: Vec<usize> = bytes
        .get(4..header)
        .ok_or_else(|| format_err(path, "truncated IDX header"))?
        .chunks_exact(4)
        .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
        .collect();
    let want = dims
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| format_err(path, format!("dimensions {dims:?} overflow")))?;
    let body = &bytes[header..];
    if body.len() != want {
        return Err(format_err(
            path,
            format!(
                "the header says {dims:?} ({want} bytes) but the file holds {} bytes",
                body.len()
            ),
        ));
    }
    Ok((dims, body.to_vec()))
}

/// The file in `dir` whose name starts with one of `prefixes` and contains `kind`
/// (`images` or `labels`).
fn find(dir: &Path, prefixes: &[&str], kind: &str) -> Result<PathBuf> {
    let entries = std::fs::read_dir(dir).map_err(io_err(dir))?;
    let mut names: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| prefixes.iter().any(|pre| n.starts_with(pre)) && n.contains(kind))
        })
        .collect();
    names.sort();
    names.into_iter().next().ok_or_else(|| {
        DataError::Missing(format!(
            "no {kind} file starting with {prefixes:?} in {}",
            dir.display()
        ))
    })
}

fn load_pair(images: &Path, labels: &Path) -> Result<DenseSet> {
    let (dims, pixels) = read_idx(images)?;
    let (ldims, labels_raw) = read_idx(labels)?;
    let n = dims[0];
    if ldims.len() != 1 || ldims[0] != n {
        return Err(format_err(
            labels,
            format!("{ldims:?} labels for {n} images in {}", images.display()),
        ));
    }
    let dim = dims[1..].iter().product::<usize>();
    let labels: Vec<u32> = labels_raw.iter().map(|&l| u32::from(l)).collect();
    let classes = labels.iter().max().map_or(0, |&m| m as usize + 1);
    Ok(DenseSet {
        dim,
        classes,
        labels,
        values: DenseValues::U8 {
            data: pixels,
            scale: 1.0 / 255.0,
        },
    })
}

/// Loads `train-{images,labels}*` and `t10k-*` (or `test-*`) from `dir`.
pub fn load_idx_dir(dir: &Path) -> Result<Split> {
    let mut train = load_pair(
        &find(dir, &["train"], "images")?,
        &find(dir, &["train"], "labels")?,
    )?;
    let mut test = load_pair(
        &find(dir, &["t10k", "test"], "images")?,
        &find(dir, &["t10k", "test"], "labels")?,
    )?;
    if train.dim != test.dim {
        return Err(format_err(
            dir,
            format!(
                "train images have {} values, test images {}",
                train.dim, test.dim
            ),
        ));
    }
    let classes = train.classes.max(test.classes);
    train.classes = classes;
    test.classes = classes;
    Ok(Split {
        train: Arc::new(train),
        test: Arc::new(test),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::{Batch, Features};
    use std::io::Write;

    fn idx(dims: &[u32], body: &[u8]) -> Vec<u8> {
        let mut v = vec![0, 0, 8, dims.len() as u8];
        for d in dims {
            v.extend_from_slice(&d.to_be_bytes());
        }
        v.extend_from_slice(body);
        v
    }

    fn gz(bytes: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(bytes).unwrap();
        e.finish().unwrap()
    }

    #[test]
    fn loads_gzip_and_raw_files_under_any_name() {
        let d = tempfile::tempdir().unwrap();
        let img: Vec<u8> = (0..3 * 4).map(|i| i as u8 * 20).collect();
        std::fs::write(
            d.path().join("train-images.idx3.gz"),
            gz(&idx(&[3, 2, 2], &img)),
        )
        .unwrap();
        std::fs::write(d.path().join("train-labels-x"), idx(&[3], &[0, 2, 1])).unwrap();
        std::fs::write(d.path().join("test-images"), idx(&[1, 2, 2], &[255; 4])).unwrap();
        std::fs::write(d.path().join("test-labels.gz"), gz(&idx(&[1], &[1]))).unwrap();
        let s = load_idx_dir(d.path()).unwrap();
        assert_eq!((s.train.len(), s.test.len(), s.train.classes()), (3, 1, 3));
        let mut b = Batch::empty(s.train.input());
        s.train.gather(&[1], &mut b);
        assert_eq!(b.labels, vec![2]);
        let Features::Dense { dim, values } = &b.features else {
            panic!("dense")
        };
        assert_eq!(*dim, 4);
        assert!((values[0] - 80.0 / 255.0).abs() < 1e-6);
    }

    #[test]
    fn bad_files_say_what_is_wrong() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("x");
        std::fs::write(&p, idx(&[2, 2], &[1, 2, 3])).unwrap();
        assert!(
            read_idx(&p)
                .unwrap_err()
                .to_string()
                .contains("holds 3 bytes")
        );
        std::fs::write(&p, [0, 0, 0x0d, 1, 0, 0, 0, 1, 0, 0, 0, 0]).unwrap();
        assert!(
            read_idx(&p)
                .unwrap_err()
                .to_string()
                .contains("element type")
        );
        std::fs::write(&p, b"hello").unwrap();
        assert!(read_idx(&p).unwrap_err().to_string().contains("magic"));
        std::fs::write(&p, [0, 0, 8, 3, 0]).unwrap();
        assert!(read_idx(&p).unwrap_err().to_string().contains("truncated"));
    }

    /// Needs Debian's `dataset-fashion-mnist`, which the test command installs
    /// (`scripts/setup.sh --data`).
    #[test]
    fn reads_fashion_mnist() {
        let dir = Path::new(crate::data::FASHION_MNIST_DIR);
        assert!(
            dir.exists(),
            "Fashion-MNIST is not installed at {}: run scripts/setup.sh --data (or apt-get \
             install dataset-fashion-mnist)",
            dir.display()
        );
        let s = load_idx_dir(dir).unwrap();
        assert_eq!((s.train.len(), s.test.len()), (60_000, 10_000));
        assert_eq!(
            (s.train.classes(), s.train.input()),
            (10, crate::data::Input::Dense { dim: 784 })
        );
    }
}
