//! The benchmark as documented: its shards run as `ps-server` processes, and every dense case
//! reports goodput with the latency of its push+pull steps, taken as a push then a pull and
//! fused.

/// A run's stdout and its JSON lines, once it succeeded.
fn json_lines(out: &std::process::Output) -> (String, Vec<serde_json::Value>) {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect();
    (stdout, lines)
}

/// A dense case's line: at least 3 steps timed, some goodput, p50 within (0, p99].
fn assert_timed(l: &serde_json::Value) {
    assert!(l["rounds"].as_u64().unwrap() >= 3, "{l}");
    assert!(l["goodput_gbps"].as_f64().unwrap() > 0.0, "{l}");
    let (p50, p99) = (
        l["pair_p50_ms"].as_f64().unwrap(),
        l["pair_p99_ms"].as_f64().unwrap(),
    );
    assert!(p50 > 0.0 && p50 <= p99, "{l}");
}

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
    let (stdout, lines) = json_lines(&out);
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
        assert_timed(l);
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

/// ps-lite beside our cases in one run, as `scripts/pslite-bench.sh` runs it: the script builds
/// ps-lite (BytePS's source package from PyPI, Debian's ZeroMQ) and its side of the dense
/// cases; ps-bench starts its scheduler, servers and workers as processes, reports their
/// goodput and step latency, and gives each of our cases its ratio to ps-lite's.
#[test]
fn ps_bench_runs_pslite_beside_its_own_cases() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let build = std::process::Command::new("bash")
        .arg(root.join("scripts/pslite-bench.sh"))
        .arg("--build-only")
        .output()
        .unwrap();
    assert!(
        build.status.success(),
        "scripts/pslite-bench.sh --build-only: {}",
        String::from_utf8_lossy(&build.stderr)
    );
    let bins: Vec<std::path::PathBuf> = String::from_utf8_lossy(&build.stdout)
        .split_whitespace()
        .map(|p| root.join(p))
        .collect();
    assert_eq!(
        bins.len(),
        2,
        "the build as shipped and the one that sleeps when idle"
    );
    let mut cmd = std::process::Command::new(ps_launch::binary("ps-bench").unwrap());
    for b in &bins {
        cmd.arg("--pslite").arg(b);
    }
    let out = cmd
        .args([
            "--floats",
            "4096",
            "--layouts",
            "1x1,2x2",
            "--mode",
            "memory",
            "--no-sparse",
            "--steps",
            "pair",
            "--seconds",
            "0.3",
            "--warmup",
            "0.1",
        ])
        .output()
        .unwrap();
    let (stdout, lines) = json_lines(&out);
    for (shards, clients) in [(1, 1), (2, 2)] {
        let of_layout = |case: &str| -> Vec<&serde_json::Value> {
            lines
                .iter()
                .filter(|l| l["case"] == case && l["shards"] == shards && l["clients"] == clients)
                .collect()
        };
        let pslite = of_layout("pslite_dense");
        let names: Vec<&str> = pslite
            .iter()
            .map(|l| l["build"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["pslite-dense", "pslite-dense-idle"], "{stdout}");
        let mut best: f64 = 0.0;
        for l in &pslite {
            assert_timed(l);
            best = best.max(l["goodput_gbps"].as_f64().unwrap());
        }
        let ours = of_layout("dense_push_pull");
        assert_eq!(ours.len(), 1, "{stdout}");
        let ratio = ours[0]["ratio_pslite"].as_f64().expect("ratio_pslite");
        let expected = ours[0]["goodput_gbps"].as_f64().unwrap() / best;
        // Both sides are printed rounded to 3 decimals.
        assert!(
            (ratio - expected).abs() <= 0.02 * expected + 0.01,
            "{stdout}"
        );
    }
    // A program that does not exist is a clear error, before any case runs.
    let out = std::process::Command::new(ps_launch::binary("ps-bench").unwrap())
        .args([
            "--pslite",
            "/nonexistent/pslite-dense",
            "--floats",
            "1024",
            "--layouts",
            "1x1",
            "--mode",
            "memory",
            "--no-sparse",
            "--seconds",
            "0.1",
            "--warmup",
            "0.1",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--pslite /nonexistent/pslite-dense"),
        "{stderr}"
    );
}

/// `--only-apply` as documented: one line a round, each with the optimizer pass's cost with the
/// gradient's checksum in its own pass, in the optimizer's, and without one; nothing else runs.
#[test]
fn ps_bench_times_the_checksum_in_and_beside_the_optimizers_pass() {
    let out = std::process::Command::new(ps_launch::binary("ps-bench").unwrap())
        .args(["--only-apply", "--rounds", "2"])
        .output()
        .unwrap();
    let (stdout, lines) = json_lines(&out);
    assert_eq!(lines.len(), 2, "{stdout}");
    for (round, l) in lines.iter().enumerate() {
        assert_eq!(l["case"], "apply_checksum", "{stdout}");
        assert_eq!(l["round"].as_u64(), Some(round as u64), "{stdout}");
        for field in [
            "crc_own_pass_ms_per_gb",
            "crc_in_optimizer_pass_ms_per_gb",
            "no_crc_ms_per_gb",
        ] {
            let ms = l[field].as_f64().unwrap_or(0.0);
            assert!(ms > 0.0 && ms.is_finite(), "{field}: {stdout}");
        }
    }
}

/// The link emulator's benchmark as documented: a line per size, no transfer through the
/// emulated link ends sooner than its bytes would have crossed it, and a transfer does not
/// spend its time on a core.
#[test]
fn link_bench_times_transfers_against_the_link() {
    let out = std::process::Command::new(ps_launch::binary("link-bench").unwrap())
        .args([
            "--mbps",
            "1000",
            "--bytes",
            "3000",
            "--bytes",
            "60000",
            "--transfers",
            "50",
        ])
        .output()
        .unwrap();
    let (stdout, lines) = json_lines(&out);
    assert_eq!(lines.len(), 2, "{stdout}");
    for (l, bytes) in lines.iter().zip([3000, 60000]) {
        assert_eq!(l["bytes"].as_u64(), Some(bytes), "{l}");
        let link_us = l["link_us"].as_f64().unwrap();
        // 1 Gbit/s: 8 ns a byte.
        assert!((link_us - bytes as f64 * 0.008).abs() < 0.01, "{l}");
        assert!(l["shortest_us"].as_f64().unwrap() >= link_us, "{l}");
        assert!(
            l["tasks_per_transfer_us"].as_f64().unwrap() >= link_us,
            "{l}"
        );
        let (p50, p99) = (
            l["added_p50_us"].as_f64().unwrap(),
            l["added_p99_us"].as_f64().unwrap(),
        );
        assert!(p50 <= p99, "{l}");
        // The wait is a timer's, polled only at its very end: a 480 µs transfer does not hold
        // a core for its length (polling its last 2 ms, as the emulator once did, took all
        // 480 µs of it).
        let cpu_us = l["cpu_us"].as_f64().unwrap();
        assert!(cpu_us >= 0.0, "{l}");
        if bytes == 60000 {
            assert!(cpu_us < link_us * 0.75, "{l}");
        }
    }
}
