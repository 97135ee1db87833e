//! The CPU backend: host vectors, GEMM from `matrixmultiply` (a blocked, vectorized kernel),
//! plain loops for the element-wise operations.

use super::{
    Backend, Bags, LossSum, Result, Trans, check_bags, check_gemm, check_sigmoid, check_softmax,
    rows_of, same_len,
};

#[derive(Debug, Clone, Copy, Default)]
pub struct Cpu;

/// `c = alpha * op(a) * op(b) + beta * c` on row-major slices whose sizes the caller checked.
#[allow(unsafe_code, clippy::too_many_arguments)]
fn sgemm(
    ta: Trans,
    tb: Trans,
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    a: &[f32],
    b: &[f32],
    beta: f32,
    c: &mut [f32],
) {
    assert!(a.len() >= m * k && b.len() >= k * n && c.len() >= m * n);
    // Strides of op(a) (m x k) and op(b) (k x n) as views of the row-major storage.
    let (rsa, csa) = match ta {
        Trans::N => (k as isize, 1),
        Trans::T => (1, m as isize),
    };
    let (rsb, csb) = match tb {
        Trans::N => (n as isize, 1),
        Trans::T => (1, k as isize),
    };
    // SAFETY: the assert above bounds every index the strides reach: op(a) touches
    // a[i*rsa + p*csa] for i < m, p < k, at most m*k - 1 in either layout, likewise op(b) and
    // c (row-major m x n). The slices do not alias: `c` is a unique borrow.
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            alpha,
            a.as_ptr(),
            rsa,
            csa,
            b.as_ptr(),
            rsb,
            csb,
            beta,
            c.as_mut_ptr(),
            n as isize,
            1,
        );
    }
}

impl Backend for Cpu {
    type Buf = Vec<f32>;

