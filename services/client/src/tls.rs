//! TLS for every connection the SDK makes (rustls, ring): the shards' gRPC and bulk streams and
//! the scheduler. One [`ClientTls`] holds the CA the servers' certificates must chain to and,
//! for mutual TLS, this client's certificate; its files are read again when they change, so a
//! long-lived worker picks up a rotated certificate on its next connection.
//!
//! The PEM loading and the reload rule ([`Reloading`]) are shared with the servers
//! (`ps_runtime::tls`), which build their side from the same files.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime};

use parking_lot::Mutex;
use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// How long a handshake may take before the connection is given up.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How often the files behind a [`Reloading`] value are looked at again (their modification
/// times; a change reloads them).
const RECHECK: Duration = Duration::from_secs(1);

/// A security file (certificate, key, CA, token table) that is missing, unreadable or holds nothing usable.
#[derive(Debug, thiserror::Error)]
#[error("{what} `{path}`: {why}")]
pub struct FileError {
    pub what: &'static str,
    pub path: PathBuf,
    pub why: String,
}

impl FileError {
    pub fn new(what: &'static str, path: &Path, why: impl fmt::Display) -> Self {
        Self {
            what,
            path: path.to_owned(),
            why: why.to_string(),
        }
    }
}

/// Every certificate of a PEM file, in order (a leaf and its chain, or CA certificates).
pub fn load_certs(
    what: &'static str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, FileError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| FileError::new(what, path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| FileError::new(what, path, e))?;
    if certs.is_empty() {
        return Err(FileError::new(what, path, "no PEM certificate in it"));
    }
    Ok(certs)
}

/// The private key of a PEM file (PKCS#8, PKCS#1 or SEC1).
pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, FileError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| FileError::new("private key", path, e))
}

/// The CA certificates of a PEM file as trust roots.
pub fn load_roots(what: &'static str, path: &Path) -> Result<RootCertStore, FileError> {
    let mut roots = RootCertStore::empty();
    for cert in load_certs(what, path)? {
        roots.add(cert).map_err(|e| FileError::new(what, path, e))?;
    }
    Ok(roots)
}

/// The ring crypto provider every TLS configuration of the project uses, AES-128-GCM first:
/// tensors are bulk data, and AES-128 encrypts them faster than AES-256 at a strength still
/// beyond reach (the other suites stay, for peers that want them).
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    use rustls::CipherSuite::{TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, TLS13_AES_128_GCM_SHA256};
    let mut p = rustls::crypto::ring::default_provider();
    p.cipher_suites.sort_by_key(|s| {
        !matches!(
            s.suite(),
            TLS13_AES_128_GCM_SHA256 | TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256
        )
    });
    Arc::new(p)
}

/// A value built from files and built again when one of them changes (checked at most once a
/// second, when the value is asked for). A change that does not load keeps the last good value
/// and is reported once per change.
pub struct Reloading<T> {
    paths: Vec<PathBuf>,
    load: Box<dyn Fn() -> Result<T, FileError> + Send + Sync>,
    state: Mutex<ReloadState<T>>,
}

struct ReloadState<T> {
    current: Arc<T>,
    stamps: Vec<Option<SystemTime>>,
    checked: Instant,
}

impl<T> fmt::Debug for Reloading<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reloading")
            .field("paths", &self.paths)
            .finish()
    }
}

fn stamps(paths: &[PathBuf]) -> Vec<Option<SystemTime>> {
    paths
        .iter()
        .map(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
        .collect()
}

impl<T> Reloading<T> {
    /// Loads the value now (an error here is the caller's to report) from `paths`.
    pub fn new(
        paths: Vec<PathBuf>,
        load: impl Fn() -> Result<T, FileError> + Send + Sync + 'static,
    ) -> Result<Self, FileError> {
        let stamps = stamps(&paths);
        let current = Arc::new(load()?);
        Ok(Self {
            paths,
            load: Box::new(load),
            state: Mutex::new(ReloadState {
                current,
                stamps,
                checked: Instant::now(),
            }),
        })
    }

    /// The current value, reloaded first if a file changed since it was built.
    pub fn get(&self) -> Arc<T> {
        let mut st = self.state.lock();
        if st.checked.elapsed() < RECHECK {
            return st.current.clone();
        }
        st.checked = Instant::now();
        let now = stamps(&self.paths);
        if now != st.stamps {
            st.stamps = now;
            match (self.load)() {
                Ok(v) => {
                    st.current = Arc::new(v);
                    tracing::info!(files = ?self.paths, "files changed; reloaded");
                }
                Err(e) => {
                    tracing::error!(error = %e, "files changed but do not load; keeping the previous ones");
                }
            }
        }
        st.current.clone()
    }
}

/// The client side's files: the CA that signed the servers' certificates and, for mutual TLS,
/// this client's certificate chain and key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientTlsFiles {
    pub ca: PathBuf,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
}

