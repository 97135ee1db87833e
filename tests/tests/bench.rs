//! The benchmark as documented: its shards run as `ps-server` processes, and every dense case
//! reports goodput with the latency of its push+pull steps, taken as a push then a pull and
//! fused.

#[test]
fn ps_bench_runs_its_shards_as_processes_and_reports_pair_latency() {
    let out = std::process::Command::new(ps_launch::binary("ps-bench").unwrap())
        .args([
            "--floats",
            "1024",
            "--layouts",
            "1x1,2x2",
            "--mode",
            "durable",
            "--no-sparse",
            "--seconds",
            "0.2",
            "--warmup",
            "0.1",
            // A small push log, lapped within the warm-up (each durable case warms up until it
            // laps the log, or 20 s).
            "--dense-log-mib",
            "8",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect();
    let limit = lines
        .iter()
        .find(|l| l["case"] == "loopback_tcp")
        .and_then(|l| l["gbps"].as_f64())
        .expect("the raw stream's limit");
    assert!(limit > 0.0, "{stdout}");
    let dense: Vec<&serde_json::Value> = lines
        .iter()
        .filter(|l| l["case"] == "dense_push_pull")
        .collect();
    // Each layout's steps as a push then a pull, and fused (`push_pull_dense`).
    let layouts: Vec<(u64, u64, &str)> = dense
        .iter()
        .map(|l| {
            (
                l["shards"].as_u64().unwrap(),
                l["clients"].as_u64().unwrap(),
                l["step"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        layouts,
        [
            (1, 1, "pair"),
            (1, 1, "fused"),
            (2, 2, "pair"),
            (2, 2, "fused")
        ],
        "{stdout}"
    );
    for l in dense {
        assert_eq!(l["shards_in"], "processes", "{l}");
        assert_eq!(l["mode"], "durable", "{l}");
        assert!(l["rounds"].as_u64().unwrap() >= 3, "{l}");
        assert!(l["goodput_gbps"].as_f64().unwrap() > 0.0, "{l}");
        let (p50, p99) = (
            l["pair_p50_ms"].as_f64().unwrap(),
            l["pair_p99_ms"].as_f64().unwrap(),
        );
        assert!(p50 > 0.0 && p50 <= p99, "{l}");
    }
    // A step that is neither is refused before anything starts, as is a layout that is not
    // SHARDSxCLIENTS.
    for (args, refusal) in [
        (["--steps", "pair,both"], "neither `pair` nor `fused`"),
        (["--layouts", "2by2"], "not SHARDSxCLIENTS"),
    ] {
        let out = std::process::Command::new(ps_launch::binary("ps-bench").unwrap())
            .args(args)
            .arg("--no-sparse")
            .output()
            .unwrap();
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(refusal), "{stderr}");
    }
}
