use std::process::ExitCode;

use clap::Parser;
use ps_scheduler::{Args, Config};
use tokio::net::TcpListener;

#[tokio::main]
async fn main() -> ExitCode {
    let _telemetry = ps_runtime::telemetry::init("scheduler");
    match start(Args::parse()).await {
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
    let listener = TcpListener::bind(cfg.listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", cfg.listen))?;
    let metrics = match cfg.metrics_listen {
        Some(a) => Some(
            TcpListener::bind(a)
                .await
                .map_err(|e| anyhow::anyhow!("cannot listen on {a} for metrics: {e}"))?,
        ),
        None => None,
    };
    let shutdown = ps_runtime::shutdown::on_signals();
    ps_scheduler::run(cfg, listener, metrics, shutdown).await
}
