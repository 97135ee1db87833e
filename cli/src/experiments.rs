//! The experiments runner behind `psctl experiments`: trains the same models under each codec
//! and consistency model, several seeds each, through real local clusters ([`crate::local`]),
//! and writes a report: per configuration the mean ± standard deviation of the final test
//! accuracy, the bytes pushed per step on the wire, the training time to a target accuracy,
//! plots of test accuracy against training time, and the project's targets checked against
//! the measured figures.
//!
//! Every run is a `psctl local` run whose flags the report prints, so any one of them can be
//! repeated by hand. Finished runs are kept (`<runs>/<suite>/<config>/seed<k>/final.json`, with
//! the flags they ran with in `flags.txt`; their shards' data is removed) and not run again
//! unless their flags changed or `--rerun` is given, so an interrupted runner picks up where it
//! stopped.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Parser;
use serde::{Deserialize, Serialize};

use crate::local::LocalArgs;
use ps_worker::run::{EvalRecord, FinalRecord, PALETTE, Panel, PhaseMs, Series, svg};

/// `psctl experiments`.
#[derive(Debug, Clone, clap::Args)]
pub struct ExperimentArgs {
    /// The suites to run, comma-separated: codecs (softmax), codecs-mlp, consistency,
    /// stragglers, links-100, links-1000, links-sparse-100, links-sparse-1000, links-ctr-100,
    /// links-ctr-1000, balance.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "codecs,codecs-mlp,consistency,stragglers,links-100,links-1000,links-sparse-100,links-sparse-1000,links-ctr-100,links-ctr-1000,balance"
    )]
    pub suites: Vec<String>,
    /// Seeds per configuration (1, 2, ...).
    #[arg(long, default_value_t = 3)]
    pub seeds: u64,
    /// Where the data set's files are, when not in their default place.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Where the runs' directories go.
    #[arg(long, default_value = "runs/experiments")]
    pub runs: PathBuf,
    /// Where the plots and results.json go.
    #[arg(long, default_value = "experiments")]
    pub out: PathBuf,
    /// The report (Markdown).
    #[arg(long, default_value = "EXPERIMENTS.md")]
    pub report: PathBuf,
    /// Multiply every suite's epochs by this (0.1 for a quick look; the report says so).
    #[arg(long, default_value_t = 1.0)]
    pub epochs_scale: f64,
    /// Run configurations again even when their results are already in `--runs`, or in
    /// `--out`'s results.json with the same flags.
    #[arg(long)]
    pub rerun: bool,
}

/// One configuration of a suite: a label and the `psctl local` flags that make it.
#[derive(Debug, Clone)]
struct Config {
    label: &'static str,
    flags: &'static str,
    /// Its epochs as a multiple of the suite's (a faster configuration given the time to go
    /// further, for a time-to-accuracy comparison).
    epochs_factor: f64,
}

/// A set of configurations trained alike and compared.
#[derive(Debug, Clone)]
struct Suite {
    name: &'static str,
    title: &'static str,
    /// What the suite shows and how it is set up.
    about: &'static str,
    /// Flags every configuration shares.
    base: &'static str,
    epochs: f64,
    /// Evaluations per epoch (for the curves and the time to the target).
    evals_per_epoch: f64,
    /// Training examples of the suite's data set (for the evaluation interval).
    train_examples: f64,
    /// Test accuracy the time-to-target column measures.
    target: f64,
    configs: Vec<Config>,
}

/// Wide & deep on the CTR-shaped set over a 100 Mbit/s and a 1 Gbit/s link.
const CTR_BASE_100: &str = "--dataset synthetic-ctr:200000:10000000:26:1 --model wide-deep:32:64 \
                            --optimizer adagrad --lr 0.05 --workers 2 --batch 256 --link-mbps 100";
const CTR_BASE_1000: &str = "--dataset synthetic-ctr:200000:10000000:26:1 --model wide-deep:32:64 \
                             --optimizer adagrad --lr 0.05 --workers 2 --batch 256 --link-mbps 1000";

/// The MLP, 2 workers, global batch 128: the codec suite's and the consistency suite's setting.
const MLP_BSP: &str = "--model mlp:256 --lr 0.05 --workers 2 --batch 128";

const SSP: &str = "SSP(3)";
const SSP_LAZY: &str = "SSP(3), refresh at the bound";
const TOPK_EF: &str = "top-k 1% + EF";
const TOPK_EF_MC: &str = "top-k 1% + EF + MC";
const TOPK_EF_MC_WARM: &str = "top-k 1% + EF + MC + warm-up";
const TOPK_MC_NO_EF: &str = "top-k 1% + MC, no EF";

/// Top-k 1% with error feedback (momentum on the shards), with momentum correction, with
/// momentum correction and a one-epoch sparsity warm-up, and with momentum correction but no
/// error feedback: the rows both codec suites compare with f32.
fn top_k_configs() -> [Config; 4] {
    [
        config(TOPK_EF, "--codec topk:0.01"),
        config(TOPK_EF_MC, "--codec topk:0.01 --momentum-correction"),
        config(
            TOPK_EF_MC_WARM,
            "--codec topk:0.01 --momentum-correction --sparsity-warmup 1",
        ),
        config(
            TOPK_MC_NO_EF,
            "--codec topk:0.01 --momentum-correction --no-error-feedback",
        ),
    ]
}

/// BSP, SSP(3) and SSP(3) refreshing at the bound: the rows both consistency suites compare.
fn bsp_and_ssp_configs() -> [Config; 3] {
    [
        config("BSP", "--consistency bsp"),
        config(SSP, "--consistency ssp --staleness 3"),
        config(
            SSP_LAZY,
            "--consistency ssp --staleness 3 --ssp-refresh bound",
        ),
    ]
}

const fn config(label: &'static str, flags: &'static str) -> Config {
    Config {
        label,
        flags,
        epochs_factor: 1.0,
    }
}

impl Config {
    /// The configuration run for `factor` times the suite's epochs.
    const fn longer(mut self, factor: f64) -> Self {
        self.epochs_factor = factor;
        self
    }
}

const F32_BOTH: &str = "f32 both ways";
/// f32 both ways again, with the same flags and seeds: what the time to a target does between
/// two runs of one configuration, against which the others' speed-ups are read.
const F32_AGAIN: &str = "f32 both ways, run again";
const FP16_BOTH: &str = "fp16 both ways";
const TOPK_FP16_PULL: &str = "top-k 1% push, fp16 pull";
const TOPK_DELTA_PULL: &str = "top-k 1% push, delta top-k 2% pull";
const TOPK_INT8_PULL: &str = "top-k 1% push, int8 pull";
const TOPK_INT8_HELD: &str = "top-k 1% push, int8 pull of changed rows";
const TOPK_INT4_HELD: &str = "top-k 1% push, int4 pull of changed rows";

/// The link suites' configurations: f32, fp16 both ways, top-k 1% pushes (with error feedback
/// and momentum correction) with fp16 pulls, and with delta top-k pulls. Top-k configurations
/// run more epochs (2x with fp16 pulls, 3x with delta pulls, whose steps are the fastest):
/// the comparison is the time to f32's accuracy, not the accuracy at the same epochs.
fn link_configs() -> Vec<Config> {
    vec![
        config(F32_BOTH, "--codec f32 --pull-codec f32"),
        config(FP16_BOTH, "--codec fp16 --pull-codec fp16"),
        config(
            TOPK_FP16_PULL,
            "--codec topk:0.01 --momentum-correction --pull-codec fp16",
        )
        .longer(2.0),
        config(
            TOPK_DELTA_PULL,
            "--codec topk:0.01 --momentum-correction --pull-codec delta-topk:0.02",
        )
        .longer(3.0),
    ]
}

