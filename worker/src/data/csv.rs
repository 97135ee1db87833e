//! CSV tables to sparse examples: each categorical column's value and each numeric column's
//! bucket (quantile boundaries from the training rows) becomes one hashed u64 feature id with
//! value 1. The Adult census table is the schema this ships with.

use std::path::Path;
use std::sync::Arc;

use ps_core::hash::{combine, fnv1a};

use super::{Result, SparseSet, Split, format_err, read_maybe_gz};

/// How to read a table: which column is the label, which columns are numeric (bucketized) and
/// which categorical (every other column but the ignored ones).
#[derive(Debug, Clone)]
pub struct TabularSchema {
    pub label: String,
    /// Label values that mean class 1 (compared after trimming spaces and a trailing `.`).
    pub positive: Vec<String>,
    pub numeric: Vec<String>,
    pub ignore: Vec<String>,
    /// Quantile buckets per numeric column.
    pub buckets: usize,
    /// Pairs of columns whose values are also crossed into one feature.
    pub crosses: Vec<(String, String)>,
    /// Share of the rows held out for testing (chosen by a hash of the row number and seed).
    pub test_fraction: f64,
}

impl TabularSchema {
    /// The Adult census table (UCI): `income` is the label, `>50K` the positive class.
    pub fn adult() -> Self {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        Self {
            label: "income".into(),
            positive: s(&[">50K"]),
            numeric: s(&[
                "age",
                "fnlwgt",
                "educational-num",
                "capital-gain",
                "capital-loss",
                "hours-per-week",
            ]),
            ignore: Vec::new(),
            buckets: 16,
            crosses: Vec::new(),
            test_fraction: 1.0 / 3.0,
        }
    }
}

/// Splits one CSV line into fields, honouring double quotes (`""` is a quote inside one).
fn fields(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' if quoted && chars.peek() == Some(&'"') => {
                cur.push('"');
                chars.next();
            }
            '"' => quoted = !quoted,
            ',' if !quoted => out.push(std::mem::take(&mut cur).trim().to_owned()),
            c => cur.push(c),
        }
    }
    out.push(cur.trim().to_owned());
    out
}

fn is_test(row: usize, seed: u64, fraction: f64) -> bool {
    let h = ps_core::hash::mix64(combine(seed, row as u64));
    (h as f64 / u64::MAX as f64) < fraction
}

/// The id of feature `column = value`.
pub fn feature_id(column: &str, value: &str) -> u64 {
    combine(fnv1a(column.as_bytes()), fnv1a(value.as_bytes()))
}

/// Loads a CSV table with a header row.
pub fn load_csv(path: &Path, schema: &TabularSchema, seed: u64) -> Result<Split> {
    let bytes = read_maybe_gz(path)?;
    let text = std::str::from_utf8(&bytes).map_err(|e| format_err(path, e.to_string()))?;
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let header = fields(lines.next().ok_or_else(|| format_err(path, "empty file"))?);
    let col = |name: &str| {
        header
            .iter()
            .position(|h| h == name)
            .ok_or_else(|| format_err(path, format!("no column `{name}` in the header {header:?}")))
    };
    let label_col = col(&schema.label)?;
    let numeric: Vec<usize> = schema
        .numeric
        .iter()
        .map(|n| col(n))
        .collect::<Result<_>>()?;
    let ignored: Vec<usize> = schema
        .ignore
        .iter()
        .map(|n| col(n))
        .collect::<Result<_>>()?;
    let crosses: Vec<(usize, usize)> = schema
        .crosses
        .iter()
        .map(|(a, b)| Ok((col(a)?, col(b)?)))
        .collect::<Result<_>>()?;
    let rows: Vec<Vec<String>> = lines.map(fields).collect();
    let held_out: Vec<bool> = (0..rows.len())
        .map(|i| is_test(i, seed, schema.test_fraction))
        .collect();
    for (i, r) in rows.iter().enumerate() {
        if r.len() != header.len() {
            return Err(format_err(
                path,
                format!(
                    "line {} has {} fields, the header {}",
                    i + 2,
                    r.len(),
                    header.len()
                ),
            ));
        }
    }
    // Quantile boundaries of each numeric column, from the training rows.
    let mut bounds: Vec<Vec<f64>> = Vec::new();
    for &c in &numeric {
        let mut vals: Vec<f64> = rows
            .iter()
            .enumerate()
            .filter(|(i, _)| !held_out[*i])
            .filter_map(|(_, r)| r[c].parse::<f64>().ok())
            .filter(|v| v.is_finite())
            .collect();
        vals.sort_by(f64::total_cmp);
        let mut b: Vec<f64> = (1..schema.buckets)
            .filter_map(|q| vals.get(q * vals.len() / schema.buckets).copied())
            .collect();
        b.dedup();
        bounds.push(b);
    }
    let positive = |v: &str| {
        let v = v.trim().trim_end_matches('.');
        schema.positive.iter().any(|p| p == v)
    };
    let mut train = SparseSet::new(2);
    let mut test = SparseSet::new(2);
    let mut feats = Vec::new();
    for (i, r) in rows.iter().enumerate() {
        feats.clear();
        for (c, v) in r.iter().enumerate() {
            if c == label_col || ignored.contains(&c) {
                continue;
            }
            let name = &header[c];
            let value = match numeric.iter().position(|&n| n == c) {
                Some(k) => match v.parse::<f64>() {
                    Ok(x) if x.is_finite() => {
                        format!("b{}", bounds[k].partition_point(|&b| b <= x))
                    }
                    _ => "missing".to_owned(),
                },
                None if v.is_empty() || v == "?" => "missing".to_owned(),
                None => v.clone(),
            };
            feats.push((feature_id(name, &value), 1.0));
        }
        for &(a, b) in &crosses {
            let name = format!("{}*{}", header[a], header[b]);
            feats.push((feature_id(&name, &format!("{}|{}", r[a], r[b])), 1.0));
        }
        let label = u32::from(positive(&r[label_col]));
        let set = if held_out[i] { &mut test } else { &mut train };
        set.push(label, feats.iter().copied());
    }
    if train.labels.is_empty() {
        return Err(format_err(path, "no training rows"));
    }
    Ok(Split {
        train: Arc::new(train),
        test: Arc::new(test),
    })
}

