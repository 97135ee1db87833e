//! Server-side optimizers. A cell (a dense chunk or a sparse row) stores its `n` parameter
//! values followed by `n * state_slots` optimizer values, slot after slot, plus a step count.

use crate::Optimizer;

/// Initial optimizer-state values for `n` parameters.
pub fn initial_state(opt: &Optimizer, n: usize) -> Vec<f32> {
    match *opt {
        Optimizer::Adagrad {
            initial_accumulator,
            ..
        } => vec![initial_accumulator; n],
        _ => vec![0.0; n * opt.state_slots()],
    }
}

/// Applies gradient `g` to parameters `w` with optimizer state `state` (laid out slot after
/// slot, `w.len()` values each) and the cell's step count.
pub fn apply(opt: &Optimizer, w: &mut [f32], state: &mut [f32], step: &mut u64, g: &[f32]) {
    apply_in_blocks(opt, w, state, step, g, usize::MAX, |_| {});
}

/// The block [`apply_checksummed`] checksums and applies at a time: 8 KiB, which with the
/// values it updates stays in a core's L1.
const CHECKSUM_BLOCK: usize = 2048;

/// [`apply`], returning the CRC-32 of `g` as it lies in memory (a durable shard's log record
/// holds it), taken in the same pass: each block checksummed just before it is applied, while
/// it is in the core's nearest cache, so the gradient is read from memory once, not twice.
pub fn apply_checksummed(
    opt: &Optimizer,
    w: &mut [f32],
    state: &mut [f32],
    step: &mut u64,
    g: &[f32],
) -> u32 {
    let mut crc = crc32fast::Hasher::new();
    apply_in_blocks(opt, w, state, step, g, CHECKSUM_BLOCK, |b| {
        crc.update(bytemuck::cast_slice(b))
    });
    crc.finalize()
}

/// [`apply`], `block` values at a time, calling `each` with a block of the gradient just before
/// it is applied: a second use of the gradient (a checksum of it) made while its block is in
/// the nearest cache, instead of in a pass over all of it of its own. One step, whatever the
/// number of blocks; the result is [`apply`]'s.
pub fn apply_in_blocks(
    opt: &Optimizer,
    w: &mut [f32],
    state: &mut [f32],
    step: &mut u64,
    g: &[f32],
    block: usize,
    mut each: impl FnMut(&[f32]),
) {
    let n = w.len();
    debug_assert_eq!(g.len(), n);
    debug_assert_eq!(state.len(), n * opt.state_slots());
    *step += 1;
    // The first slot, then the second: each `n` values, or empty.
    let (first, second) = state.split_at_mut(n.min(state.len()));
    let block = block.max(1);
    let mut start = 0;
    while start < n {
        let end = n.min(start.saturating_add(block));
        each(&g[start..end]);
        update(
            opt,
            *step,
            &mut w[start..end],
            slot_part(first, start, end),
            slot_part(second, start, end),
            &g[start..end],
        );
        start = end;
    }
}

/// Values `start..end` of an optimizer slot; an absent (empty) slot stays empty.
fn slot_part(slot: &mut [f32], start: usize, end: usize) -> &mut [f32] {
    if slot.is_empty() {
        slot
    } else {
        &mut slot[start..end]
    }
}