/// Training examples of Fashion-MNIST, of the Adult table and of the CTR-shaped set.
const FASHION_MNIST_TRAIN: f64 = 60_000.0;
const ADULT_TRAIN: f64 = 32_561.0;
const CTR_TRAIN: f64 = 200_000.0;

/// The sparse model's link configurations: as [`link_configs`], with the shards' Adagrad (no
/// momentum to correct) and the same epochs for every row.
fn sparse_link_configs() -> Vec<Config> {
    vec![
        config(F32_BOTH, "--codec f32 --pull-codec f32"),
        config(F32_AGAIN, "--codec f32 --pull-codec f32"),
        config(FP16_BOTH, "--codec fp16 --pull-codec fp16"),
        config(TOPK_FP16_PULL, "--codec topk:0.01 --pull-codec fp16"),
        config(
            TOPK_DELTA_PULL,
            "--codec topk:0.01 --pull-codec delta-topk:0.02",
        ),
    ]
}

/// The sparse model's link suites: wide & deep on the Adult table.
fn sparse_link_suite(name: &'static str, title: &'static str, base: &'static str) -> Suite {
    Suite {
        name,
        title,
        about: "Wide & deep on the Adult table (a wide sparse table of dim 1, an embedding \
                table of dim 32 and a 32-64-1 MLP; 2 shards, 2 workers, BSP, global batch 128, \
                Adagrad lr 0.05), every worker's pushes and pulls over the emulated link. The \
                codecs apply to every table: top-k 1% sends the largest entries of each pushed \
                row (at least one), fp16 pulls round rows and dense tables alike, delta top-k \
                pulls the dense tables as the top 2% of their change (rows then come in fp16). \
                A step moves about 24 KB each way in f32 (pushes up, pulls down), so the link \
                is a small part of it; at 100 Mbit/s the bytes alone bound what a codec can \
                save: f32's 48 KB a step take 3.8 ms there, top-k pushes with fp16 pulls still \
                send about 15 KB (1.2 ms), at most 3.3x less even were the rest of a step free.",
        base,
        epochs: 3.0,
        // The model is near its final accuracy within a quarter epoch, and the configurations
        // reach it within a tenth of a second of each other: evaluations every 4 clocks
        // (about 0.02 s) measure when.
        evals_per_epoch: 64.0,
        train_examples: ADULT_TRAIN,
        target: 0.845,
        configs: sparse_link_configs(),
    }
}

/// The sparse model where the link matters: wide & deep on a CTR-shaped set whose batches
/// touch thousands of rows, with int8 and int4 row pulls beside the other link configurations;
/// evaluated `evals_per_epoch` times an epoch.
fn ctr_link_suite(
    name: &'static str,
    title: &'static str,
    base: &'static str,
    evals_per_epoch: f64,
) -> Suite {
    Suite {
        name,
        title,
        about: "Wide & deep on a synthetic CTR-shaped set (`synthetic-ctr:200000:10000000:26:1`: \
                200,000 examples of 26 categorical fields, ids drawn from a Zipf law (exponent \
                1.1) over 10 million, labels from a planted logistic model; the set's own seed \
                keeps it the same for every run, whose seeds change the initial values and the \
                order), a wide sparse \
                table of dim 1, an embedding table of dim 32 and a 32-64-1 MLP; 2 shards, 2 \
                workers, BSP, global batch 256, Adagrad lr 0.05; every worker's pushes and \
                pulls over the emulated link. A worker's step touches about 2,300 distinct rows \
                of each sparse table, so it moves hundreds of KB each way in f32, nearly all \
                of it rows and their ids. Top-k 1% sends the largest 1% of a request's values \
                and only the rows holding one of them, with their ids; fp16, int8 and int4 pulls round rows and dense \
                tables alike (int8: a byte a value and one f32 scale per row of 32; int4: half \
                a byte a value and the same scales); delta top-k pulls the \
                dense tables as the top 2% of their change and the rows in fp16. The ids \
                (64-bit hashes, sent as 8-byte words, once a pull for both tables, which \
                are placed alike, and once for every row pushed) are not compressed: a \
                step's pull requests carry about 18 KB of them up, more than the top-k \
                configurations push. Pulls of changed rows: each worker keeps the embedding rows it \
                pulled (`--held-rows-mib 64`) and sends a 64-bit digest of each one it holds \
                beside its id; the shards send only the rows whose values differ (with top-k \
                pushes, about half of a step's rows are unchanged since the worker last \
                pulled them; the wide table's rows of one value share their scales, so they all \
                come every time).",
        base,
        epochs: 1.0,
        evals_per_epoch,
        train_examples: CTR_TRAIN,
        // f32's accuracy after about two thirds of its epoch; it ends near 65.4%.
        target: 0.645,
        configs: vec![
            config(F32_BOTH, "--codec f32 --pull-codec f32"),
            config(FP16_BOTH, "--codec fp16 --pull-codec fp16"),
            config(TOPK_FP16_PULL, "--codec topk:0.01 --pull-codec fp16"),
            config(TOPK_INT8_PULL, "--codec topk:0.01 --pull-codec int8"),
            config(
                TOPK_INT8_HELD,
                "--codec topk:0.01 --pull-codec int8 --held-rows-mib 64",
            ),
            config(
                TOPK_INT4_HELD,
                "--codec topk:0.01 --pull-codec int4 --held-rows-mib 64",
            ),
            config(
                TOPK_DELTA_PULL,
                "--codec topk:0.01 --pull-codec delta-topk:0.02",
            ),
        ],
    }
}

/// The link suites: the MLP on Fashion-MNIST at 100 Mbit/s and 1 Gbit/s.
fn link_suite(name: &'static str, title: &'static str, base: &'static str) -> Suite {
    Suite {
        name,
        title,
        about: "The MLP of the codec suite (784-256-10, 2 shards, 2 workers, BSP, global batch \
                128, lr 0.05) with every worker's pushes and pulls over an emulated link (a \
                token bucket per direction on the client's transport: each request and answer \
                takes the time its bytes would at that speed). Pushes: f32, fp16, or top-k 1% \
                with error feedback and momentum correction (the workers apply the momentum, \
                the shards plain SGD). Pulls: f32, fp16, or delta top-k (each chunk as the top \
                2% of its change since the worker's last pull, fp16 values with their indices; \
                what is left out comes in later pulls). Top-k rows run more epochs (the second \
                table says how many): the comparison is the time to reach f32's final accuracy, \
                not the accuracy at equal epochs. Time is the evaluating worker's training time, evaluations left out; \
                the phases are its mean milliseconds per step.",
        base,
        epochs: 3.0,
        evals_per_epoch: 4.0,
        train_examples: FASHION_MNIST_TRAIN,
        target: 0.85,
        configs: link_configs(),
    }
}

