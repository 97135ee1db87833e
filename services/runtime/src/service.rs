//! The flags every service has, declared once: the config file, the gRPC and metrics
//! addresses, the data directory (or none), the shutdown drain and the ready file. A service
//! flattens [`ServiceArgs`] into its own clap `Args`, reads its TOML file with
//! [`load_service_file`] (the shared keys and its own, each set refusing unknown keys), and
//! resolves both into a [`ServiceConfig`]: flag or variable beats file beats default.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use serde::de::DeserializeOwned;

use crate::config::ConfigError;

/// The flags of every service.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ServiceArgs {
    /// TOML file with any of these settings and the service's tunables (see README).
    #[arg(long, env = "PS_CONFIG")]
    pub config: Option<PathBuf>,
    /// gRPC address to listen on (port 0: one the system picks; see --ready-file).
    #[arg(long, env = "PS_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// Prometheus `/metrics` address; no endpoint when unset.
    #[arg(long, env = "PS_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
    /// Directory of the service's durable state (required unless --in-memory).
    #[arg(long, env = "PS_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Keep the state in memory only: nothing survives a restart.
    #[arg(long, env = "PS_IN_MEMORY")]
    pub in_memory: bool,
    /// Milliseconds between turning NOT_SERVING and closing the listener on shutdown [default: 0].
    #[arg(long, env = "PS_DRAIN_MS")]
    pub drain_ms: Option<u64>,
    /// The longest any gRPC call may run, in milliseconds (a client's shorter deadline holds
    /// too) [default: 600000].
    #[arg(long, env = "PS_MAX_CALL_MS", value_parser = clap::value_parser!(u64).range(1..))]
    pub max_call_ms: Option<u64>,
    /// gRPC calls served at once per connection; more wait their turn [default: no limit].
    #[arg(long, env = "PS_MAX_CALLS_PER_CONNECTION", value_parser = clap::value_parser!(u64).range(1..))]
    pub max_calls_per_connection: Option<u64>,
    /// Calls per second one connection may make (gRPC and the bulk stream); more are refused
    /// at once with `resource_exhausted` (CALLER_LIMIT), which the SDK retries after a pause
    /// [default: no limit].
    #[arg(long, env = "PS_CONNECTION_CALLS_PER_SECOND")]
    pub connection_calls_per_second: Option<f64>,
    /// Once ready, write the addresses served on (gRPC, metrics, bulk) to this file as JSON:
    /// how a launcher learns the ports a `:0` address got.
    #[arg(long, env = "PS_READY_FILE")]
    pub ready_file: Option<PathBuf>,
    #[command(flatten)]
    pub log: crate::telemetry::LogArgs,
    #[command(flatten)]
    pub security: ServerSecurity,
}

/// How a client (a worker, psctl, a service calling another) connects: TLS and its token.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ClientSecurity {
    /// CA certificate (PEM) the servers' certificates must chain to: TLS on every connection.
    #[arg(long, env = "PS_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// This process's certificate chain (PEM): shown to servers that ask for one (mutual TLS);
    /// a service also serves with it.
    #[arg(long, env = "PS_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long, env = "PS_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// File whose first line is this process's bearer token (or the token in PS_TOKEN).
    #[arg(long, env = "PS_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
}

impl ClientSecurity {
    /// The TLS settings and token these flags give (plaintext and no token without them).
    pub fn credentials(&self) -> anyhow::Result<ps_client::Credentials> {
        let tls = match &self.tls_ca {
            Some(ca) => Some(ps_client::tls::ClientTls::new(
                ps_client::tls::ClientTlsFiles {
                    ca: ca.clone(),
                    cert: self.tls_cert.clone(),
                    key: self.tls_key.clone(),
                },
            )?),
            None => None,
        };
        let token = match (&self.token_file, std::env::var("PS_TOKEN")) {
            (Some(f), _) => Some(ps_client::Token::from_file(f)?),
            (None, Ok(t)) if !t.is_empty() => Some(ps_client::Token::new(&t)?),
            _ => None,
        };
        Ok(ps_client::Credentials { tls, token })
    }
}

/// A service's security flags: its TLS as a server (and as a client of the other services),
/// the tokens it admits, and its own token for the calls it makes.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ServerSecurity {
    #[command(flatten)]
    pub client: ClientSecurity,
    /// Mutual TLS: CA certificate (PEM) that clients' certificates must chain to; a client
    /// without one is refused. Needs --tls-cert and --tls-key.
    #[arg(long, env = "PS_TLS_CLIENT_CA")]
    pub tls_client_ca: Option<PathBuf>,
    /// Tokens file (TOML: name, role, jobs, sha256 of the token, cert_name): every call must
    /// carry a known token or client certificate; `psctl token` makes entries. Reloaded when
    /// it changes.
    #[arg(long, env = "PS_AUTH_TOKENS")]
    pub auth_tokens: Option<PathBuf>,
    /// Serve the metrics port with TLS too (the same certificate and client CA).
    #[arg(long, env = "PS_METRICS_TLS")]
    pub metrics_tls: bool,
}

