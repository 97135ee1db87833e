use std::process::ExitCode;

use clap::Parser;
use ps_scheduler::{Args, Config};

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let _telemetry = ps_runtime::telemetry::init("scheduler", &args.service.log);
    match start(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("scheduler: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn start(args: Args) -> anyhow::Result<()> {
    let cfg = Config::resolve(args)?;
    let (listener, metrics) =
        ps_runtime::metrics::bind(cfg.service.listen, cfg.service.metrics_listen).await?;
    let shutdown = ps_runtime::shutdown::on_signals();
    ps_scheduler::run(cfg, listener, metrics, shutdown).await
}