fn suites() -> Vec<Suite> {
    vec![
        Suite {
            name: "codecs",
            title: "Gradient codecs, softmax regression",
            about: "Softmax regression on Fashion-MNIST, 2 shards, 2 workers, BSP, global batch 128, \
                    momentum SGD (0.9, lr 0.02) on the shards. Every table's pushes use the codec; \
                    lz4 goes on top where it saves at least 10%. Top-k sends 1% of each gradient \
                    (fp16 values with their indices). EF: error feedback. MC: momentum \
                    correction, the momentum applied by the workers before the codec and plain \
                    SGD on the shards. Warm-up: the pushed share falls from 25% to 1% over the \
                    first epoch. The step size decays to 0 on a cosine over the run (the \
                    workers scale their gradients): at a constant rate top-k keeps the model \
                    bouncing by a few points from one evaluation to the next.",
            base: "--model softmax --lr 0.02 --lr-schedule cosine --workers 2 --batch 128",
            epochs: 10.0,
            evals_per_epoch: 2.0,
            train_examples: FASHION_MNIST_TRAIN,
            target: 0.82,
            configs: vec![
                config("f32", "--codec f32"),
                config("fp16", "--codec fp16"),
                config("bf16", "--codec bf16"),
                config("int8", "--codec int8"),
                config("sign", "--codec sign"),
                config("qsgd", "--codec qsgd"),
            ]
            .into_iter()
            .chain(top_k_configs())
            .collect(),
        },
        Suite {
            name: "codecs-mlp",
            title: "Gradient codecs, MLP",
            about: "An MLP (784-256-10, ReLU) on Fashion-MNIST, 2 shards, 2 workers, BSP, global \
                    batch 128, momentum SGD (lr 0.05).",
            base: MLP_BSP,
            epochs: 10.0,
            evals_per_epoch: 1.0,
            train_examples: FASHION_MNIST_TRAIN,
            target: 0.87,
            configs: vec![config("f32", "--codec f32")]
                .into_iter()
                .chain(top_k_configs())
                .collect(),
        },
        Suite {
            name: "consistency",
            title: "Consistency models, MLP",
            about: "The MLP of the codec suite (f32) under each consistency model, with no \
                    emulated stragglers: what staleness costs in accuracy at the same epochs. \
                    SSP(3) pulls the model at every clock (eager SSP: the bound limits how far \
                    ahead of the slowest worker a worker may run); with `--ssp-refresh bound` \
                    a worker refreshes its copy only when the bound requires it (the SSP cache \
                    rule) and applies its own pushes to the copy with the table's optimizer in \
                    between.",
            base: MLP_BSP,
            epochs: 5.0,
            evals_per_epoch: 1.0,
            train_examples: FASHION_MNIST_TRAIN,
            target: 0.86,
            configs: bsp_and_ssp_configs()
                .into_iter()
                .chain([config("ASP", "--consistency asp")])
                .collect(),
        },
        Suite {
            name: "stragglers",
            title: "Transient stragglers: BSP against SSP(3)",
            about: "The MLP with 4 workers (global batch 256, 64 each), 2 shards. Every step of \
                    every worker (pulls, compute and push) takes 4x longer with probability 0.1, \
                    emulated by sleeping so the other processes keep the CPU. Time is the \
                    evaluating worker's training time from its first clock, evaluations left out.",
            base: "--model mlp:256 --lr 0.05 --workers 4 --batch 256 --straggler-prob 0.1 --straggler-factor 4",
            epochs: 3.0,
            evals_per_epoch: 8.0,
            train_examples: FASHION_MNIST_TRAIN,
            target: 0.84,
            configs: bsp_and_ssp_configs().into(),
        },
        link_suite(
            "links-100",
            "Time to accuracy over a 100 Mbit/s link, MLP",
            "--model mlp:256 --lr 0.05 --workers 2 --batch 128 --link-mbps 100",
        ),
        link_suite(
            "links-1000",
            "Time to accuracy over a 1 Gbit/s link, MLP",
            "--model mlp:256 --lr 0.05 --workers 2 --batch 128 --link-mbps 1000",
        ),
        sparse_link_suite(
            "links-sparse-100",
            "Time to accuracy over a 100 Mbit/s link, wide & deep",
            "--dataset adult --model wide-deep:32:64 --optimizer adagrad --lr 0.05 --workers 2 \
             --batch 128 --link-mbps 100",
        ),
        sparse_link_suite(
            "links-sparse-1000",
            "Time to accuracy over a 1 Gbit/s link, wide & deep",
            "--dataset adult --model wide-deep:32:64 --optimizer adagrad --lr 0.05 --workers 2 \
             --batch 128 --link-mbps 1000",
        ),
        ctr_link_suite(
            "links-ctr-100",
            "Time to accuracy over a 100 Mbit/s link, wide & deep on CTR-shaped data",
            CTR_BASE_100,
            8.0,
        ),
        ctr_link_suite(
            "links-ctr-1000",
            "Time to accuracy over a 1 Gbit/s link, wide & deep on CTR-shaped data",
            CTR_BASE_1000,
            // The configurations reach the target within a few seconds of each other here:
            // an evaluation every half second tells them apart.
            32.0,
        ),
        Suite {
            name: "balance",
            title: "A persistently slow worker: BSP with and without balanced batches",
            about: "The MLP with 2 workers and a large global batch (4096, so that compute, not \
                    the loopback transfers, sets the step time), 2 shards, BSP, momentum SGD \
                    (lr 0.1). The second worker computes 2x slower (its compute is stretched by \
                    sleeping; its network is not slower). With --balance the scheduler sizes \
                    each worker's batch in proportion to its measured throughput; the global \
                    batch, and so the update of each clock, stays the same.",
            base: "--model mlp:256 --lr 0.1 --workers 2 --batch 4096 --slow-worker 2",
            epochs: 15.0,
            evals_per_epoch: 1.5,
            train_examples: FASHION_MNIST_TRAIN,
            target: 0.83,
            configs: vec![config("BSP", ""), config("BSP + balance", "--balance")],
        },
    ]
}

/// The outcome of one run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunResult {
    pub suite: String,
    pub config: String,
    pub seed: u64,
    /// The `psctl local` flags of the run.
    pub flags: Vec<String>,
    pub test_accuracy: f64,
    pub auc: Option<f64>,
    pub wire_bytes_per_step: f64,
    pub raw_bytes_per_step: f64,
    /// What the evaluating worker's steps pulled per clock, on the wire and as f32.
    #[serde(default)]
    pub pull_wire_bytes_per_step: f64,
    #[serde(default)]
    pub pull_raw_bytes_per_step: f64,
    /// What the evaluating worker's pull requests sent up per clock (ids, held rows'
    /// digests); `None` in results from before it was measured.
    #[serde(default)]
    pub pull_request_bytes_per_step: Option<f64>,
    /// The evaluating worker's mean milliseconds per step, by phase.
    #[serde(default)]
    pub phase_ms_per_step: PhaseMs,
    /// The evaluating worker's training time (evaluations left out), and the time at its
    /// first evaluation at or above the suite's target.
    pub train_s: f64,
    pub time_to_target_s: Option<f64>,
    /// (training seconds, test accuracy) at each evaluation.
    pub curve: Vec<(f64, f64)>,
    /// When the run ended (seconds since the Unix epoch) and the machine it ran on (processor
    /// model and cores): the report says which day and machine each section's figures come
    /// from. `None` in results from before they were recorded.
    #[serde(default)]
    pub finished_unix_s: Option<u64>,
    #[serde(default)]
    pub host: Option<String>,
}

#[derive(Parser)]
struct LocalCli {
    #[command(flatten)]
    local: LocalArgs,
}

