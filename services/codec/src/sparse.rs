//! Sparse payloads: selection (top-k, random-k) and the entry layout (values, then the sorted
//! indices as LEB128 varints of the gaps).

use half::f16;
use rand::Rng;
use rand::seq::index;
use rand_xoshiro::Xoshiro256PlusPlus;
use rand_xoshiro::rand_core::SeedableRng;

use crate::quant::read_f32_le;
use crate::{CodecError, Encoding, Header, data_err};

/// Longest LEB128 encoding of a u64.
pub const MAX_VARINT_BYTES: usize = 10;

/// Below this many values top-k selects exactly over all of them; above it a sampled threshold
/// first cuts the candidates to a little more than k.
pub const EXACT_TOP_K_MAX: usize = 1 << 17;

/// A magnitude key that orders like |v| for every finite value and puts NaN above infinity.
#[inline]
fn key(v: f32) -> u32 {
    v.to_bits() & 0x7fff_ffff
}

/// Indices of the `k` values of largest magnitude, ascending. Ties at the k-th magnitude are
/// broken arbitrarily; NaNs count as the largest (so the receiver sees them).
pub fn top_k(values: &[f32], k: usize) -> Vec<u32> {
    top_k_entries(values, k).0
}

/// [`top_k`] with the selected values alongside their indices.
pub fn top_k_entries(values: &[f32], k: usize) -> (Vec<u32>, Vec<f32>) {
    let n = values.len();
    assert!(
        u32::try_from(n).is_ok(),
        "sparse payloads hold at most u32::MAX values"
    );
    if k == 0 {
        return (Vec::new(), Vec::new());
    }
    if k >= n {
        return ((0..n as u32).collect(), values.to_vec());
    }
    if n <= EXACT_TOP_K_MAX || k > n / 8 {
        // Straight from `values`: only the kept entries are copied out.
        let (kth, mut ties) = kth_largest(values, k);
        let (mut idx, mut vals) = (Vec::with_capacity(k), Vec::with_capacity(k));
        for (i, &v) in values.iter().enumerate() {
            let x = key(v);
            if x > kth || (x == kth && ties > 0) {
                ties -= usize::from(x == kth);
                idx.push(i as u32);
                vals.push(v);
            }
        }
        (idx, vals)
    } else {
        sampled_top_k(values, k)
    }
}

/// Keeps the `k` entries of largest magnitude, in their order (ascending indices stay
/// ascending): the k-th largest key is found by selection (O(len) on average), then one pass
/// keeps every entry above it and as many at it as are needed. No sort, and only the
/// candidates' own values are read.
fn keep_largest(mut idx: Vec<u32>, mut vals: Vec<f32>, k: usize) -> (Vec<u32>, Vec<f32>) {
    if idx.len() <= k {
        return (idx, vals);
    }
    let (kth, mut ties) = kth_largest(&vals, k);
    let mut kept = 0usize;
    for i in 0..idx.len() {
        let x = key(vals[i]);
        let keep = x > kth || (x == kth && ties > 0);
        ties -= usize::from(x == kth && keep);
        idx[kept] = idx[i];
        vals[kept] = vals[i];
        kept += usize::from(keep);
    }
    idx.truncate(kept);
    vals.truncate(kept);
    (idx, vals)
}

/// The `k`-th largest magnitude key of `vals` (`0 < k < vals.len()`), by selection (O(len) on
/// average), and how many entries at that key the largest `k` take.
fn kth_largest(vals: &[f32], k: usize) -> (u32, usize) {
    let mut keys: Vec<u32> = vals.iter().map(|&v| key(v)).collect();
    let kth = *keys.select_nth_unstable_by(k - 1, |a, b| b.cmp(a)).1;
    let above = keys.iter().filter(|&&x| x > kth).count();
    (kth, k - above)
}

