//! Gradients against central finite differences, for every model kind.

use super::*;
use crate::backend::Cpu;
use crate::data::{Dataset, SparseSet, SyntheticDense};
use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

/// Summed loss of `batch` under the current parameters.
fn loss(net: &mut Net<Cpu>, batch: &Batch) -> f64 {
    net.step(batch, 1.0, false, &mut Vec::new()).unwrap().loss
}

fn random(n: usize, r: &mut Xoshiro256PlusPlus, scale: f32) -> Vec<f32> {
    (0..n).map(|_| r.random_range(-scale..scale)).collect()
}

/// Checks each analytic gradient entry (a sample of them for big tensors) against
/// (L(p + h) - L(p - h)) / 2h.
fn check(
    net: &mut Net<Cpu>,
    batch: &Batch,
    dense: &mut [(String, Vec<f32>)],
    rows: &mut SparseRows,
) {
    net.zero_grads().unwrap();
    net.set_rows(rows).unwrap();
    net.step(batch, 1.0, true, &mut Vec::new()).unwrap();
    let g = net.grads().unwrap();
    let h = 1e-3f32;
    let close = |num: f64, ana: f32, what: &str| {
        let tol = 2e-2 * (1.0 + num.abs().max(f64::from(ana.abs())));
        assert!(
            (num - f64::from(ana)).abs() <= tol,
            "{what}: numeric {num} vs analytic {ana}"
        );
    };
    for (name, values) in dense.iter_mut() {
        let ana = &g.dense.iter().find(|(n, _)| n == name).unwrap().1;
        assert_eq!(ana.len(), values.len(), "{name}");
        let step = (values.len() / 40).max(1);
        let mut checked = 0;
        for i in (0..values.len()).step_by(step) {
            let keep = values[i];
            let mid = loss(net, batch);
            values[i] = keep + h;
            net.set_dense(name, values).unwrap();
            let up = loss(net, batch);
            values[i] = keep - h;
            net.set_dense(name, values).unwrap();
            let down = loss(net, batch);
            values[i] = keep;
            net.set_dense(name, values).unwrap();
            let (fwd, bwd) = ((up - mid) / f64::from(h), (mid - down) / f64::from(h));
            // A ReLU kink within the step makes the one-sided slopes disagree: skip that entry.
            if (fwd - bwd).abs() > 2e-2 * (1.0 + fwd.abs()) {
                continue;
            }
            let b = (up - down) / (2.0 * f64::from(h));
            checked += 1;
            close(b, ana[i], &format!("{name}[{i}]"));
        }
        // ReLU layers put kinks near some entries; most must still be checked.
        assert!(
            checked * 2 >= values.len().div_ceil(step),
            "{name}: too many kinks"
        );
    }
    for (table, ids, ana) in &g.sparse {
        assert_eq!(ids, &rows.ids);
        let emb = table.ends_with("/emb");
        let len = if emb { rows.emb.len() } else { rows.wide.len() };
        for i in (0..len).step_by((len / 30).max(1)) {
            fn get(r: &mut SparseRows, emb: bool) -> &mut Vec<f32> {
                if emb { &mut r.emb } else { &mut r.wide }
            }
            let keep = get(rows, emb)[i];
            get(rows, emb)[i] = keep + h;
            net.set_rows(rows).unwrap();
            let up = loss(net, batch);
            get(rows, emb)[i] = keep - h;
            net.set_rows(rows).unwrap();
            let down = loss(net, batch);
            get(rows, emb)[i] = keep;
            net.set_rows(rows).unwrap();
            close(
                (up - down) / (2.0 * f64::from(h)),
                ana[i],
                &format!("{table}[{i}]"),
            );
        }
    }
}

fn dense_case(spec: &str) {
    let spec = ModelSpec::parse(spec).unwrap();
    let data = SyntheticDense::new(64, 6, 4, 3, 0);
    let mut batch = Batch::empty(data.input());
    data.gather(&(0..16).collect::<Vec<_>>(), &mut batch);
    let mut net = Net::new(Cpu, spec, "t", data.input(), 4).unwrap();
    let mut r = Xoshiro256PlusPlus::seed_from_u64(5);
    let mut dense: Vec<(String, Vec<f32>)> = net
        .dense_tables()
        .iter()
        .map(|(n, len)| (n.clone(), random(*len, &mut r, 0.5)))
        .collect();
    for (n, v) in &dense {
        net.set_dense(n, v).unwrap();
    }
    check(&mut net, &batch, &mut dense, &mut SparseRows::default());
}

#[test]
fn softmax_gradients_match_finite_differences() {
    dense_case("softmax");
}

#[test]
fn mlp_gradients_match_finite_differences() {
    dense_case("mlp:7,5");
}