/// Runs the suites and writes the plots, results.json and the report.
pub async fn run(a: &ExperimentArgs) -> anyhow::Result<()> {
    let all = suites();
    for name in &a.suites {
        if !all.iter().any(|s| s.name == name) {
            anyhow::bail!(
                "unknown suite `{name}`; known: {}",
                all.iter().map(|s| s.name).collect::<Vec<_>>().join(", ")
            );
        }
    }
    let chosen: Vec<Suite> = all
        .into_iter()
        .filter(|s| a.suites.iter().any(|n| n == s.name))
        .collect();
    let total: usize = chosen.iter().map(|s| s.configs.len()).sum::<usize>() * a.seeds as usize;
    // The last report's results stand in for runs whose flags have not changed, so a checkout
    // regenerates the report without training again what it already measured.
    let stored_results: Vec<RunResult> = std::fs::read(a.out.join("results.json"))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    let previous: &[RunResult] = if a.rerun { &[] } else { &stored_results };
    let mut results = Vec::new();
    let mut done = 0;
    for suite in &chosen {
        // Seed by seed, each seed's configurations one after another: a drift in the machine's
        // speed over a suite (on a shared VM, 10-20% within minutes) then falls on every
        // configuration alike instead of on whichever ran last.
        for seed in 1..=a.seeds {
            for c in &suite.configs {
                done += 1;
                eprintln!(
                    "[{done}/{total}] {} / {} / seed {seed}",
                    suite.name, c.label
                );
                let r = run_one(a, suite, c, seed, previous).await?;
                eprintln!(
                    "    test accuracy {:.2}%, {:.0} B pushed per step, trained {:.1} s, target {} in {}",
                    r.test_accuracy * 100.0,
                    r.wire_bytes_per_step,
                    r.train_s,
                    pct(suite.target),
                    r.time_to_target_s
                        .map_or_else(|| "not reached".into(), |t| format!("{t:.1} s"))
                );
                results.push(r);
            }
        }
        // Seeds past this run's, stored by an earlier run with more seeds and today's flags,
        // stay in the report (regenerating it does not drop them).
        results.extend(stored_with_todays_flags(a, suite, previous, a.seeds));
    }
    // The suites not run this time keep their stored results (those with today's flags), so
    // that running some suites updates the report instead of shrinking it.
    let mut reported = Vec::new();
    for suite in suites() {
        let run_now = chosen.iter().any(|s| s.name == suite.name);
        let kept: Vec<RunResult> = if run_now {
            Vec::new()
        } else {
            stored_with_todays_flags(a, &suite, &stored_results, 0)
        };
        if run_now || !kept.is_empty() {
            results.extend(kept);
            reported.push(suite);
        }
    }
    std::fs::create_dir_all(&a.out)?;
    std::fs::write(
        a.out.join("results.json"),
        serde_json::to_string_pretty(&results)?,
    )?;
    for suite in &chosen {
        std::fs::write(plot_path(&a.out, suite.name), plot(suite, &results))?;
    }
    let report = report(a, &reported, &results);
    std::fs::write(&a.report, &report)
        .with_context(|| format!("writing {}", a.report.display()))?;
    crate::outln!("{report}");
    eprintln!(
        "wrote {}, {}/results.json and the plots in {}",
        a.report.display(),
        a.out.display(),
        a.out.display()
    );
    Ok(())
}

fn slug(label: &str) -> String {
    label
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect::<String>()
        .split('-')
        .filter(|p| !p.is_empty())
        .collect::<Vec<_>>()
        .join("-")
}

async fn run_one(
    a: &ExperimentArgs,
    suite: &Suite,
    c: &Config,
    seed: u64,
    previous: &[RunResult],
) -> anyhow::Result<RunResult> {
    let dir = a
        .runs
        .join(suite.name)
        .join(slug(c.label))
        .join(format!("seed{seed}"));
    let flags = run_flags(a, suite, c, seed);
    let fin = dir.join("final.json");
    // A finished run directory stands for this run only if it ran with these flags (the
    // file is written once the run has finished).
    let flags_file = dir.join("flags.txt");
    let finished = fin.exists()
        && std::fs::read_to_string(&flags_file).is_ok_and(|f| f.trim() == flags.join(" "));
    if !a.rerun
        && !finished
        && let Some(r) = stored(previous, suite, c, seed, &flags)
    {
        return Ok(r.clone());
    }
    if a.rerun || !finished {
        if dir.exists() {
            std::fs::remove_dir_all(&dir).with_context(|| format!("clearing {}", dir.display()))?;
        }
        let mut argv = vec!["local".to_owned()];
        argv.extend(flags.iter().cloned());
        argv.extend([
            "--quiet".into(),
            "--run-dir".into(),
            dir.display().to_string(),
        ]);
        if let Some(d) = &a.data {
            argv.extend(["--data".into(), d.display().to_string()]);
        }
        let cli = LocalCli::try_parse_from(&argv)
            .with_context(|| format!("the flags of {} / {}", suite.name, c.label))?;
        crate::local::run(&cli.local)
            .await
            .with_context(|| format!("{} / {} / seed {seed}", suite.name, c.label))?;
        std::fs::write(&flags_file, flags.join(" "))
            .with_context(|| format!("writing {}", flags_file.display()))?;
        let host_file = dir.join(HOST_FILE);
        std::fs::write(&host_file, host())
            .with_context(|| format!("writing {}", host_file.display()))?;
    }
    // A run directory kept from before says when it ended by its final record's time, and
    // where it ran if it was made since that was written down.
    let finished_unix_s = std::fs::metadata(&fin)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_secs());
    let host = std::fs::read_to_string(dir.join(HOST_FILE))
        .ok()
        .map(|h| h.trim().to_owned());
    let fin: FinalRecord = serde_json::from_slice(
        &std::fs::read(&fin).with_context(|| format!("reading {}", fin.display()))?,
    )?;
    let evals: Vec<EvalRecord> = std::fs::read_to_string(dir.join("eval.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    Ok(RunResult {
        suite: suite.name.into(),
        config: c.label.into(),
        seed,
        flags,
        test_accuracy: fin.eval.test_accuracy,
        auc: fin.eval.auc,
        wire_bytes_per_step: fin.wire_bytes_per_step,
        raw_bytes_per_step: fin.raw_bytes_per_step,
        pull_wire_bytes_per_step: fin.pull_wire_bytes_per_step,
        pull_raw_bytes_per_step: fin.pull_raw_bytes_per_step,
        pull_request_bytes_per_step: Some(fin.pull_request_bytes_per_step),
        phase_ms_per_step: fin.phase_ms_per_step,
        train_s: fin.eval.train_s,
        time_to_target_s: evals
            .iter()
            .find(|e| e.test_accuracy >= suite.target)
            .map(|e| e.train_s),
        curve: evals.iter().map(|e| (e.train_s, e.test_accuracy)).collect(),
        finished_unix_s,
        host,
    })
}

/// The file in a run's directory that names the machine it ran on.
const HOST_FILE: &str = "host.txt";

/// This machine as a report names it: the processor's model (Linux's /proc/cpuinfo) and the
/// cores this process may use.
fn host() -> String {
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, m)| m.trim().to_owned())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_owned());
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    format!("{model}, {cores} cores")
}

/// `unix_s` as a UTC date and time, `2026-12-03 05:06`.
fn utc(unix_s: u64) -> String {
    // Days since 1970-01-01 to a civil date (the proleptic Gregorian calendar, in 400-year
    // eras of 146,097 days that begin on 1 March).
    let (days, secs) = (unix_s / 86_400, unix_s % 86_400);
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    format!(
        "{year}-{month:02}-{day:02} {:02}:{:02}",
        secs / 3600,
        secs % 3600 / 60
    )
}

/// Where a section's figures come from: the span of its runs' end times and the machines
/// they ran on, and how many runs predate that record.
fn provenance(suite: &Suite, results: &[RunResult]) -> Option<String> {
    let runs: Vec<&RunResult> = results
        .iter()
        .filter(|r| r.suite == suite.name && suite.configs.iter().any(|c| c.label == r.config))
        .collect();
    let times: Vec<u64> = runs.iter().filter_map(|r| r.finished_unix_s).collect();
    let (first, last) = (*times.iter().min()?, *times.iter().max()?);
    let mut hosts: Vec<&str> = runs.iter().filter_map(|r| r.host.as_deref()).collect();
    hosts.sort_unstable();
    hosts.dedup();
    let mut line = format!("Runs ended {} to {} UTC", utc(first), utc(last));
    // Run directories made before their machine was written down name none.
    if !hosts.is_empty() {
        line.push_str(&format!(", on {}", hosts.join("; ")));
    }
    line.push('.');
    let older = runs.len() - times.len();
    if older > 0 {
        line.push_str(&format!(
            " {older} of the {} runs are older and unrecorded.",
            runs.len()
        ));
    }
    Some(line)
}