/// TLS for a client's connections: cheap to clone; reloads its files when they change.
#[derive(Debug, Clone)]
pub struct ClientTls {
    config: Arc<Reloading<rustls::ClientConfig>>,
}

impl ClientTls {
    /// Loads the files now: a missing or bad file is an error here, not at the first call.
    pub fn new(files: ClientTlsFiles) -> Result<Self, FileError> {
        if files.cert.is_some() != files.key.is_some() {
            let path = files.cert.clone().or(files.key.clone()).unwrap_or_default();
            return Err(FileError::new(
                "client certificate",
                &path,
                "a client certificate needs both --tls-cert and --tls-key",
            ));
        }
        let mut paths = vec![files.ca.clone()];
        paths.extend(files.cert.iter().cloned());
        paths.extend(files.key.iter().cloned());
        let config = Reloading::new(paths, move || client_config(&files))?;
        Ok(Self {
            config: Arc::new(config),
        })
    }

    /// The TLS handshake over `tcp` with the server named `host` (a DNS name or an IP
    /// address, which its certificate must carry), within [`HANDSHAKE_TIMEOUT`].
    pub async fn connect(
        &self,
        tcp: TcpStream,
        host: &str,
    ) -> io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let name = ServerName::try_from(host.to_owned())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("{host}: {e}")))?;
        let connector = tokio_rustls::TlsConnector::from(self.config.get());
        match tokio::time::timeout(HANDSHAKE_TIMEOUT, connector.connect(name, tcp)).await {
            Ok(r) => r,
            Err(_) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "TLS handshake timed out",
            )),
        }
    }
}

fn client_config(files: &ClientTlsFiles) -> Result<rustls::ClientConfig, FileError> {
    let roots = load_roots("CA certificate (--tls-ca)", &files.ca)?;
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| FileError::new("TLS versions", &files.ca, e))?
        .with_root_certificates(roots);
    let mut config = match (&files.cert, &files.key) {
        (Some(cert), Some(key)) => builder
            .with_client_auth_cert(
                load_certs("certificate (--tls-cert)", cert)?,
                load_key(key)?,
            )
            .map_err(|e| FileError::new("certificate (--tls-cert)", cert, e))?,
        _ => builder.with_no_client_auth(),
    };
    // gRPC is HTTP/2; the bulk stream ignores the protocol.
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

