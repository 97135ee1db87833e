//! What operators rely on: gRPC health, reflection (v1 and v1alpha), and Prometheus metrics.

use ps_core::{Optimizer, TableSpec};
use ps_server::ServerConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

async fn channel(url: &str) -> tonic::transport::Channel {
    tonic::transport::Channel::from_shared(url.to_owned())
        .unwrap()
        .connect()
        .await
        .unwrap()
}

async fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).await.unwrap();
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_reflection_and_metrics_are_served() {
    let dir = tempfile::tempdir().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let metrics = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (grpc_addr, metrics_addr) = (
        listener.local_addr().unwrap(),
        metrics.local_addr().unwrap(),
    );
    let shutdown = CancellationToken::new();
    let mut cfg = ServerConfig::local(Some(dir.path().to_owned()));
    // Long enough to see the shard not ready while it drains.
    cfg.service.drain = std::time::Duration::from_secs(3);
    let server = tokio::spawn(ps_server::run(
        cfg,
        listener,
        Some(metrics),
        shutdown.clone(),
    ));
    let url = format!("http://{grpc_addr}");

    // Health, overall and for the service.
    let mut health = HealthClient::new(channel(&url).await);
    for service in ["", "ps.v1.ParameterServer"] {
        let r = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.status(), ServingStatus::Serving, "service {service:?}");
    }

    // Reflection lists our service, in both protocol versions.
    {
        use tonic_reflection::pb::v1::ServerReflectionRequest;
        use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
        use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
        use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
        let mut c = ServerReflectionClient::new(channel(&url).await);
        let req = ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::ListServices(String::new())),
        };
        let mut answers = c
            .server_reflection_info(tokio_stream::iter([req]))
            .await
            .unwrap()
            .into_inner();
        let answer = answers.message().await.unwrap().unwrap();
        let Some(MessageResponse::ListServicesResponse(list)) = answer.message_response else {
            panic!("unexpected answer {answer:?}");
        };
        let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
        assert!(
            names.contains(&"ps.v1.ParameterServer".to_owned()),
            "{names:?}"
        );
        assert!(
            names.contains(&"grpc.health.v1.Health".to_owned()),
            "{names:?}"
        );
    }
    {
        use tonic_reflection::pb::v1alpha::ServerReflectionRequest;
        use tonic_reflection::pb::v1alpha::server_reflection_client::ServerReflectionClient;
        use tonic_reflection::pb::v1alpha::server_reflection_request::MessageRequest;
        use tonic_reflection::pb::v1alpha::server_reflection_response::MessageResponse;
        let mut c = ServerReflectionClient::new(channel(&url).await);
        let req = ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::FileContainingSymbol(
                "ps.v1.ParameterServer".into(),
            )),
        };
        let mut answers = c
            .server_reflection_info(tokio_stream::iter([req]))
            .await
            .unwrap()
            .into_inner();
        let answer = answers.message().await.unwrap().unwrap();
        assert!(
            matches!(answer.message_response, Some(MessageResponse::FileDescriptorResponse(ref f)) if !f.file_descriptor_proto.is_empty()),
            "{answer:?}"
        );
    }

    // Metrics: build info, and the push we make.
    let ps = ps_client::PsClient::connect(ps_client::ClientConfig::new([url]))
        .await
        .unwrap();
    ps.create_table(
        TableSpec::sparse("m", 2)
            .unwrap()
            .with_optimizer(Optimizer::sgd(0.1))
            .unwrap(),
    )
    .await
    .unwrap();
    ps.push_sparse("m", &[1, 2], &[0.5; 4]).await.unwrap();
    let text = http_get(metrics_addr, "/metrics").await;
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(
        text.contains("ps_build_info{service=\"ps-server\""),
        "{text}"
    );
    assert!(text.contains("# HELP ps_push_requests_total"), "{text}");
    assert!(
        text.contains("ps_push_requests_total{table=\"m\",kind=\"sparse\",outcome=\"applied\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("ps_store_write_seconds_bucket"),
        "histograms have buckets: {text}"
    );

    // HTTP probes on the metrics port, and the gRPC probe binary.
    let text = http_get(metrics_addr, "/healthz").await;
    assert!(
        text.starts_with("HTTP/1.1 200") && text.ends_with("ok\n"),
        "{text}"
    );
    let text = http_get(metrics_addr, "/readyz").await;
    assert!(
        text.starts_with("HTTP/1.1 200") && text.ends_with("ready\n"),
        "{text}"
    );
    let probe = |addr: String, service: &str| {
        let out = std::process::Command::new(ps_launch::binary("ps-probe").unwrap())
            .args([
                "--addr",
                &addr,
                "--service",
                service,
                "--timeout-ms",
                "2000",
            ])
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).trim().to_owned(),
        )
    };
    assert_eq!(
        probe(grpc_addr.to_string(), "ps.v1.ParameterServer"),
        (Some(0), "SERVING".to_owned())
    );
    let plain = |args: &[&str]| {
        let out = std::process::Command::new(ps_launch::binary("ps-probe").unwrap())
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).trim().to_owned(),
        )
    };
    let m = metrics_addr.to_string();
    assert_eq!(
        plain(&["--addr", &m, "--http", "/readyz"]),
        (Some(0), "HTTP 200".to_owned())
    );
    assert_eq!(
        plain(&["--addr", &m, "--http", "/nope"]),
        (Some(1), "HTTP 404".to_owned())
    );
    assert_eq!(
        plain(&["--addr", &grpc_addr.to_string(), "--tcp"]),
        (Some(0), "CONNECTED".to_owned())
    );
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed_addr = closed.local_addr().unwrap().to_string();
    drop(closed);
    assert_eq!(probe(closed_addr, "").0, Some(2), "nothing listens there");

    // Shutdown: not ready, and NOT_SERVING to the probe, from its first moment (the drain).
    shutdown.cancel();
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let text = http_get(metrics_addr, "/readyz").await;
    assert!(text.starts_with("HTTP/1.1 503"), "{text}");
    assert_eq!(
        probe(grpc_addr.to_string(), ""),
        (Some(1), "NOT_SERVING".to_owned())
    );
    server.await.unwrap().unwrap();
}