/// Top-k for large inputs: the threshold at a slightly generous quantile of a random sample of
/// magnitudes keeps a few more than k candidates in one pass; exact selection then trims them
/// to k. When the sample was unlucky and fewer than k pass, the threshold is lowered and the
/// pass repeated, so the result is always the exact top k.
fn sampled_top_k(values: &[f32], k: usize) -> (Vec<u32>, Vec<f32>) {
    const SAMPLE: usize = 1 << 15;
    let n = values.len();
    // A fixed seed: the same input always gives the same candidates.
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(n as u64 ^ 0x9e37_79b9_7f4a_7c15);
    let mut sample: Vec<u32> = (0..SAMPLE)
        .map(|_| key(values[rng.random_range(0..n)]))
        .collect();
    // Expected rank of the k-th largest in the sample, plus a margin of about four standard
    // deviations so that one pass nearly always suffices.
    let expect = k as f64 / n as f64 * SAMPLE as f64;
    let mut rank = (expect * 1.1 + 4.0 * expect.sqrt() + 8.0) as usize;
    loop {
        let threshold = if rank >= SAMPLE {
            0
        } else {
            *sample.select_nth_unstable_by(rank, |a, b| b.cmp(a)).1
        };
        let (idx, vals) = candidates(values, threshold);
        if idx.len() >= k || threshold == 0 {
            return keep_largest(idx, vals, k);
        }
        rank *= 4;
    }
}

/// The entries whose magnitude key is at least `threshold`, ascending. Runs of 16 values are
/// first tested with a vectorized max; only a run holding a candidate is scanned, branch-free,
/// value by value.
fn candidates(values: &[f32], threshold: u32) -> (Vec<u32>, Vec<f32>) {
    const RUN: usize = 16;
    let mut idx: Vec<u32> = Vec::new();
    let mut vals: Vec<f32> = Vec::new();
    let mut len = 0usize;
    for (r, run) in values.chunks(RUN).enumerate() {
        let max = run.iter().fold(0u32, |m, &v| m.max(key(v)));
        if max < threshold {
            continue;
        }
        if idx.len() < len + RUN {
            let grow = (len + RUN).max(idx.len() * 2);
            idx.resize(grow, 0);
            vals.resize(grow, 0.0);
        }
        let base = (r * RUN) as u32;
        for (i, &v) in run.iter().enumerate() {
            idx[len] = base + i as u32;
            vals[len] = v;
            len += usize::from(key(v) >= threshold);
        }
    }
    idx.truncate(len);
    vals.truncate(len);
    (idx, vals)
}

/// `k` distinct indices of `0..n` drawn uniformly, ascending.
pub fn random_k(n: usize, k: usize, rng: &mut impl Rng) -> Vec<u32> {
    assert!(
        u32::try_from(n).is_ok(),
        "sparse payloads hold at most u32::MAX values"
    );
    let k = k.min(n);
    let mut v: Vec<u32> = index::sample(rng, n, k)
        .into_iter()
        .map(|i| i as u32)
        .collect();
    v.sort_unstable();
    v
}

