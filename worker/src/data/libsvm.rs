//! LIBSVM text: `label index:value index:value ...` per line, `#` comments. Labels `+1`/`1`
//! are class 1 and `-1`/`0` class 0 for binary sets; other integer labels are classes as given.

use std::path::Path;

use super::{Result, SparseSet, format_err, read_maybe_gz};

pub fn read_libsvm(path: &Path) -> Result<SparseSet> {
    let bytes = read_maybe_gz(path)?;
    let text = std::str::from_utf8(&bytes).map_err(|e| format_err(path, e.to_string()))?;
    let mut raw_labels = Vec::new();
    let mut set = SparseSet::new(2);
    let mut feats = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let bad = |what: String| format_err(path, format!("line {}: {what}", n + 1));
        let mut parts = line.split_whitespace();
        let label: f64 = parts
            .next()
            .and_then(|l| l.parse().ok())
            .filter(|l: &f64| l.is_finite() && l.fract() == 0.0)
            .ok_or_else(|| bad("the label is not an integer".into()))?;
        feats.clear();
        for p in parts {
            let (i, v) = p
                .split_once(':')
                .ok_or_else(|| bad(format!("`{p}` is not index:value")))?;
            let i: u64 = i.parse().map_err(|_| bad(format!("index `{i}`")))?;
            let v: f32 = v
                .parse()
                .ok()
                .filter(|v: &f32| v.is_finite())
                .ok_or_else(|| bad(format!("value `{v}`")))?;
            feats.push((i, v));
        }
        raw_labels.push(label as i64);
        set.push(0, feats.iter().copied());
    }
    let binary = raw_labels.iter().all(|&l| (-1..=1).contains(&l));
    if binary {
        set.labels = raw_labels.iter().map(|&l| u32::from(l == 1)).collect();
    } else {
        if let Some(l) = raw_labels.iter().find(|&&l| !(0..=1 << 20).contains(&l)) {
            return Err(format_err(path, format!("class label {l} is out of range")));
        }
        set.labels = raw_labels.iter().map(|&l| l as u32).collect();
        set.classes = set.labels.iter().max().map_or(2, |&m| m as usize + 1);
    }
    Ok(set)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::Dataset;

    #[test]
    fn binary_and_multiclass_files() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("a.svm");
        std::fs::write(&p, "+1 3:1 10:0.5 # comment\n-1 2:1\n\n1\n").unwrap();
        let s = read_libsvm(&p).unwrap();
        assert_eq!(s.labels, vec![1, 0, 1]);
        assert_eq!(s.offsets, vec![0, 2, 3, 3]);
        assert_eq!(s.ids, vec![3, 10, 2]);
        assert_eq!(s.classes(), 2);
        std::fs::write(&p, "0 1:1\n4 1:2\n2 5:1\n").unwrap();
        assert_eq!(read_libsvm(&p).unwrap().classes(), 5);
        std::fs::write(&p, "1 1:x\n").unwrap();
        let e = read_libsvm(&p).unwrap_err().to_string();
        assert!(e.contains("line 1") && e.contains("value"), "{e}");
        std::fs::write(&p, "1 1:nan\n").unwrap();
        assert!(read_libsvm(&p).is_err());
    }
}