    fn name(&self) -> &'static str {
        "cpu"
    }

    fn zeros(&self, len: usize) -> Result<Vec<f32>> {
        Ok(vec![0.0; len])
    }

    fn upload(&self, host: &[f32]) -> Result<Vec<f32>> {
        Ok(host.to_vec())
    }

    fn write(&self, dst: &mut Vec<f32>, host: &[f32]) -> Result<()> {
        same_len("write", dst.len(), host.len())?;
        dst.copy_from_slice(host);
        Ok(())
    }

    fn download(&self, src: &Vec<f32>, host: &mut [f32]) -> Result<()> {
        same_len("download", src.len(), host.len())?;
        host.copy_from_slice(src);
        Ok(())
    }

    fn len(&self, buf: &Vec<f32>) -> usize {
        buf.len()
    }

    fn gemm(
        &self,
        ta: Trans,
        tb: Trans,
        m: usize,
        n: usize,
        k: usize,
        alpha: f32,
        a: &Vec<f32>,
        b: &Vec<f32>,
        beta: f32,
        c: &mut Vec<f32>,
    ) -> Result<()> {
        check_gemm(m, n, k, a.len(), b.len(), c.len())?;
        if m * n == 0 {
            return Ok(());
        }
        sgemm(ta, tb, m, n, k, alpha, a, b, beta, c);
        Ok(())
    }

    fn add_row_bias(&self, x: &mut Vec<f32>, bias: &Vec<f32>, cols: usize) -> Result<()> {
        rows_of("add_row_bias", x.len(), cols)?;
        same_len("add_row_bias", bias.len(), cols)?;
        for row in x.chunks_exact_mut(cols) {
            for (v, b) in row.iter_mut().zip(bias) {
                *v += b;
            }
        }
        Ok(())
    }

    fn sum_rows_into(&self, x: &Vec<f32>, cols: usize, out: &mut Vec<f32>) -> Result<()> {
        rows_of("sum_rows_into", x.len(), cols)?;
        same_len("sum_rows_into", out.len(), cols)?;
        for row in x.chunks_exact(cols) {
            for (o, v) in out.iter_mut().zip(row) {
                *o += v;
            }
        }
        Ok(())
    }

    fn relu(&self, x: &mut Vec<f32>) -> Result<()> {
        for v in x.iter_mut() {
            *v = v.max(0.0);
        }
        Ok(())
    }

    fn relu_backward(&self, y: &Vec<f32>, dy: &mut Vec<f32>) -> Result<()> {
        same_len("relu_backward", y.len(), dy.len())?;
        for (d, &v) in dy.iter_mut().zip(y) {
            if v <= 0.0 {
                *d = 0.0;
            }
        }
        Ok(())
    }

    fn add(&self, x: &mut Vec<f32>, y: &Vec<f32>) -> Result<()> {
        same_len("add", x.len(), y.len())?;
        for (a, b) in x.iter_mut().zip(y) {
            *a += b;
        }
        Ok(())
    }

    fn scale(&self, x: &mut Vec<f32>, alpha: f32) -> Result<()> {
        for v in x.iter_mut() {
            *v *= alpha;
        }
        Ok(())
    }

    fn softmax_xent(
        &self,
        logits: &Vec<f32>,
        labels: &[u32],
        classes: usize,
        scale: f32,
        mut grad: Option<&mut Vec<f32>>,
    ) -> Result<LossSum> {
        check_softmax(logits.len(), labels, classes, grad.as_deref().map(Vec::len))?;
        let mut sum = LossSum::default();
        let mut p = vec![0.0f32; classes];
        for (r, (row, &label)) in logits.chunks_exact(classes).zip(labels).enumerate() {
            let label = label as usize;
            let (arg, max) =
                row.iter()
                    .copied()
                    .enumerate()
                    .fold((0, f32::NEG_INFINITY), |(ai, am), (i, v)| {
                        if v > am { (i, v) } else { (ai, am) }
                    });
            let mut z = 0.0f32;
            for (q, &v) in p.iter_mut().zip(row) {
                *q = (v - max).exp();
                z += *q;
            }
            sum.loss += f64::from(z.ln() - (row[label] - max));
            sum.correct += usize::from(arg == label);
            if let Some(g) = grad.as_deref_mut() {
                let out = &mut g[r * classes..(r + 1) * classes];
                for (i, (o, q)) in out.iter_mut().zip(&p).enumerate() {
                    *o = scale * (q / z - f32::from(u8::from(i == label)));
                }
            }
        }
        Ok(sum)
    }

    fn sigmoid_xent(
        &self,
        logits: &Vec<f32>,
        labels: &[u32],
        scale: f32,
        mut grad: Option<&mut Vec<f32>>,
        probs: &mut Vec<f32>,
    ) -> Result<LossSum> {
        check_sigmoid(logits.len(), labels, grad.as_deref().map(Vec::len))?;
        probs.clear();
        let mut sum = LossSum::default();
        for (i, (&z, &y)) in logits.iter().zip(labels).enumerate() {
            let y = y as f32;
            // log(1 + e^z) - y z, computed without overflow.
            let softplus = z.max(0.0) + (-z.abs()).exp().ln_1p();
            sum.loss += f64::from(softplus - y * z);
            let p = 1.0 / (1.0 + (-z).exp());
            sum.correct += usize::from((p >= 0.5) == (y > 0.5));
            probs.push(p);
            if let Some(g) = grad.as_deref_mut() {
                g[i] = scale * (p - y);
            }
        }
        Ok(sum)
    }

    fn bag_forward(
        &self,
        table: &Vec<f32>,
        dim: usize,
        bags: &Bags,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        check_bags("bag_forward", table.len(), dim, bags, out.len())?;
        out.fill(0.0);
        for (b, o) in out.chunks_exact_mut(dim).enumerate() {
            for (r, w) in bags.bag(b) {
                for (o, t) in o.iter_mut().zip(&table[r * dim..(r + 1) * dim]) {
                    *o += w * t;
                }
            }
        }
        Ok(())
    }

    fn bag_backward(
        &self,
        dout: &Vec<f32>,
        dim: usize,
        bags: &Bags,
        dtable: &mut Vec<f32>,
    ) -> Result<()> {
        check_bags("bag_backward", dtable.len(), dim, bags, dout.len())?;
        for (b, d) in dout.chunks_exact(dim).enumerate() {
            for (r, w) in bags.bag(b) {
                for (t, d) in dtable[r * dim..(r + 1) * dim].iter_mut().zip(d) {
                    *t += w * d;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::BackendError;

    fn naive(ta: Trans, tb: Trans, m: usize, n: usize, k: usize, a: &[f32], b: &[f32]) -> Vec<f32> {
        let at = |i: usize, p: usize| match ta {
            Trans::N => a[i * k + p],
            Trans::T => a[p * m + i],
        };
        let bt = |p: usize, j: usize| match tb {
            Trans::N => b[p * n + j],
            Trans::T => b[j * k + p],
        };
        let mut c = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k).map(|p| at(i, p) * bt(p, j)).sum();
            }
        }
        c
    }

    #[test]
    fn gemm_matches_the_definition_in_every_layout() {
        let (m, n, k) = (7, 5, 9);
        let a: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i as f32 * 0.11).cos()).collect();
        for ta in [Trans::N, Trans::T] {
            for tb in [Trans::N, Trans::T] {
                let want = naive(ta, tb, m, n, k, &a, &b);
                let mut c = vec![1.0; m * n];
                Cpu.gemm(ta, tb, m, n, k, 2.0, &a, &b, 0.5, &mut c).unwrap();
                for (g, w) in c.iter().zip(&want) {
                    assert!(
                        (g - (2.0 * w + 0.5)).abs() < 1e-4,
                        "{ta:?}{tb:?}: {g} vs {w}"
                    );
                }
            }
        }
        let mut c = vec![0.0; 3];
        assert!(matches!(
            Cpu.gemm(Trans::N, Trans::N, m, n, k, 1.0, &a, &b, 0.0, &mut c),
            Err(BackendError::Shape { .. })
        ));
    }

    #[test]
    fn softmax_xent_is_stable_and_counts_hits() {
        let logits = vec![1000.0, 0.0, 0.0, 0.0, 0.0, 5.0];
        let mut g = vec![0.0; 6];
        let s = Cpu
            .softmax_xent(&logits, &[0, 1], 3, 1.0, Some(&mut g))
            .unwrap();
        assert!(s.loss.is_finite());
        assert_eq!(s.correct, 1);
        // Each row of the gradient sums to 0.
        assert!(g[..3].iter().sum::<f32>().abs() < 1e-6);
        assert!(g[3..].iter().sum::<f32>().abs() < 1e-6);
        assert!(matches!(
            Cpu.softmax_xent(&logits, &[0, 3], 3, 1.0, None),
            Err(BackendError::Label { label: 3, .. })
        ));
    }

    #[test]
    fn bags_are_checked_and_scatter_back() {
        let table = vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]; // 3 rows of 2
        let bags = Bags {
            offsets: vec![0, 2, 3],
            rows: vec![0, 2, 2],
            weights: vec![1.0, 0.5, 2.0],
        };
        let mut out = vec![0.0; 4];
        Cpu.bag_forward(&table, 2, &bags, &mut out).unwrap();
        assert_eq!(out, vec![3.5, 5.0, 10.0, 12.0]);
        let mut d = vec![0.0; 6];
        Cpu.bag_backward(&[1.0, 1.0, 1.0, 1.0].to_vec(), 2, &bags, &mut d)
            .unwrap();
        assert_eq!(d, vec![1.0, 1.0, 0.0, 0.0, 2.5, 2.5]);
        let bad = Bags {
            rows: vec![0, 3, 2],
            ..bags
        };
        assert!(Cpu.bag_forward(&table, 2, &bad, &mut out).is_err());
    }
}