fn write_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Reads one LEB128 varint at `*pos`; `None` when it is cut short or longer than a u64.
fn read_varint(bytes: &[u8], pos: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for i in 0..MAX_VARINT_BYTES {
        let b = *bytes.get(*pos)?;
        *pos += 1;
        let part = u64::from(b & 0x7f);
        if i == MAX_VARINT_BYTES - 1 && part > 1 {
            return None;
        }
        v |= part << (7 * i);
        if b & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

/// Appends the entries `(indices[i], picked[i])`; `indices` must be ascending and distinct.
/// Values are written as f32 or f16 as `encoding` says.
pub fn encode_entries(indices: &[u32], picked: &[f32], encoding: Encoding, out: &mut Vec<u8>) {
    match encoding {
        Encoding::SparseF16 => crate::quant::encode_f16(picked, out),
        _ => out.extend_from_slice(bytemuck::cast_slice(picked)),
    }
    write_indices(out, indices.iter().map(|&i| u64::from(i)));
}

/// Appends ascending, distinct indices as varints: the first, then each gap less one.
fn write_indices(out: &mut Vec<u8>, indices: impl IntoIterator<Item = u64>) {
    let mut prev: Option<u64> = None;
    for i in indices {
        write_varint(out, prev.map_or(i, |p| i - p - 1));
        prev = Some(i);
    }
}

/// The entries' indices of a sparse payload, ascending, and the bytes of their values, after
/// checking the layout: exactly `num_entries` values and varints, indices ascending and below
/// `num_values`, no bytes left over.
fn entries(header: &Header, raw: &[u8]) -> Result<(Vec<usize>, usize), CodecError> {
    let k = usize::try_from(header.num_entries)
        .map_err(|_| data_err("num_entries does not fit this machine"))?;
    let n = header.num_values;
    let vals_len = k
        .checked_mul(value_bytes(header.encoding))
        .filter(|&l| l <= raw.len())
        .ok_or_else(|| data_err(format!("the data is too short for {k} values")))?;
    let idx_bytes = &raw[vals_len..];
    let mut indices = Vec::with_capacity(k);
    let mut pos = 0usize;
    let mut next = 0u64; // the smallest index the next entry may have
    for e in 0..k {
        let gap = read_varint(idx_bytes, &mut pos)
            .ok_or_else(|| data_err(format!("entry {e}: the index varint is malformed")))?;
        let i = next.checked_add(gap).filter(|&i| i < n).ok_or_else(|| {
            data_err(format!(
                "entry {e}: index {} is out of range (the payload stands for {n} values)",
                u128::from(next) + u128::from(gap)
            ))
        })?;
        indices.push(i as usize);
        next = i + 1;
    }
    if pos != idx_bytes.len() {
        return Err(data_err(format!(
            "{} bytes follow the last of the {k} indices",
            idx_bytes.len() - pos
        )));
    }
    Ok((indices, vals_len))
}

/// Bytes of one value in a sparse payload.
fn value_bytes(encoding: Encoding) -> usize {
    if encoding == Encoding::SparseF16 {
        2
    } else {
        4
    }
}

/// Calls `f(index, value)` for each entry of a sparse payload after checking the whole layout
/// (see [`entries`]). Nothing is reported when anything is wrong.
pub fn for_each_entry(
    header: &Header,
    raw: &[u8],
    mut f: impl FnMut(usize, f32),
) -> Result<(), CodecError> {
    // Indices first, so that a bad one is found before anything is reported.
    let (indices, vals_len) = entries(header, raw)?;
    let vals = &raw[..vals_len];
    let vb = value_bytes(header.encoding);
    let k = indices.len();
    if vb == 2 {
        for (&i, b) in indices.iter().zip(vals.chunks_exact(2)) {
            f(i, f16::from_le_bytes([b[0], b[1]]).to_f32());
        }
    } else {
        let mut v = vec![0.0f32; k];
        read_f32_le(vals, &mut v);
        for (&i, &x) in indices.iter().zip(&v) {
            f(i, x);
        }
    }
    Ok(())
}

/// A checked sparse payload over rows of `dim` values, re-indexed over the rows its entries
/// fall in: those rows, ascending, and the new raw bytes (the values' bytes as they were, then
/// the new indices' gaps). Entry `i` of row `r` becomes entry `rank(r) * dim + i % dim`.
pub fn compact_rows(
    header: &Header,
    raw: &[u8],
    dim: usize,
) -> Result<(Vec<usize>, Vec<u8>), CodecError> {
    let (indices, vals_len) = entries(header, raw)?;
    let dim = dim.max(1);
    let mut out = Vec::with_capacity(raw.len());
    out.extend_from_slice(&raw[..vals_len]);
    let mut rows: Vec<usize> = Vec::new();
    let reindexed: Vec<u64> = indices
        .into_iter()
        .map(|i| {
            let row = i / dim;
            if rows.last() != Some(&row) {
                rows.push(row);
            }
            ((rows.len() - 1) * dim + i % dim) as u64
        })
        .collect();
    write_indices(&mut out, reindexed);
    Ok((rows, out))
}