/// The Adult table with [`TabularSchema::adult`].
pub fn load_adult(path: &Path, seed: u64) -> Result<Split> {
    load_csv(path, &TabularSchema::adult(), seed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::{Batch, Features};

    #[test]
    fn quoted_fields_split_right() {
        assert_eq!(
            fields(r#"25,"Private, Inc",7,"say ""hi""" "#),
            vec!["25", "Private, Inc", "7", r#"say "hi""#]
        );
    }

    #[test]
    fn a_small_table_becomes_hashed_features() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("t.csv");
        let mut text = String::from("age,color,income\n");
        for i in 0..60 {
            let color = ["red", "blue", "?"][i % 3];
            let income = if i % 2 == 0 { ">50K." } else { "<=50K" };
            text.push_str(&format!("{},\"{color}\",{income}\n", 20 + i));
        }
        std::fs::write(&p, text).unwrap();
        let schema = TabularSchema {
            label: "income".into(),
            positive: vec![">50K".into()],
            numeric: vec!["age".into()],
            ignore: vec![],
            buckets: 4,
            crosses: vec![("age".into(), "color".into())],
            test_fraction: 0.25,
        };
        let s = load_csv(&p, &schema, 7).unwrap();
        assert_eq!(s.train.len() + s.test.len(), 60);
        assert!(s.test.len() > 5 && s.test.len() < 30, "{}", s.test.len());
        let mut b = Batch::empty(s.train.input());
        s.train.gather(&[0], &mut b);
        let Features::Sparse { ids, offsets, .. } = &b.features else {
            panic!()
        };
        assert_eq!(offsets, &vec![0, 3], "age bucket, color, the cross");
        assert!(
            ids.contains(&feature_id("color", "red"))
                || ids.contains(&feature_id("color", "missing"))
                || ids.contains(&feature_id("color", "blue"))
        );
        // Positive labels read through a trailing dot.
        let positives: usize = (0..s.train.len())
            .map(|i| {
                s.train.gather(&[i], &mut b);
                b.labels[0] as usize
            })
            .sum();
        assert!(positives > 0 && positives < s.train.len());

        std::fs::write(&p, "age,income\n1,2,3\n").unwrap();
        let e = load_csv(&p, &schema, 7).unwrap_err().to_string();
        assert!(e.contains("no column `color`"), "{e}");
    }

    /// Needs `../shared/data/adult.csv.gz` beside the checkout, as CI has it.
    #[test]
    fn reads_the_adult_table() {
        let path = super::super::default_adult_path().expect(
            "../shared/data/adult.csv.gz is not beside the checkout (the Adult table ships in the \
             shared folder next to the repository)",
        );
        let s = load_adult(&path, 1).unwrap();
        assert_eq!(s.train.len() + s.test.len(), 48_842);
        let frac = s.test.len() as f64 / 48_842.0;
        assert!((frac - 1.0 / 3.0).abs() < 0.02, "{frac}");
    }
}
