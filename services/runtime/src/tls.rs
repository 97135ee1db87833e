//! The server side of TLS (rustls, ring) for every port a service listens on: gRPC, the
//! shard's bulk stream and, when asked, the metrics port. `--tls-cert` and `--tls-key` turn it
//! on; `--tls-client-ca` makes it mutual (a client without a certificate that CA signed is
//! refused in the handshake). The files are read again when they change, so a certificate is
//! rotated without a restart: connections made after the change get the new one.
//!
//! Each accepted connection's handshake runs in its own task, so a slow or silent client holds
//! up nobody; what comes out is a [`PeerConn`]: the stream and who is at the other end
//! ([`Peer`]: its address and, after mutual TLS, the DNS names its certificate carries, which
//! `crate::auth` can take as the caller's identity).

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use ps_client::tls::{
    Conn, FileError, HANDSHAKE_TIMEOUT, Reloading, load_certs, load_key, load_roots, provider,
};
use rustls::server::WebPkiClientVerifier;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// A server's TLS files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerTlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Mutual TLS: clients must present a certificate this CA signed.
    pub client_ca: Option<PathBuf>,
}

/// A server's TLS: cheap to clone; reloads its files when they change.
#[derive(Debug, Clone)]
pub struct ServerTls {
    config: Arc<Reloading<rustls::ServerConfig>>,
    mutual: bool,
}

impl ServerTls {
    /// Loads the files now: a missing or bad file stops the service at start-up.
    pub fn new(files: ServerTlsFiles) -> Result<Self, FileError> {
        let mut paths = vec![files.cert.clone(), files.key.clone()];
        paths.extend(files.client_ca.iter().cloned());
        let mutual = files.client_ca.is_some();
        let config = Reloading::new(paths, move || server_config(&files))?;
        Ok(Self {
            config: Arc::new(config),
            mutual,
        })
    }

    /// Whether clients must present a certificate.
    pub fn mutual(&self) -> bool {
        self.mutual
    }

    /// The handshake over an accepted connection, within [`HANDSHAKE_TIMEOUT`].
    pub async fn accept(&self, tcp: TcpStream) -> io::Result<PeerConn> {
        let addr = tcp.peer_addr().ok();
        let acceptor = tokio_rustls::TlsAcceptor::from(self.config.get());
        let tls = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp))
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "TLS handshake timed out"))??;
        let cert_names = tls
            .get_ref()
            .1
            .peer_certificates()
            .and_then(<[_]>::first)
            .map(cert_names)
            .unwrap_or_default();
        Ok(PeerConn {
            conn: Conn::Server(Box::new(tls)),
            peer: Peer {
                addr,
                cert_names: cert_names.into(),
                rate: None,
            },
        })
    }
}

/// The DNS names (subject alternative names) of a verified client certificate.
fn cert_names(cert: &rustls::pki_types::CertificateDer<'_>) -> Vec<String> {
    webpki::EndEntityCert::try_from(cert)
        .map(|c| c.valid_dns_names().map(str::to_owned).collect())
        .unwrap_or_default()
}

fn server_config(files: &ServerTlsFiles) -> Result<rustls::ServerConfig, FileError> {
    let certs = load_certs("certificate (--tls-cert)", &files.cert)?;
    let key = load_key(&files.key)?;
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| FileError::new("TLS versions", &files.cert, e))?;
    let builder = match &files.client_ca {
        Some(ca) => {
            let roots = load_roots("client CA (--tls-client-ca)", ca)?;
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
                .build()
                .map_err(|e| FileError::new("client CA (--tls-client-ca)", ca, e))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_single_cert(certs, key).map_err(|e| {
        FileError::new(
            "certificate and key (--tls-cert, --tls-key)",
            &files.cert,
            e,
        )
    })?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

/// Who is at the other end of a connection.
#[derive(Debug, Clone, Default)]
pub struct Peer {
    pub addr: Option<SocketAddr>,
    /// After mutual TLS: the DNS names of the client's certificate (verified against the client
    /// CA). Empty otherwise.
    pub cert_names: Arc<[String]>,
    /// The connection's own rate limit, shared by its calls (`--connection-calls-per-second`).
    pub rate: Option<Arc<crate::auth::Bucket>>,
}

/// An accepted connection (TLS or plain) and its [`Peer`].
#[derive(Debug)]
pub struct PeerConn {
    pub conn: Conn,
    pub peer: Peer,
}

impl tonic::transport::server::Connected for PeerConn {
    type ConnectInfo = Peer;

    fn connect_info(&self) -> Peer {
        self.peer.clone()
    }
}

impl AsyncRead for PeerConn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().conn).poll_read(cx, buf)
    }
}

impl AsyncWrite for PeerConn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().conn).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().conn).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.conn.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().conn).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().conn).poll_shutdown(cx)
    }
}

/// Accepts on `listener` until `stop` is cancelled (the listener then closes) or the receiver
/// is dropped: each connection, after its handshake when `tls` is given (in a task of its
/// own; a failed one is logged and dropped), comes out of the returned channel, with its own
/// bucket of `rate` calls per second when given.
pub fn accept_loop(
    listener: TcpListener,
    tls: Option<ServerTls>,
    rate: Option<f64>,
    stop: CancellationToken,
    what: &'static str,
) -> mpsc::Receiver<PeerConn> {
    let bucket = move || rate.map(|r| Arc::new(crate::auth::Bucket::new(r)));
    let (tx, rx) = mpsc::channel(128);
    crate::metrics::tls_handshake_failed_zero(what);
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                () = stop.cancelled() => break,
                () = tx.closed() => break,
                a = listener.accept() => a,
            };
            let (tcp, addr) = match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of descriptors and the like: the next accept may succeed.
                    tracing::warn!(error = %e, what, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let _ = tcp.set_nodelay(true);
            match &tls {
                None => {
                    let conn = PeerConn {
                        conn: Conn::Plain(tcp),
                        peer: Peer {
                            addr: Some(addr),
                            cert_names: Arc::new([]),
                            rate: bucket(),
                        },
                    };
                    if tx.send(conn).await.is_err() {
                        break;
                    }
                }
                Some(tls) => {
                    let (tls, tx) = (tls.clone(), tx.clone());
                    tokio::spawn(async move {
                        match tls.accept(tcp).await {
                            Ok(mut conn) => {
                                conn.peer.rate = bucket();
                                let _ = tx.send(conn).await;
                            }
                            Err(e) => {
                                crate::metrics::tls_handshake_failed(what);
                                tracing::debug!(%addr, error = %e, what, "TLS handshake failed");
                            }
                        }
                    });
                }
            }
        }
    });
    rx
}

/// [`accept_loop`]'s connections as an axum listener (the metrics port).
#[derive(Debug)]
pub struct Accepted {
    pub rx: mpsc::Receiver<PeerConn>,
    pub local: SocketAddr,
}

impl axum::serve::Listener for Accepted {
    type Io = PeerConn;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (PeerConn, SocketAddr) {
        match self.rx.recv().await {
            Some(c) => {
                let addr = c.peer.addr.unwrap_or(self.local);
                (c, addr)
            }
            // The accept loop stopped: the server is shutting down.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local)
    }
}