fn sparse_case(spec: &str) {
    let spec = ModelSpec::parse(spec).unwrap();
    let mut data = SparseSet::new(2);
    let mut r = Xoshiro256PlusPlus::seed_from_u64(9);
    for i in 0..12 {
        let feats: Vec<(u64, f32)> = (0..1 + i % 4)
            .map(|_| (r.random_range(0..10u64), r.random_range(0.5..1.5f32)))
            .collect();
        data.push((i % 2) as u32, feats);
    }
    let mut batch = Batch::empty(data.input());
    data.gather(&(0..12).collect::<Vec<_>>(), &mut batch);
    let mut net = Net::new(Cpu, spec.clone(), "s", Input::Sparse, 2).unwrap();
    let ids = SparseRows::ids_of(&batch);
    let dim = match spec {
        ModelSpec::WideDeep { dim, .. } => dim,
        ModelSpec::Mlp { .. } | ModelSpec::Counter { .. } => unreachable!(),
    };
    let mut rows = SparseRows {
        wide: random(ids.len(), &mut r, 0.5),
        emb: random(ids.len() * dim, &mut r, 0.5),
        ids,
    };
    let mut dense: Vec<(String, Vec<f32>)> = net
        .dense_tables()
        .iter()
        .map(|(n, len)| (n.clone(), random(*len, &mut r, 0.5)))
        .collect();
    for (n, v) in &dense {
        net.set_dense(n, v).unwrap();
    }
    check(&mut net, &batch, &mut dense, &mut rows);
}

#[test]
fn sparse_lr_gradients_match_finite_differences() {
    sparse_case("sparse-lr");
}

#[test]
fn wide_deep_gradients_match_finite_differences() {
    sparse_case("wide-deep:3:4");
}

#[test]
fn names_round_trip_and_mismatches_are_refused() {
    for n in [
        "softmax",
        "mlp:256,128",
        "sparse-lr",
        "wide-deep:8:64,32",
        "wide-deep:4",
        "counter:4096",
        "counter:16:20",
    ] {
        assert_eq!(ModelSpec::parse(n).unwrap().name(), n);
    }
    for bad in [
        "mlp:0",
        "cnn",
        "wide-deep",
        "mlp:12,x",
        "counter",
        "counter:0",
        "counter:16777217",
        "counter:8:x",
        "counter:8:60001",
    ] {
        assert!(ModelSpec::parse(bad).is_err(), "{bad}");
    }
    let mlp = ModelSpec::parse("mlp:8").unwrap();
    assert!(mlp.tables("j", Input::Sparse, 2, 0).is_err());
    let t = mlp.tables("j", Input::Dense { dim: 784 }, 10, 0).unwrap();
    let names: Vec<&str> = t.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["j/w0", "j/b0", "j/w1", "j/b1"]);
    let net = Net::new(Cpu, mlp, "j", Input::Dense { dim: 784 }, 10).unwrap();
    let lens: Vec<usize> = net.dense_tables().iter().map(|(_, l)| *l).collect();
    assert_eq!(lens, [784 * 8, 8, 8 * 10, 10]);
    let wd = ModelSpec::parse("wide-deep:4:6").unwrap();
    let t = wd.tables("c", Input::Sparse, 2, 0).unwrap();
    let names: Vec<&str> = t.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "c/wide",
            "c/wide_bias",
            "c/emb",
            "c/w0",
            "c/b0",
            "c/w1",
            "c/b1"
        ]
    );
}

#[test]
fn a_batch_of_the_wrong_shape_is_refused() {
    let mut net = Net::new(
        Cpu,
        ModelSpec::parse("softmax").unwrap(),
        "x",
        Input::Dense { dim: 6 },
        4,
    )
    .unwrap();
    let data = SyntheticDense::new(8, 5, 4, 3, 0);
    let mut batch = Batch::empty(data.input());
    data.gather(&[0, 1], &mut batch);
    assert!(net.step(&batch, 1.0, true, &mut Vec::new()).is_err());
    assert!(net.set_dense("x/w0", &[0.0; 3]).is_err());
    assert!(net.set_dense("x/w9", &[0.0; 3]).is_err());
}

#[test]
fn the_counter_pushes_minus_one_everywhere_into_an_sgd_table_at_rate_one() {
    let spec = ModelSpec::parse("counter:1000:0").unwrap();
    // Any data: the counter does not look at it.
    for input in [Input::Dense { dim: 6 }, Input::Sparse] {
        let t = spec.tables("d", input, 2, 0).unwrap();
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].name.as_str(), "d/count");
        assert_eq!(t[0].optimizer, ps_core::Optimizer::sgd(1.0));
        let shape = t[0].dense_shape().unwrap();
        assert_eq!((shape.len(), shape.num_chunks()), (1000, 8));
    }
    let mut net = Net::new(Cpu, spec, "d", Input::Dense { dim: 6 }, 4).unwrap();
    assert_eq!(net.dense_tables(), [("d/count".to_string(), 1000)]);
    net.set_dense("d/count", &[5.0; 1000]).unwrap();
    assert!(net.set_dense("d/count", &[5.0; 999]).is_err());
    let data = SyntheticDense::new(8, 6, 4, 3, 0);
    let mut batch = Batch::empty(data.input());
    data.gather(&[0, 1, 2], &mut batch);
    net.zero_grads().unwrap();
    let s = net.step(&batch, 0.001, true, &mut Vec::new()).unwrap();
    assert_eq!((s.loss, s.correct), (0.0, 0));
    let g = net.grads().unwrap();
    assert!(g.sparse.is_empty());
    assert_eq!(g.dense.len(), 1);
    assert_eq!(g.dense[0].0, "d/count");
    // Whatever the scale, one push adds exactly 1 to every value.
    assert!(g.dense[0].1.iter().all(|&v| v == -1.0));
}
