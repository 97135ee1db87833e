//! `worker`: one training worker of a job. It joins the job at the scheduler, trains on the data
//! shards the scheduler assigns, and leaves when the job ends.

use std::process::ExitCode;

use clap::Parser;
use ps_worker::WorkerConfig;

#[derive(Debug, Parser)]
#[command(name = "worker", version, about = "A parameter-server training worker")]
struct Args {
    #[command(flatten)]
    cfg: WorkerConfig,
    #[command(flatten)]
    log: ps_runtime::telemetry::LogArgs,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    ps_runtime::heap::keep_large_buffers();
    let args = Args::parse();
    let _telemetry = ps_runtime::telemetry::init("worker", &args.log);
    let cfg = args.cfg;
    let shutdown = ps_runtime::shutdown::on_signals();
    match ps_worker::run_worker(cfg, shutdown).await {
        Ok(s) => {
            tracing::info!(clocks = s.clocks, examples = s.examples, "worker done");
            if let Some(e) = s.final_eval {
                println!("test accuracy {:.4}", e.test_accuracy);
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("worker: {e:#}");
            ExitCode::FAILURE
        }
    }
}
