use std::process::ExitCode;

use clap::Parser;
use ps_server::{Args, ServerConfig};

#[tokio::main]
async fn main() -> ExitCode {
    ps_runtime::heap::keep_large_buffers();
    let args = Args::parse();
    let _telemetry = ps_runtime::telemetry::init("ps-server", &args.service.log);
    match start(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("ps-server: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn start(args: Args) -> anyhow::Result<()> {
    let cfg = ServerConfig::resolve(args)?;
    let (listener, metrics) =
        ps_runtime::metrics::bind(cfg.service.listen, cfg.service.metrics_listen).await?;
    let shutdown = ps_runtime::shutdown::on_signals();
    ps_server::run(cfg, listener, metrics, shutdown).await
}