/// The update rule on values `w` with their slots' values (`state`: the first slot, `second`:
/// the second; empty where the optimizer has none), at step `step` (already counted).
fn update(
    opt: &Optimizer,
    step: u64,
    w: &mut [f32],
    state: &mut [f32],
    second: &mut [f32],
    g: &[f32],
) {
    match *opt {
        Optimizer::Sgd { learning_rate: lr } => {
            for (w, g) in w.iter_mut().zip(g) {
                *w -= lr * g;
            }
        }
        Optimizer::Momentum {
            learning_rate: lr,
            momentum: mu,
            nesterov,
        } => {
            for ((w, v), g) in w.iter_mut().zip(state.iter_mut()).zip(g) {
                *v = mu * *v + g;
                *w -= if nesterov {
                    lr * (g + mu * *v)
                } else {
                    lr * *v
                };
            }
        }
        Optimizer::Adagrad {
            learning_rate: lr,
            epsilon,
            ..
        } => {
            for ((w, a), g) in w.iter_mut().zip(state.iter_mut()).zip(g) {
                *a += g * g;
                *w -= lr * g / (a.sqrt() + epsilon);
            }
        }
        Optimizer::Adam {
            learning_rate: lr,
            beta1,
            beta2,
            epsilon,
        } => {
            let t = i32::try_from(step).unwrap_or(i32::MAX);
            let c1 = (1.0 - f64::from(beta1).powi(t)) as f32;
            let c2 = (1.0 - f64::from(beta2).powi(t)) as f32;
            for (((w, m), v), g) in w.iter_mut().zip(state).zip(second).zip(g) {
                *m = beta1 * *m + (1.0 - beta1) * g;
                *v = beta2 * *v + (1.0 - beta2) * g * g;
                *w -= lr * (*m / c1) / ((*v / c2).sqrt() + epsilon);
            }
        }
        Optimizer::Ftrl {
            alpha,
            beta,
            l1,
            l2,
        } => {
            for (((w, z), acc), g) in w.iter_mut().zip(state).zip(second).zip(g) {
                let acc_new = *acc + g * g;
                let sigma = (acc_new.sqrt() - acc.sqrt()) / alpha;
                *z += g - sigma * *w;
                *acc = acc_new;
                *w = if z.abs() <= l1 {
                    0.0
                } else {
                    -(*z - z.signum() * l1) / ((beta + acc.sqrt()) / alpha + l2)
                };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(opt: Optimizer, w0: &[f32], grads: &[&[f32]]) -> Vec<f32> {
        let mut w = w0.to_vec();
        let mut s = initial_state(&opt, w.len());
        let mut step = 0;
        for g in grads {
            apply(&opt, &mut w, &mut s, &mut step, g);
        }
        assert_eq!(step, grads.len() as u64);
        w
    }

    fn close(a: &[f32], b: &[f32]) {
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() <= 1e-6 * y.abs().max(1.0), "{a:?} vs {b:?}");
        }
    }

    // Every expected value below was worked out by hand from the update rule in the comment.

    #[test]
    fn sgd() {
        // w = 1 - 0.1*0.5 = 0.95; then 0.95 - 0.1*(-1) = 1.05
        close(
            &run(Optimizer::sgd(0.1), &[1.0], &[&[0.5], &[-1.0]]),
            &[1.05],
        );
    }

    #[test]
    fn momentum() {
        // v1 = 1, w1 = 1 - 0.1 = 0.9; v2 = 0.9*1 + 1 = 1.9, w2 = 0.9 - 0.19 = 0.71
        close(
            &run(Optimizer::momentum(0.1, 0.9), &[1.0], &[&[1.0], &[1.0]]),
            &[0.71],
        );
        // nesterov: v1 = 1, w1 = 1 - 0.1*(1 + 0.9) = 0.81
        let nest = Optimizer::Momentum {
            learning_rate: 0.1,
            momentum: 0.9,
            nesterov: true,
        };
        close(&run(nest, &[1.0], &[&[1.0]]), &[0.81]);
    }

    #[test]
    fn adagrad() {
        // a = 0.1 + 4 = 4.1; w = 1 - 0.5*2/sqrt(4.1) = 1 - 0.4938648
        // a = 4.1 + 1 = 5.1; w -= 0.5*1/sqrt(5.1) = 0.2214037
        let opt = Optimizer::Adagrad {
            learning_rate: 0.5,
            initial_accumulator: 0.1,
            epsilon: 0.0_f32.max(1e-30),
        };
        close(
            &run(opt, &[1.0], &[&[2.0], &[1.0]]),
            &[1.0 - 0.493_864_8 - 0.221_403_7],
        );
    }

    #[test]
    fn adam() {
        // Step 1: m = 0.1*g, v = 0.001*g^2, mhat = g, vhat = g^2, w -= lr * sign(g) (eps ~ 0)
        // Step 2 with the same g: mhat = g, vhat = g^2 again, so w -= lr again.
        let opt = Optimizer::Adam {
            learning_rate: 0.01,
            beta1: 0.9,
            beta2: 0.999,
            epsilon: 1e-12,
        };
        close(
            &run(opt, &[1.0, -1.0], &[&[3.0, -0.5], &[3.0, -0.5]]),
            &[0.98, -0.98],
        );
        // Step 2 with g2 = 0 after g1 = 1: m = 0.09, v = 0.000999, mhat = 0.09/0.19,
        // vhat = 0.000999/0.001999; w2 = w1 - 0.01*0.4736842/0.7069321 = 0.99 - 0.0067006
        close(&run(opt, &[1.0], &[&[1.0], &[0.0]]), &[0.99 - 0.006_700_6]);
    }

    #[test]
    fn ftrl() {
        // alpha 1, beta 1, l1 0.5, l2 0, w0 = 0, g = 2:
        // n = 4, sigma = 2, z = 2 - 0 = 2, w = -(2 - 0.5)/((1 + 2)/1) = -0.5
        // g = 1: n = 5, sigma = sqrt5 - 2 = 0.2360680, z = 2 + 1 + 0.118034 = 3.118034,
        // w = -(3.118034 - 0.5)/(1 + sqrt5) = -0.8090170
        let opt = Optimizer::ftrl(1.0, 1.0, 0.5, 0.0);
        close(&run(opt, &[0.0], &[&[2.0]]), &[-0.5]);
        close(&run(opt, &[0.0], &[&[2.0], &[1.0]]), &[-0.809_017]);
        // |z| <= l1 gives exactly zero: the sparsity FTRL is used for.
        close(
            &run(Optimizer::ftrl(1.0, 1.0, 5.0, 0.0), &[0.0], &[&[2.0]]),
            &[0.0],
        );
    }

    #[test]
    fn blocks_give_the_whole_update_and_see_the_gradient_in_order() {
        let n = 10;
        let g0: Vec<f32> = (0..n).map(|i| (i as f32 - 4.5) * 0.3).collect();
        let g1: Vec<f32> = (0..n).map(|i| ((i * 7) % 5) as f32 - 2.0).collect();
        for opt in [
            Optimizer::sgd(0.1),
            Optimizer::momentum(0.1, 0.9),
            Optimizer::adagrad(0.1),
            Optimizer::adam(0.01),
            Optimizer::ftrl(1.0, 1.0, 0.1, 0.01),
        ] {
            let w0: Vec<f32> = (0..n).map(|i| i as f32 * 0.1).collect();
            let (mut w, mut s, mut step) = (w0.clone(), initial_state(&opt, n), 0);
            let (mut wb, mut sb, mut stepb) = (w0, initial_state(&opt, n), 0);
            for g in [&g0, &g1] {
                apply(&opt, &mut w, &mut s, &mut step, g);
                let mut seen = Vec::new();
                apply_in_blocks(&opt, &mut wb, &mut sb, &mut stepb, g, 3, |b| {
                    assert!(b.len() <= 3);
                    seen.extend_from_slice(b);
                });
                assert_eq!(&seen, g, "{opt:?}");
            }
            assert_eq!(step, 2);
            assert_eq!(stepb, 2);
            assert_eq!(w, wb, "{opt:?}");
            assert_eq!(s, sb, "{opt:?}");
        }
    }
}