/// The `psctl local` flags of one run.
fn run_flags(a: &ExperimentArgs, suite: &Suite, c: &Config, seed: u64) -> Vec<String> {
    let epochs = suite.epochs * c.epochs_factor * a.epochs_scale;
    let batch: f64 = flag(suite.base, "--batch").unwrap_or(128.0);
    let eval_every = (suite.train_examples / batch / suite.evals_per_epoch)
        .round()
        .max(1.0);
    let mut flags: Vec<String> = suite
        .base
        .split_whitespace()
        .chain(c.flags.split_whitespace())
        .map(str::to_owned)
        .collect();
    flags.extend([
        "--name".into(),
        format!("{}-{}", suite.name, slug(c.label)),
        "--epochs".into(),
        epochs.to_string(),
        "--seed".into(),
        seed.to_string(),
        "--eval-every".into(),
        eval_every.to_string(),
    ]);
    flags
}

/// The stored results of `suite`'s runs with seeds above `after` whose flags are today's.
fn stored_with_todays_flags(
    a: &ExperimentArgs,
    suite: &Suite,
    results: &[RunResult],
    after: u64,
) -> Vec<RunResult> {
    results
        .iter()
        .filter(|r| {
            r.suite == suite.name
                && r.seed > after
                && suite
                    .configs
                    .iter()
                    .any(|c| r.config == c.label && r.flags == run_flags(a, suite, c, r.seed))
        })
        .cloned()
        .collect()
}

/// The stored result of a run with these flags, if there is one.
fn stored<'r>(
    results: &'r [RunResult],
    suite: &Suite,
    c: &Config,
    seed: u64,
    flags: &[String],
) -> Option<&'r RunResult> {
    results.iter().find(|r| {
        r.suite == suite.name && r.config == c.label && r.seed == seed && r.flags == flags
    })
}

/// The value after `name` in `flags`.
fn flag(flags: &str, name: &str) -> Option<f64> {
    let mut words = flags.split_whitespace();
    words.position(|f| f == name)?;
    words.next()?.parse().ok()
}

/// Mean and sample standard deviation.
fn mean_std(xs: &[f64]) -> (f64, f64) {
    let n = xs.len() as f64;
    if xs.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    let mean = xs.iter().sum::<f64>() / n;
    let var = if xs.len() > 1 {
        xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)
    } else {
        0.0
    };
    (mean, var.sqrt())
}

fn pct(x: f64) -> String {
    format!("{:.1}%", x * 100.0)
}

/// A configuration's runs summed up.
#[derive(Debug, Clone)]
struct Row {
    label: &'static str,
    runs: usize,
    acc: (f64, f64),
    wire: f64,
    raw: f64,
    /// Mean ± std over the seeds that reached the target, and how many did.
    ttt: (f64, f64),
    reached: usize,
    train_s: f64,
    pull_wire: f64,
    pull_raw: f64,
    /// Pull requests' bytes per step, where the runs measured them.
    asked: Option<f64>,
    phases: PhaseMs,
}

fn rows(suite: &Suite, results: &[RunResult]) -> Vec<Row> {
    suite
        .configs
        .iter()
        .map(|c| {
            let runs: Vec<&RunResult> = results
                .iter()
                .filter(|r| r.suite == suite.name && r.config == c.label)
                .collect();
            let col = |f: fn(&RunResult) -> f64| runs.iter().map(|r| f(r)).collect::<Vec<_>>();
            let ttt: Vec<f64> = runs.iter().filter_map(|r| r.time_to_target_s).collect();
            let phase = |f: fn(&PhaseMs) -> f64| mean_std(&col_phase(&runs, f)).0;
            Row {
                label: c.label,
                runs: runs.len(),
                acc: mean_std(&col(|r| r.test_accuracy)),
                wire: mean_std(&col(|r| r.wire_bytes_per_step)).0,
                raw: mean_std(&col(|r| r.raw_bytes_per_step)).0,
                ttt: mean_std(&ttt),
                reached: ttt.len(),
                train_s: mean_std(&col(|r| r.train_s)).0,
                pull_wire: mean_std(&col(|r| r.pull_wire_bytes_per_step)).0,
                pull_raw: mean_std(&col(|r| r.pull_raw_bytes_per_step)).0,
                asked: {
                    let asked: Vec<f64> = runs
                        .iter()
                        .filter_map(|r| r.pull_request_bytes_per_step)
                        .collect();
                    (!asked.is_empty()).then(|| mean_std(&asked).0)
                },
                phases: PhaseMs {
                    pull: phase(|p| p.pull),
                    data: phase(|p| p.data),
                    compute: phase(|p| p.compute),
                    encode: phase(|p| p.encode),
                    push: phase(|p| p.push),
                    wait: phase(|p| p.wait),
                },
            }
        })
        .collect()
}

fn col_phase(runs: &[&RunResult], f: fn(&PhaseMs) -> f64) -> Vec<f64> {
    runs.iter().map(|r| f(&r.phase_ms_per_step)).collect()
}

/// Whether a suite compares time to accuracy over an emulated link.
fn is_link_suite(suite: &Suite) -> bool {
    suite.name.starts_with("links-")
}

/// The time each configuration's runs took to reach `bar` test accuracy: mean over the seeds
/// that reached it, and how many did.
fn time_to(suite: &Suite, label: &str, results: &[RunResult], bar: f64) -> (f64, usize, usize) {
    let runs: Vec<&RunResult> = results
        .iter()
        .filter(|r| r.suite == suite.name && r.config == label)
        .collect();
    let times: Vec<f64> = runs
        .iter()
        .filter_map(|r| r.curve.iter().find(|&&(_, a)| a >= bar).map(|&(t, _)| t))
        .collect();
    (mean_std(&times).0, times.len(), runs.len())
}

/// Seed by seed, how much sooner `label`'s run reached `bar` than f32's run of the same seed
/// (same initial values, same order of examples): the geometric mean of those ratios and its
/// 95% interval (Student's t over the logs; none from one seed), over the seeds both reached.
fn paired_speedup(suite: &Suite, label: &str, results: &[RunResult], bar: f64) -> Option<Paired> {
    let reached = |config: &str| -> HashMap<u64, f64> {
        results
            .iter()
            .filter(|r| r.suite == suite.name && r.config == config)
            .filter_map(|r| {
                let t = r.curve.iter().find(|&&(_, a)| a >= bar)?.0;
                Some((r.seed, t))
            })
            .collect()
    };
    let (base, other) = (reached(F32_BOTH), reached(label));
    let logs: Vec<f64> = other
        .iter()
        .filter_map(|(seed, t)| Some((base.get(seed)? / t).ln()))
        .filter(|l| l.is_finite())
        .collect();
    if logs.is_empty() {
        return None;
    }
    let (mean, sd) = mean_std(&logs);
    let half = (logs.len() > 1).then(|| t_975(logs.len() - 1) * sd / (logs.len() as f64).sqrt());
    Some(Paired {
        ratio: mean.exp(),
        interval: half.map(|h| ((mean - h).exp(), (mean + h).exp())),
        seeds: logs.len(),
    })
}

/// [`paired_speedup`]'s answer.
struct Paired {
    ratio: f64,
    interval: Option<(f64, f64)>,
    seeds: usize,
}

