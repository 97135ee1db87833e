//! `ps-probe`: asks a service's `grpc.health.v1.Health` whether it serves, for container
//! health checks and scripts. Exit 0 when SERVING; 1 when it answers anything else (NOT_SERVING
//! while it drains); 2 when it cannot be reached or does not answer in time.
//!
//! ```sh
//! ps-probe --addr 127.0.0.1:7070                       # the whole server ("")
//! ps-probe --addr shard-0:7070 --service ps.v1.ParameterServer --timeout-ms 1000
//! ```

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

/// Checks a service's gRPC health.
#[derive(Debug, Parser)]
#[command(name = "ps-probe", version, about)]
struct Args {
    /// The service's gRPC address: host:port or a URL.
    #[arg(long, env = "PS_PROBE_ADDR", default_value = "127.0.0.1:7070")]
    addr: String,
    /// The health service name to ask about ("" is the whole server).
    #[arg(long, default_value = "")]
    service: String,
    /// Longest wait for the connection and the answer together.
    #[arg(long, default_value_t = 2000)]
    timeout_ms: u64,
}

async fn check(args: &Args) -> Result<ServingStatus, String> {
    let url = if args.addr.contains("://") {
        args.addr.clone()
    } else {
        format!("http://{}", args.addr)
    };
    let channel = tonic::transport::Endpoint::from_shared(url.clone())
        .map_err(|e| format!("`{url}` is not an address: {e}"))?
        .connect()
        .await
        .map_err(|e| format!("cannot connect to {url}: {e}"))?;
    let answer = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: args.service.clone(),
        })
        .await
        .map_err(|s| format!("{url} answered {:?}: {}", s.code(), s.message()))?;
    Ok(answer.into_inner().status())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = Args::parse();
    let timeout = Duration::from_millis(args.timeout_ms);
    match tokio::time::timeout(timeout, check(&args)).await {
        Ok(Ok(ServingStatus::Serving)) => {
            println!("SERVING");
            ExitCode::SUCCESS
        }
        Ok(Ok(other)) => {
            println!("{}", other.as_str_name());
            ExitCode::from(1)
        }
        Ok(Err(e)) => {
            eprintln!("ps-probe: {e}");
            ExitCode::from(2)
        }
        Err(_) => {
            eprintln!("ps-probe: no answer from {} within {timeout:?}", args.addr);
            ExitCode::from(2)
        }
    }
}