impl ServerSecurity {
    /// TLS for the service's ports: on with --tls-cert and --tls-key.
    pub fn server_tls(&self) -> anyhow::Result<Option<crate::tls::ServerTls>> {
        match (&self.client.tls_cert, &self.client.tls_key) {
            (Some(cert), Some(key)) => Ok(Some(crate::tls::ServerTls::new(
                crate::tls::ServerTlsFiles {
                    cert: cert.clone(),
                    key: key.clone(),
                    client_ca: self.tls_client_ca.clone(),
                },
            )?)),
            (None, None) if self.tls_client_ca.is_none() && !self.metrics_tls => Ok(None),
            (None, None) => anyhow::bail!(
                "--tls-client-ca and --metrics-tls need the service's --tls-cert and --tls-key"
            ),
            _ => anyhow::bail!("TLS needs both --tls-cert and --tls-key"),
        }
    }

    /// The files loaded and checked: a bad one stops the service at start-up.
    pub fn resolve(&self) -> anyhow::Result<Security> {
        Ok(Security {
            tls: self.server_tls()?,
            metrics_tls: self.metrics_tls,
            auth: match &self.auth_tokens {
                Some(p) => Some(crate::auth::Auth::load(p.clone())?),
                None => None,
            },
            credentials: self.client.credentials()?,
        })
    }
}

/// The shared keys of a service's TOML file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServiceFile {
    pub listen: Option<SocketAddr>,
    pub metrics_listen: Option<SocketAddr>,
    pub data_dir: Option<PathBuf>,
    pub in_memory: Option<bool>,
    pub drain_ms: Option<u64>,
    pub grace_ms: Option<u64>,
}

impl ServiceFile {
    /// The keys this struct takes out of a service's file.
    const KEYS: [&'static str; 6] = [
        "listen",
        "metrics_listen",
        "data_dir",
        "in_memory",
        "drain_ms",
        "grace_ms",
    ];
}

/// The shared settings, resolved.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    pub listen: SocketAddr,
    pub metrics_listen: Option<SocketAddr>,
    /// `None`: the service keeps its state in memory.
    pub data_dir: Option<PathBuf>,
    /// Time between NOT_SERVING and closing the listener.
    pub drain: Duration,
    /// Longest wait for in-flight calls once the listener is closed.
    pub grace: Duration,
    pub ready_file: Option<PathBuf>,
    /// TLS, the tokens admitted, and the service's own credentials for the calls it makes.
    pub security: Security,
    /// What one call and one connection may take.
    pub limits: crate::grpc::CallLimits,
}

/// A service's security, resolved from [`ServerSecurity`]: everything off by default.
#[derive(Debug, Clone, Default)]
pub struct Security {
    /// TLS on the gRPC port and the bulk stream.
    pub tls: Option<crate::tls::ServerTls>,
    /// TLS on the metrics port too.
    pub metrics_tls: bool,
    /// Credentials checked on every call.
    pub auth: Option<crate::auth::Auth>,
    /// What the service's own calls (to the scheduler, to the shards) carry.
    pub credentials: ps_client::Credentials,
}

impl Security {
    /// The metrics port's TLS: the service's, when --metrics-tls asks for it.
    pub fn metrics_tls(&self) -> Option<crate::tls::ServerTls> {
        self.tls.clone().filter(|_| self.metrics_tls)
    }
}

impl ServiceConfig {
    /// A service on an ephemeral loopback port keeping its state in `data_dir`: what tests
    /// and benchmarks start in-process.
    pub fn local(data_dir: Option<PathBuf>, grace: Duration) -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            metrics_listen: None,
            data_dir,
            drain: Duration::ZERO,
            grace,
            ready_file: None,
            security: Security::default(),
            limits: crate::grpc::CallLimits::default(),
        }
    }
}

/// The defaults a service resolves its shared settings against.
#[derive(Debug, Clone, Copy)]
pub struct ServiceDefaults {
    pub listen: SocketAddr,
    pub grace: Duration,
    /// What the data directory holds, for the error when it is missing.
    pub state: &'static str,
}