impl Paired {
    fn describe(&self) -> String {
        match self.interval {
            Some((lo, hi)) => format!(
                "paired by seed {:.2}x, 95% interval {lo:.2}-{hi:.2}x over {} seeds",
                self.ratio, self.seeds
            ),
            None => format!("paired by seed {:.2}x over 1 seed", self.ratio),
        }
    }
}

/// Student's t at 97.5% for `df` degrees of freedom (1.96 past 30).
fn t_975(df: usize) -> f64 {
    const T: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
        2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
        2.052, 2.048, 2.045, 2.042,
    ];
    T.get(df.wrapping_sub(1)).copied().unwrap_or(1.96)
}

/// A link suite's bar: f32's mean final accuracy less half a point.
fn link_bar(rows: &[Row]) -> Option<f64> {
    rows.iter()
        .find(|r| r.label == F32_BOTH && r.runs > 0)
        .map(|f| f.acc.0 - 0.005)
}

/// The link suites' second table: bytes each way, the time to f32's accuracy and the speed-up,
/// and where a step's time goes.
fn link_table(
    md: &mut String,
    epochs_scale: f64,
    suite: &Suite,
    rows: &[Row],
    results: &[RunResult],
) {
    let Some(bar) = link_bar(rows) else {
        return;
    };
    let (f32_time, ..) = time_to(suite, F32_BOTH, results, bar);
    let _ = writeln!(
        md,
        "\nTime to f32's final accuracy less half a point ({}), the bytes of a step (pushed: \
         the pushes up; pulled: the answers down, f32 beside them; pull requests: the ids and \
         digests asked for, up), and where a step's time goes \
         (mean ms per step of the evaluating worker):\n",
        pct(bar)
    );
    let _ = writeln!(
        md,
        "| configuration | epochs | pushed / step | pulled / step | pull requests / step | time to {} | speed-up over f32 | pull | compute | encode | push | wait |",
        pct(bar)
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (r, c) in rows.iter().zip(&suite.configs) {
        let (t, reached, runs) = time_to(suite, c.label, results, bar);
        let (time, speedup) = if reached == 0 {
            ("not reached".to_owned(), "-".to_owned())
        } else {
            let of = if reached < runs {
                format!(" ({reached}/{runs} reached)")
            } else {
                String::new()
            };
            (format!("{t:.1} s{of}"), format!("{:.2}x", f32_time / t))
        };
        let p = &r.phases;
        let asked = r
            .asked
            .map_or_else(|| "not measured".to_owned(), |a| format!("{a:.0} B"));
        let _ = writeln!(
            md,
            "| {} | {} | {:.0} B | {:.0} B ({:.0}) | {asked} | {time} | {speedup} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |",
            r.label,
            suite.epochs * c.epochs_factor * epochs_scale,
            r.wire,
            r.pull_wire,
            r.pull_raw,
            p.pull,
            p.compute,
            p.encode,
            p.push,
            p.wait,
        );
    }
}

/// Test accuracy against training time, the first seed of every configuration.
fn plot(suite: &Suite, results: &[RunResult]) -> String {
    let series = suite
        .configs
        .iter()
        .zip(PALETTE.iter().cycle())
        .filter_map(|(c, colour)| {
            let r = results
                .iter()
                .find(|r| r.suite == suite.name && r.config == c.label)?;
            Some(Series {
                name: c.label.into(),
                colour,
                points: r.curve.iter().map(|&(t, a)| (t, a * 100.0)).collect(),
            })
        })
        .collect();
    svg(&[Panel {
        title: format!("{}: test accuracy (%)", suite.name),
        x_label: "training seconds (evaluating worker)",
        series,
    }])
}

/// A check of a target against the figures: what it asks, what was measured, met or not.
struct Check {
    target: String,
    measured: String,
    met: bool,
}

fn checks(suite: &Suite, rows: &[Row], results: &[RunResult]) -> Vec<Check> {
    let find = |l: &str| rows.iter().find(|r| r.label == l && r.runs > 0);
    let mut out = Vec::new();
    match suite.name {
        _ if is_link_suite(suite) => {
            let Some(bar) = link_bar(rows) else {
                return out;
            };
            let (f32_time, f32_reached, f32_runs) = time_to(suite, F32_BOTH, results, bar);
            // At 100 Mbit/s top-k with compressed pulls must reach the bar 5x sooner; at
            // 1 Gbit/s no configuration may be slower than f32: its mean ratio at least 1x, or,
            // where the suite runs f32 twice, no slower than f32's own run-to-run scatter lets
            // tell apart (its paired 95% interval reaches 1x).
            let slow_link = flag(suite.base, "--link-mbps") == Some(100.0);
            let again = (!slow_link)
                .then(|| paired_speedup(suite, F32_AGAIN, results, bar))
                .flatten();
            let (wanted, labels): (f64, &[&str]) = if slow_link {
                (
                    5.0,
                    &[
                        TOPK_FP16_PULL,
                        TOPK_INT8_PULL,
                        TOPK_INT8_HELD,
                        TOPK_INT4_HELD,
                        TOPK_DELTA_PULL,
                    ],
                )
            } else {
                (
                    1.0,
                    &[
                        FP16_BOTH,
                        TOPK_FP16_PULL,
                        TOPK_INT8_PULL,
                        TOPK_INT8_HELD,
                        TOPK_INT4_HELD,
                        TOPK_DELTA_PULL,
                    ],
                )
            };
            for &label in labels {
                let (t, reached, runs) = time_to(suite, label, results, bar);
                if runs == 0 {
                    continue;
                }
                let all = reached == runs && f32_reached == f32_runs;
                let paired = paired_speedup(suite, label, results, bar);
                let within_scatter = again.is_some()
                    && paired
                        .as_ref()
                        .and_then(|p| p.interval)
                        .is_some_and(|(_, hi)| hi >= 1.0);
                out.push(Check {
                    target: if again.is_some() {
                        format!(
                            "{label} reaches f32's final accuracy less 0.5 points ({}) no later \
                             than f32 (mean ≥ 1x, or a paired 95% interval that reaches 1x)",
                            pct(bar)
                        )
                    } else {
                        format!(
                            "{label} reaches f32's final accuracy less 0.5 points ({}) ≥ \
                             {wanted}x as soon",
                            pct(bar)
                        )
                    },
                    measured: if reached == 0 {
                        format!("not reached ({runs} runs)")
                    } else {
                        let paired = paired
                            .as_ref()
                            .map(|p| format!("; {}", p.describe()))
                            .unwrap_or_default();
                        let again = again
                            .as_ref()
                            .map(|p| format!("; f32 run again: {}", p.describe()))
                            .unwrap_or_default();
                        format!(
                            "{:.2}x ({t:.1} s against {f32_time:.1} s; {reached}/{runs} and \
                             {f32_reached}/{f32_runs} runs reached it{paired}{again})",
                            f32_time / t
                        )
                    },
                    met: all && (f32_time / t >= wanted || within_scatter),
                });
            }
        }
        "codecs" | "codecs-mlp" => {
            let limit = if suite.name == "codecs" { 0.5 } else { 1.0 };
            let Some(f) = find("f32") else {
                return out;
            };
            for label in [TOPK_EF, TOPK_EF_MC, TOPK_EF_MC_WARM] {
                if let Some(ef) = find(label) {
                    let gap = (f.acc.0 - ef.acc.0) * 100.0;
                    out.push(Check {
                        target: format!("{label} within {limit} points of f32"),
                        measured: format!("{gap:+.2} points"),
                        met: gap <= limit,
                    });
                }
            }
            for label in [TOPK_EF, TOPK_EF_MC, TOPK_EF_MC_WARM] {
                if let Some(ef) = find(label) {
                    let ratio = f.wire / ef.wire;
                    out.push(Check {
                        target: format!("{label} pushes ≥ 50x fewer bytes than f32"),
                        measured: format!(
                            "{ratio:.1}x ({:.0} B against {:.0} B per step)",
                            ef.wire, f.wire
                        ),
                        met: ratio >= 50.0,
                    });
                }
            }
            if let (Some(ef), Some(no)) = (find(TOPK_EF_MC), find(TOPK_MC_NO_EF)) {
                let gap = (f.acc.0 - ef.acc.0) * 100.0;
                let gap_no = (f.acc.0 - no.acc.0) * 100.0;
                out.push(Check {
                    target: "top-k without EF shows a larger gap".into(),
                    measured: format!("{gap_no:+.2} points against {gap:+.2}"),
                    met: gap_no > gap,
                });
            }
        }
        "consistency" | "stragglers" => {
            let Some(b) = find("BSP") else {
                return out;
            };
            for label in [SSP, SSP_LAZY] {
                let Some(s) = find(label) else {
                    continue;
                };
                let gap = (b.acc.0 - s.acc.0) * 100.0;
                out.push(Check {
                    target: format!("{label} within 0.3 points of BSP"),
                    measured: format!("{gap:+.2} points"),
                    met: gap <= 0.3,
                });
                if suite.name == "stragglers" {
                    let ratio = b.ttt.0 / s.ttt.0;
                    out.push(Check {
                        target: format!(
                            "{label} reaches {} ≥ 1.25x sooner than BSP",
                            pct(suite.target)
                        ),
                        measured: ratio_text(ratio, s, b),
                        met: ratio >= 1.25 && b.reached == b.runs && s.reached == s.runs,
                    });
                }
            }
        }
        "balance" => {
            if let (Some(b), Some(bal)) = (find("BSP"), find("BSP + balance")) {
                let ratio = b.ttt.0 / bal.ttt.0;
                out.push(Check {
                    target: format!("balanced batches reach {} ≥ 1.4x sooner", pct(suite.target)),
                    measured: ratio_text(ratio, bal, b),
                    met: ratio >= 1.4 && b.reached == b.runs && bal.reached == bal.runs,
                });
            }
        }
        _ => {}
    }
    out
}

/// "1.52x (5.1 s against 7.8 s)", or why there is no ratio.
fn ratio_text(ratio: f64, fast: &Row, slow: &Row) -> String {
    if fast.reached == 0 || slow.reached == 0 {
        let missing = if fast.reached == 0 {
            fast.label
        } else {
            slow.label
        };
        return format!("no ratio: {missing} never reached the target");
    }
    format!(
        "{ratio:.2}x ({:.1} s against {:.1} s)",
        fast.ttt.0, slow.ttt.0
    )
}

/// How many seeds a suite's section holds: the most runs of any of its configurations.
fn seeds_held(rows: &[Row]) -> usize {
    rows.iter().map(|r| r.runs).max().unwrap_or(0)
}

fn report(a: &ExperimentArgs, suites: &[Suite], results: &[RunResult]) -> String {
    let mut md = String::new();
    let suite_list = suites.iter().map(|s| s.name).collect::<Vec<_>>().join(",");
    // The fewest seeds of any suite: the command below trains those and keeps every stored
    // seed past them.
    let seeds = suites
        .iter()
        .map(|s| seeds_held(&rows(s, results)))
        .min()
        .unwrap_or(0)
        .max(1);
    let _ = writeln!(md, "# Experiments\n");
    let _ = writeln!(
        md,
        "Generated by `psctl experiments` from real local clusters (a scheduler, `ps-server` \
         shards and workers as child processes on 127.0.0.1, the CPU backend). Regenerate with:\n\n\
         ```sh\ncargo build --release --workspace\n\
         target/release/psctl experiments --suites {suite_list} --seeds {seeds}{}\n```\n",
        if a.epochs_scale == 1.0 {
            String::new()
        } else {
            format!(" --epochs-scale {}", a.epochs_scale)
        }
    );
    let _ = writeln!(
        md,
        "Accuracy is the final test accuracy over each suite's seeds (mean ± sample standard \
         deviation; a suite's section says how many: a suite run once with more seeds keeps \
         them when the report is made again). Bytes per step are what the evaluating worker pushed per clock on the wire, after the \
         codec and lz4, with the f32 size beside them. Time to target is the evaluating worker's \
         training time (its evaluations left out) at its first evaluation at or above the \
         target, over the seeds that reached it; a link suite's speed-up is the ratio of \
         those means, and its targets also give it seed by seed (each run against f32's run \
         of the same seed: the geometric mean of the ratios and its 95% interval). Each \
         configuration's row names the `psctl local` flags that repeat one run (add `--seed N`). A section whose runs recorded \
         it says when they ended and on which machine; the sections without that line come \
         from runs made before it was recorded (README.md names them). Compare a section's \
         rows with each other, not with another section's made on another day or machine.\n"
    );
    if a.epochs_scale != 1.0 {
        let _ = writeln!(
            md,
            "**These runs were shortened to {}x the suites' epochs**; the accuracies are not the \
             converged ones.\n",
            a.epochs_scale
        );
    }
    for suite in suites {
        let rows = rows(suite, results);
        let _ = writeln!(md, "## {}\n\n{}\n", suite.title, suite.about);
        let epochs = (suite.epochs * a.epochs_scale * 1000.0).round() / 1000.0;
        let seeds = seeds_held(&rows);
        let _ = writeln!(
            md,
            "{epochs} epochs, {seeds} seeds; target {} test accuracy. Flags shared by every row: \
             `{}`.\n",
            pct(suite.target),
            suite.base
        );
        if let Some(line) = provenance(suite, results) {
            let _ = writeln!(md, "{line}\n");
        }
        let _ = writeln!(
            md,
            "| configuration | test accuracy | bytes pushed / step (f32) | compression | time to {} | training time | flags |",
            pct(suite.target)
        );
        let _ = writeln!(md, "|---|---|---|---|---|---|---|");
        for (r, c) in rows.iter().zip(&suite.configs) {
            let ttt = if r.reached == 0 {
                "not reached".to_owned()
            } else if r.reached < r.runs {
                format!(
                    "{:.1} ± {:.1} s ({}/{} reached)",
                    r.ttt.0, r.ttt.1, r.reached, r.runs
                )
            } else {
                format!("{:.1} ± {:.1} s", r.ttt.0, r.ttt.1)
            };
            let _ = writeln!(
                md,
                "| {} | {:.2} ± {:.2}% | {:.0} ({:.0}) | {:.1}x | {ttt} | {:.1} s | `{}` |",
                r.label,
                r.acc.0 * 100.0,
                r.acc.1 * 100.0,
                r.wire,
                r.raw,
                r.raw / r.wire,
                r.train_s,
                if c.flags.is_empty() {
                    "(none)".to_owned()
                } else {
                    c.flags.to_owned()
                }
            );
        }
        if is_link_suite(suite) {
            link_table(&mut md, a.epochs_scale, suite, &rows, results);
        }
        let checks = checks(suite, &rows, results);
        if !checks.is_empty() {
            let _ = writeln!(md, "\n| target | measured | met |\n|---|---|---|");
            for c in checks {
                let _ = writeln!(
                    md,
                    "| {} | {} | {} |",
                    c.target,
                    c.measured,
                    if c.met { "yes" } else { "**no**" }
                );
            }
        }
        let _ = writeln!(
            md,
            "\n![{}]({})\n",
            suite.title,
            plot_path(&a.out, suite.name).display()
        );
    }
    md
}

fn plot_path(out: &Path, suite: &str) -> PathBuf {
    out.join(format!("{suite}.svg"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_end_times_read_as_utc_dates() {
        assert_eq!(utc(0), "1970-01-01 00:00");
        assert_eq!(utc(951_868_740 + 59), "2000-02-29 23:59");
        assert_eq!(utc(1_796_274_360), "2026-12-03 05:06");
        assert_eq!(utc(4_107_542_400), "2100-03-01 00:00");
    }

    #[test]
    fn every_suite_parses_as_psctl_local_flags() {
        for s in suites() {
            for c in &s.configs {
                let mut argv = vec!["local"];
                argv.extend(s.base.split_whitespace().chain(c.flags.split_whitespace()));
                let cli = LocalCli::try_parse_from(&argv)
                    .unwrap_or_else(|e| panic!("{} / {}: {e}", s.name, c.label));
                ps_worker::data::DatasetSpec::parse(&cli.local.dataset)
                    .unwrap_or_else(|e| panic!("{} / {}: {e}", s.name, c.label));
            }
        }
    }

    /// A run of `config` in suite `suite` that ended at 85% and reached the target at `t`
    /// seconds.
    fn run_result(
        suite: &str,
        config: &str,
        seed: u64,
        t: f64,
        curve: Vec<(f64, f64)>,
    ) -> RunResult {
        RunResult {
            suite: suite.into(),
            config: config.into(),
            seed,
            flags: Vec::new(),
            test_accuracy: 0.85,
            auc: None,
            wire_bytes_per_step: 1.0,
            raw_bytes_per_step: 1.0,
            pull_wire_bytes_per_step: 1.0,
            pull_raw_bytes_per_step: 1.0,
            pull_request_bytes_per_step: None,
            phase_ms_per_step: PhaseMs::default(),
            train_s: 1.0,
            time_to_target_s: Some(t),
            curve,
            finished_unix_s: None,
            host: None,
        }
    }

    #[test]
    fn a_suite_keeps_the_seeds_stored_past_this_run_and_its_section_counts_them() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            a: ExperimentArgs,
        }
        let a = Cli::try_parse_from(["x", "--suites", "links-sparse-1000", "--seeds", "3"])
            .unwrap()
            .a;
        let suite = suites()
            .into_iter()
            .find(|s| s.name == "links-sparse-1000")
            .unwrap();
        let result = |c: &Config, seed: u64, flags: Vec<String>| RunResult {
            flags,
            ..run_result(suite.name, c.label, seed, 0.5, Vec::new())
        };
        // Ten seeds of every configuration stored with today's flags, and one more seed whose
        // flags have changed since (it must not come back).
        let mut stored: Vec<RunResult> = suite
            .configs
            .iter()
            .flat_map(|c| (1..=10).map(move |seed| (c, seed)))
            .map(|(c, seed)| result(c, seed, run_flags(&a, &suite, c, seed)))
            .collect();
        let c0 = &suite.configs[0];
        let mut old = run_flags(&a, &suite, c0, 11);
        old.push("--momentum-correction".into());
        stored.push(result(c0, 11, old));

        let past = stored_with_todays_flags(&a, &suite, &stored, 3);
        assert_eq!(past.len(), 7 * suite.configs.len());
        assert!(past.iter().all(|r| (4..=10).contains(&r.seed)));
        assert_eq!(
            stored_with_todays_flags(&a, &suite, &stored, 0).len(),
            10 * suite.configs.len()
        );

        let md = report(
            &a,
            std::slice::from_ref(&suite),
            &stored[..stored.len() - 1],
        );
        assert!(md.contains("10 seeds; target"), "{md}");
        assert!(md.contains("--seeds 10"), "{md}");
    }

    /// The Adult 1 Gbit/s suite, and a run of it that reaches 0.85 at `t` seconds.
    fn sparse_1000() -> (Suite, impl Fn(&str, u64, f64) -> RunResult) {
        let suite = suites()
            .into_iter()
            .find(|s| s.name == "links-sparse-1000")
            .unwrap();
        let name = suite.name;
        (suite, move |config: &str, seed: u64, t: f64| {
            run_result(name, config, seed, t, vec![(t / 2.0, 0.5), (t, 0.85)])
        })
    }

    #[test]
    fn a_paired_speedup_compares_each_seed_with_f32s() {
        let (suite, run) = sparse_1000();
        // Seed 1 twice as fast, seed 2 half as fast, seed 3 the same; seed 4 never reached
        // the bar under f32, so it does not count.
        let results = vec![
            run(F32_BOTH, 1, 2.0),
            run(F32_BOTH, 2, 1.0),
            run(F32_BOTH, 3, 3.0),
            run(FP16_BOTH, 1, 1.0),
            run(FP16_BOTH, 2, 2.0),
            run(FP16_BOTH, 3, 3.0),
            run(FP16_BOTH, 4, 1.0),
        ];
        let p = paired_speedup(&suite, FP16_BOTH, &results, 0.8).unwrap();
        assert_eq!(p.seeds, 3);
        assert!((p.ratio - 1.0).abs() < 1e-12, "{}", p.ratio);
        // logs ln 2, -ln 2, 0: sd ln 2; half width 4.303 * ln 2 / sqrt 3.
        let half = 4.303 * 2f64.ln() / 3f64.sqrt();
        let (lo, hi) = p.interval.unwrap();
        assert!((lo - (-half).exp()).abs() < 1e-9 && (hi - half.exp()).abs() < 1e-9);
        assert!(
            p.describe().contains("1.00x, 95% interval"),
            "{}",
            p.describe()
        );
        assert!(paired_speedup(&suite, FP16_BOTH, &results, 0.9).is_none());
    }

    /// At 1 Gbit/s, where f32 runs twice, a configuration whose mean is below f32's but whose
    /// paired interval reaches 1x is within f32's own scatter and meets the target; one slower
    /// on every seed does not.
    #[test]
    fn a_fast_link_target_reads_speed_ups_against_f32s_own_scatter() {
        let (suite, run) = sparse_1000();
        let mut results = Vec::new();
        for (seed, f32_t, again_t, fp16_t, topk_t, delta_t) in [
            (1, 1.0, 1.1, 1.2, 1.0, 2.0),
            (2, 1.0, 0.9, 0.8, 1.0, 2.1),
            (3, 1.0, 1.0, 1.1, 1.0, 1.9),
        ] {
            results.extend([
                run(F32_BOTH, seed, f32_t),
                run(F32_AGAIN, seed, again_t),
                run(FP16_BOTH, seed, fp16_t),
                run(TOPK_FP16_PULL, seed, topk_t),
                run(TOPK_DELTA_PULL, seed, delta_t),
            ]);
        }
        let rows = rows(&suite, &results);
        let checks = checks(&suite, &rows, &results);
        let met = |label: &str| {
            let c = checks.iter().find(|c| c.target.starts_with(label)).unwrap();
            assert!(
                c.measured.contains("f32 run again: paired by seed"),
                "{}",
                c.measured
            );
            c.met
        };
        // fp16: mean 0.97x, interval about 0.65-1.45x.
        assert!(met(FP16_BOTH));
        assert!(met(TOPK_FP16_PULL));
        // Twice as slow on every seed: interval about 0.44-0.57x.
        assert!(!met(TOPK_DELTA_PULL));
        assert!(!checks.iter().any(|c| c.target.starts_with(F32_AGAIN)));
    }

    #[test]
    fn mean_and_sample_deviation() {
        let (m, s) = mean_std(&[1.0, 2.0, 3.0]);
        assert!((m - 2.0).abs() < 1e-12 && (s - 1.0).abs() < 1e-12);
        assert_eq!(mean_std(&[5.0]), (5.0, 0.0));
        assert_eq!(slug("top-k 1% + EF"), "top-k-1-ef");
    }
}
