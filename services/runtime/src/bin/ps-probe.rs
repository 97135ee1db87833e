//! `ps-probe`: asks a service's `grpc.health.v1.Health` whether it serves, for container
//! health checks and scripts. Exit 0 when SERVING; 1 when it answers anything else (NOT_SERVING
//! while it drains); 2 when it cannot be reached or does not answer in time. For the processes
//! beside ours in a deployment (Prometheus, a collector), `--http PATH` asks for an HTTP 200
//! instead and `--tcp` only for a connection.
//!
//! ```sh
//! ps-probe --addr 127.0.0.1:7070                       # the whole server ("")
//! ps-probe --addr shard-0:7070 --service ps.v1.ParameterServer --timeout-ms 1000
//! ps-probe --addr 127.0.0.1:9090 --http /-/healthy     # Prometheus
//! ps-probe --addr 127.0.0.1:4317 --tcp                 # accepts connections
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
    /// Ask for `GET PATH` over HTTP/1.1 to answer 200 instead of gRPC health.
    #[arg(long, conflicts_with_all = ["service", "tcp"])]
    http: Option<String>,
    /// Only check that the address accepts a TCP connection.
    #[arg(long)]
    tcp: bool,
    /// TLS for the gRPC check (--tls-ca; --tls-cert and --tls-key where the service wants a
    /// client certificate). Inside a service's container its PS_TLS_* variables serve.
    #[command(flatten)]
    security: ps_runtime::service::ClientSecurity,
}

/// The host:port of `addr` (a URL's scheme and path dropped).
fn host_port(addr: &str) -> &str {
    let rest = addr.split_once("://").map_or(addr, |(_, r)| r);
    rest.split('/').next().unwrap_or(rest)
}

/// Connects, and with `path` sends `GET path`: the HTTP status line's code.
async fn plain(addr: &str, path: Option<&str>) -> Result<Option<u16>, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let to = host_port(addr);
    let mut sock = tokio::net::TcpStream::connect(to)
        .await
        .map_err(|e| format!("cannot connect to {to}: {e}"))?;
    let Some(path) = path else {
        return Ok(None);
    };
    let request = format!("GET {path} HTTP/1.1\r\nHost: {to}\r\nConnection: close\r\n\r\n");
    sock.write_all(request.as_bytes())
        .await
        .map_err(|e| format!("{to}: {e}"))?;
    let mut head = vec![0u8; 64];
    let n = sock
        .read(&mut head)
        .await
        .map_err(|e| format!("{to}: {e}"))?;
    let line = String::from_utf8_lossy(&head[..n]);
    line.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .map(Some)
        .ok_or_else(|| format!("{to} did not answer HTTP: {line:?}"))
}

async fn check(args: &Args) -> Result<ServingStatus, String> {
    let url = if args.addr.contains("://") {
        args.addr.clone()
    } else {
        format!("http://{}", args.addr)
    };
    let tls = args
        .security
        .credentials()
        .map_err(|e| format!("{e:#}"))?
        .tls;
    let endpoint = tonic::transport::Endpoint::from_shared(url.clone())
        .map_err(|e| format!("`{url}` is not an address: {e}"))?;
    let channel = ps_client::tls::channel(&endpoint, tls.as_ref());
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
    // (exit code, what to print) of each outcome.
    let answer: Result<(u8, String), String> = if args.tcp || args.http.is_some() {
        match tokio::time::timeout(timeout, plain(&args.addr, args.http.as_deref())).await {
            Ok(Ok(None)) => Ok((0, "CONNECTED".into())),
            Ok(Ok(Some(code))) => Ok((u8::from(code != 200), format!("HTTP {code}"))),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(format!("no answer from {} within {timeout:?}", args.addr)),
        }
    } else {
        match tokio::time::timeout(timeout, check(&args)).await {
            Ok(Ok(status)) => Ok((
                u8::from(status != ServingStatus::Serving),
                status.as_str_name().to_owned(),
            )),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(format!("no answer from {} within {timeout:?}", args.addr)),
        }
    };
    match answer {
        Ok((code, said)) => {
            println!("{said}");
            ExitCode::from(code)
        }
        Err(e) => {
            eprintln!("ps-probe: {e}");
            ExitCode::from(2)
        }
    }
}