impl ServiceArgs {
    /// Flags over `file` over `defaults`. A service without `--in-memory` needs a data dir.
    pub fn resolve(
        &self,
        file: ServiceFile,
        defaults: ServiceDefaults,
    ) -> anyhow::Result<ServiceConfig> {
        let in_memory = self.in_memory || file.in_memory.unwrap_or(false);
        let data_dir = self.data_dir.clone().or(file.data_dir);
        if !in_memory && data_dir.is_none() {
            anyhow::bail!(
                "--data-dir (PS_DATA_DIR) is required for the {}; pass --in-memory to run without it",
                defaults.state
            );
        }
        Ok(ServiceConfig {
            listen: self.listen.or(file.listen).unwrap_or(defaults.listen),
            metrics_listen: self.metrics_listen.or(file.metrics_listen),
            data_dir: if in_memory { None } else { data_dir },
            drain: Duration::from_millis(self.drain_ms.or(file.drain_ms).unwrap_or(0)),
            grace: file.grace_ms.map_or(defaults.grace, Duration::from_millis),
            ready_file: self.ready_file.clone(),
            security: self.security.resolve()?,
            limits: crate::grpc::CallLimits {
                max_call: self.max_call_ms.map_or(
                    crate::grpc::CallLimits::default().max_call,
                    Duration::from_millis,
                ),
                per_connection: self
                    .max_calls_per_connection
                    .map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
                per_connection_rate: match self.connection_calls_per_second {
                    Some(r) if !(r.is_finite() && r > 0.0) => {
                        anyhow::bail!("--connection-calls-per-second {r}: give a number above 0")
                    }
                    r => r,
                },
            },
        })
    }
}

/// Reads a service's TOML file (none: both parts empty): the shared keys into [`ServiceFile`],
/// every other key into the service's own `F`. Both refuse keys they do not know, so a
/// misspelt key is an error that names it.
pub fn load_service_file<F: DeserializeOwned + Default>(
    path: Option<&Path>,
) -> Result<(ServiceFile, F), ConfigError> {
    let Some(path) = path else {
        return Ok((ServiceFile::default(), F::default()));
    };
    let mut own: toml::Table = crate::config::load_toml(path)?;
    let mut shared = toml::Table::new();
    for key in ServiceFile::KEYS {
        if let Some(v) = own.remove(key) {
            shared.insert(key.to_owned(), v);
        }
    }
    let parse = |source| ConfigError::Parse {
        path: path.display().to_string(),
        source,
    };
    Ok((
        shared.try_into().map_err(parse)?,
        own.try_into().map_err(parse)?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Default, Deserialize)]
    #[serde(deny_unknown_fields, default)]
    struct Own {
        lease_ms: Option<u64>,
    }

    const DEFAULTS: ServiceDefaults = ServiceDefaults {
        listen: SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 7000),
        grace: Duration::from_secs(5),
        state: "job state",
    };

    fn file(text: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.toml");
        std::fs::write(&path, text).unwrap();
        (dir, path)
    }

    #[test]
    fn shared_and_own_keys_split_and_unknown_keys_are_named() {
        let (_d, p) = file("listen = \"127.0.0.1:9\"\ngrace_ms = 250\nlease_ms = 300\n");
        let (shared, own): (ServiceFile, Own) = load_service_file(Some(&p)).unwrap();
        assert_eq!(own.lease_ms, Some(300));
        let args = ServiceArgs {
            in_memory: true,
            drain_ms: Some(7),
            ..Default::default()
        };
        let c = args.resolve(shared, DEFAULTS).unwrap();
        assert_eq!(c.listen.port(), 9);
        assert_eq!(c.grace, Duration::from_millis(250));
        assert_eq!(c.drain, Duration::from_millis(7));
        assert!(c.data_dir.is_none());

        let (_d, p) = file("lisen = \"127.0.0.1:9\"\n");
        let e = load_service_file::<Own>(Some(&p)).unwrap_err().to_string();
        assert!(e.contains("unknown field `lisen`"), "{e}");
    }

    #[test]
    fn a_flag_beats_the_file_and_a_data_dir_is_required_unless_in_memory() {
        let (_d, p) = file("listen = \"127.0.0.1:9\"\ndata_dir = \"/tmp/f\"\n");
        let (shared, _): (ServiceFile, Own) = load_service_file(Some(&p)).unwrap();
        let args = ServiceArgs {
            listen: Some("127.0.0.1:10".parse().unwrap()),
            ..Default::default()
        };
        let c = args.resolve(shared, DEFAULTS).unwrap();
        assert_eq!(c.listen.port(), 10);
        assert_eq!(c.data_dir.as_deref(), Some(Path::new("/tmp/f")));
        let e = ServiceArgs::default()
            .resolve(ServiceFile::default(), DEFAULTS)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--data-dir") && e.contains("job state"), "{e}");
    }
}