/// A connection: plain TCP, or TLS over it (either side's).
#[derive(Debug)]
pub enum Conn {
    Plain(TcpStream),
    Client(Box<tokio_rustls::client::TlsStream<TcpStream>>),
    Server(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

/// The most bytes a reader of a large body asks to be woken for at once
/// ([`Conn::wake_after`]).
pub const WAKE_BYTES: usize = 256 << 10;

impl Conn {
    /// Asks the kernel to wake a reader of this connection only once `bytes` have arrived
    /// (or the peer closed), at most [`WAKE_BYTES`], rather than for every segment: a body of
    /// megabytes on loopback arrives in segments of 64 KiB, and each wake-up is a context
    /// switch on cores the sender needs too. A reader expecting `n` more bytes sets
    /// `min(n, WAKE_BYTES)` before each read and 1 when the body is in; a larger value would
    /// wait for bytes that never come. Plain TCP only (a TLS record's length is not the
    /// body's); best effort (a failure changes nothing but the wake-ups).
    pub fn wake_after(&self, bytes: usize) {
        let Conn::Plain(tcp) = self else {
            return;
        };
        let bytes = libc::c_int::try_from(bytes.clamp(1, WAKE_BYTES)).unwrap_or(1);
        let fd = std::os::fd::AsRawFd::as_raw_fd(tcp);
        #[allow(unsafe_code)]
        // SAFETY: `fd` is this stream's open socket for the call's duration, and the option's
        // value is a valid c_int whose size is passed with it.
        unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_RCVLOWAT,
                (&raw const bytes).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
    }

    /// Fills `buf` from the connection, woken once per [`WAKE_BYTES`] of it
    /// ([`Conn::wake_after`]) rather than once per segment.
    pub async fn read_body(&mut self, buf: &mut [u8]) -> io::Result<()> {
        use tokio::io::AsyncReadExt;
        let mut filled = 0;
        let mut asked = 0;
        let read = async {
            while filled < buf.len() {
                let want = (buf.len() - filled).min(WAKE_BYTES);
                if want != asked {
                    self.wake_after(want);
                    asked = want;
                }
                match self.read(&mut buf[filled..]).await? {
                    0 => return Err(io::Error::from(io::ErrorKind::UnexpectedEof)),
                    n => filled += n,
                }
            }
            Ok(())
        };
        let result = read.await;
        if asked > 1 {
            self.wake_after(1);
        }
        result
    }

    /// The TCP stream under it (for socket options and addresses).
    pub fn tcp(&self) -> &TcpStream {
        match self {
            Conn::Plain(s) => s,
            Conn::Client(s) => s.get_ref().0,
            Conn::Server(s) => s.get_ref().0,
        }
    }

    /// A connection to `addr` (`host:port`), with TLS when `tls` is given, within `timeout`
    /// for the TCP connect (the handshake has its own).
    pub async fn connect(
        addr: &str,
        host: &str,
        tls: Option<&ClientTls>,
        timeout: Duration,
    ) -> io::Result<Conn> {
        let tcp = tokio::time::timeout(timeout, TcpStream::connect(addr))
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "connect timed out"))??;
        let _ = tcp.set_nodelay(true);
        match tls {
            None => Ok(Conn::Plain(tcp)),
            Some(tls) => Ok(Conn::Client(Box::new(tls.connect(tcp, host).await?))),
        }
    }
}

macro_rules! each {
    ($self:ident, $s:ident => $e:expr) => {
        match $self.get_mut() {
            Conn::Plain($s) => {
                let $s = Pin::new($s);
                $e
            }
            Conn::Client($s) => {
                let $s = Pin::new(&mut **$s);
                $e
            }
            Conn::Server($s) => {
                let $s = Pin::new(&mut **$s);
                $e
            }
        }
    };
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        each!(self, s => s.poll_read(cx, buf))
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        each!(self, s => s.poll_write(cx, buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        each!(self, s => s.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Conn::Plain(s) => s.is_write_vectored(),
            Conn::Client(s) => s.is_write_vectored(),
            Conn::Server(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        each!(self, s => s.poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        each!(self, s => s.poll_shutdown(cx))
    }
}

/// What tonic's channel connects through when TLS is on: TCP to the URI's host and port, then
/// the handshake with the host's name.
#[derive(Debug, Clone)]
pub(crate) struct TlsConnector {
    pub(crate) tls: ClientTls,
}

impl tower_service::Service<http::Uri> for TlsConnector {
    type Response = hyper_util::rt::TokioIo<Conn>;
    type Error = io::Error;
    type Future = futures::future::BoxFuture<'static, io::Result<Self::Response>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let tls = self.tls.clone();
        Box::pin(async move {
            let host = uri
                .host()
                .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no host in the URI"))?
                .to_owned();
            let port = uri.port_u16().unwrap_or(443);
            let addr = format!("{host}:{port}");
            // The endpoint's connect timeout bounds the whole connect, handshake included.
            let conn = Conn::connect(&addr, &host, Some(&tls), HANDSHAKE_TIMEOUT).await?;
            Ok(hyper_util::rt::TokioIo::new(conn))
        })
    }
}

/// A lazily connecting channel to `endpoint`: through TLS when `tls` is given.
pub fn channel(
    endpoint: &tonic::transport::Endpoint,
    tls: Option<&ClientTls>,
) -> tonic::transport::Channel {
    match tls {
        None => endpoint.connect_lazy(),
        Some(tls) => endpoint.connect_with_connector_lazy(TlsConnector { tls: tls.clone() }),
    }
}
