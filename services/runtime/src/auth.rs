//! Who may call what. With `--auth-tokens FILE` a service admits a call only from a known
//! caller: one whose bearer token (the `authorization` metadata, or the bulk stream's header)
//! hashes to an entry of the file, or, with mutual TLS, whose client certificate carries an
//! entry's `cert_name`. The entry's role says which methods it may call ([`allowed`]), its jobs
//! which jobs and tables (`<job>/...`) it may touch; handlers check the latter with
//! [`Caller`]. No credentials: `unauthenticated`; a known caller out of its role or jobs:
//! `permission_denied`. Without the flag every call is admitted as [`Caller::Open`].
//!
//! An entry may limit its caller (`max_in_flight` calls at once, `max_calls_per_second`, over
//! every connection it makes): a call over either is answered `resource_exhausted` with the
//! reason `CALLER_LIMIT` at once, without queueing, so that one flooding tenant takes its own
//! share and no more (the SDK retries such a call after its backoff).
//!
//! The file is read again when it changes (at most once a second), so tokens are added and
//! revoked without a restart. It holds SHA-256 hashes, never tokens:
//!
//! ```toml
//! [[token]]
//! name = "trainer-fmnist"          # who, in logs and refusals; binds worker and client ids
//! role = "worker"                  # worker | operator | shard | reader
//! jobs = ["fmnist"]                # or ["*"]: every job (cluster-wide methods need it)
//! sha256 = "<64 hex digits>"       # of the token; `psctl token` makes both
//! cert_name = "trainer.ps.local"   # optional: a client certificate's DNS name that stands in
//! max_in_flight = 64               # optional: calls at once
//! max_calls_per_second = 5000      # optional: a token bucket, one second of burst
//! ```

use std::collections::HashMap;
use std::convert::Infallible;
use std::fmt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use ps_client::tls::{FileError, Reloading};
use serde::Deserialize;
use tonic::body::Body;
use tonic::{Code, Status};
use tower_service::Service;

use crate::tls::Peer;

/// What a caller is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Trains: joins its jobs, reports clocks, pushes to and pulls from their tables.
    Worker,
    /// Runs the cluster: jobs, tables, checkpoints (the scheduler's own token is one).
    Operator,
    /// A shard: registers with the scheduler and heartbeats.
    Shard,
    /// Watches: pulls, statistics, job status.
    Reader,
}

impl Role {
    pub const ALL: [Role; 4] = [Role::Worker, Role::Operator, Role::Shard, Role::Reader];

    /// The role named `name` (`worker`, `operator`, `shard`, `reader`).
    pub fn parse(name: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|r| r.as_str() == name)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Worker => "worker",
            Role::Operator => "operator",
            Role::Shard => "shard",
            Role::Reader => "reader",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

use Role::{Operator, Reader, Shard, Worker};

/// The roles that may call `path` (`/ps.v1.ParameterServer/PushDense`); `None`: a method every
/// caller may use without credentials (health checks, reflection). A method of ours missing
/// here is refused to everyone.
pub fn allowed(path: &str) -> Option<&'static [Role]> {
    let (service, method) = ps_client::trace::rpc_name(path);
    const ANY: &[Role] = &[Worker, Operator, Shard, Reader];
    const NONE: &[Role] = &[];
    Some(match (service, method) {
        ("grpc.health.v1.Health", _)
        | ("grpc.reflection.v1.ServerReflection", _)
        | ("grpc.reflection.v1alpha.ServerReflection", _) => return None,
        ("ps.v1.ParameterServer", m) => match m {
            "ShardInfo" => ANY,
            "DescribeTable" | "ListTables" => &[Worker, Operator, Reader],
            "PushDense" | "PushSparse" => &[Worker],
            "PullDense" | "PullSparse" => &[Worker, Reader],
            "CreateTable" | "DropTable" | "Checkpoint" | "RestoreCheckpoint"
            | "DeleteCheckpoint" => &[Operator],
            "GetStats" | "ExportCheckpoint" => &[Operator, Reader],
            _ => NONE,
        },
        ("ps.v1.Scheduler", m) => match m {
            "GetShardMap" => ANY,
            "GetJob" | "ListJobs" | "ListCheckpoints" => &[Worker, Operator, Reader],
            "SubmitJob" | "CancelJob" | "CheckpointJob" | "ResumeJob" | "DeleteCheckpoint" => {
                &[Operator]
            }
            "RegisterShard" | "ShardHeartbeat" => &[Shard],
            "JoinJob" | "WorkerHeartbeat" | "AdvanceClock" | "LeaveJob" => &[Worker],
            _ => NONE,
        },
        _ => NONE,
    })
}

/// The jobs an entry may touch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Jobs {
    All,
    Only(Vec<String>),
}

impl Jobs {
    fn contains(&self, job: &str) -> bool {
        match self {
            Jobs::All => true,
            Jobs::Only(jobs) => jobs.iter().any(|j| j == job),
        }
    }
}

/// A known caller: an entry of the tokens file.
#[derive(Debug)]
pub struct Identity {
    pub name: String,
    pub role: Role,
    pub jobs: Jobs,
    /// Its limits, shared by all its calls; none when the entry sets none.
    pub limits: Option<Limiter>,
}

/// One caller's limits: calls in flight, and a token bucket of calls per second.
#[derive(Debug)]
pub struct Limiter {
    in_flight: Arc<tokio::sync::Semaphore>,
    max_in_flight: u32,
    rate: Option<Bucket>,
}

/// A token bucket of calls per second, with one second of burst.
#[derive(Debug)]
pub struct Bucket {
    rate: f64,
    /// (tokens, when last filled).
    state: parking_lot::Mutex<(f64, std::time::Instant)>,
}

impl Bucket {
    pub fn new(rate: f64) -> Self {
        Self {
            rate,
            state: parking_lot::Mutex::new((rate, std::time::Instant::now())),
        }
    }

    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// Takes a token when there is one.
    pub fn take(&self) -> bool {
        let mut b = self.state.lock();
        let now = std::time::Instant::now();
        b.0 = (b.0 + now.duration_since(b.1).as_secs_f64() * self.rate).min(self.rate.max(1.0));
        b.1 = now;
        if b.0 < 1.0 {
            return false;
        }
        b.0 -= 1.0;
        true
    }
}

/// Refuses a call to `path` (health and reflection aside) on a connection over its rate
/// (`--connection-calls-per-second`), whoever the caller: `resource_exhausted`, CALLER_LIMIT.
pub fn admit_connection(path: &str, peer: Option<&Peer>) -> Result<(), Status> {
    match peer.and_then(|p| p.rate.as_ref().map(|r| (p, r))) {
        Some((p, rate)) if allowed(path).is_some() && !rate.take() => Err(over(
            &format!(
                "the connection from {}",
                p.addr.map_or("?".to_owned(), |a| a.to_string())
            ),
            format!("{} calls per second", rate.rate()),
        )),
        _ => Ok(()),
    }
}

/// A call's place in its caller's limit, held until it is answered.
#[derive(Debug)]
pub struct Admission {
    _permit: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl Limiter {
    fn new(max_in_flight: Option<u32>, rate: Option<f64>) -> Self {
        let max = max_in_flight.unwrap_or(u32::MAX >> 3);
        Self {
            in_flight: Arc::new(tokio::sync::Semaphore::new(max as usize)),
            max_in_flight: max,
            rate: rate.map(Bucket::new),
        }
    }

    /// A place for one more call, or `resource_exhausted` (CALLER_LIMIT) naming the limit.
    fn admit(&self, who: &str) -> Result<Admission, Status> {
        if let Some(rate) = &self.rate
            && !rate.take()
        {
            return Err(over(who, format!("{} calls per second", rate.rate())));
        }
        match self.in_flight.clone().try_acquire_owned() {
            Ok(p) => Ok(Admission { _permit: Some(p) }),
            Err(_) => Err(over(who, format!("{} calls in flight", self.max_in_flight))),
        }
    }
}

fn over(who: &str, limit: String) -> Status {
    crate::metrics::auth_refused(Code::ResourceExhausted);
    crate::status::refusal(
        Code::ResourceExhausted,
        ps_core::wire::reason::CALLER_LIMIT,
        format!("`{who}` is over its limit of {limit}; retry after a pause"),
        [("caller", who.to_owned()), ("limit", limit)],
    )
}

/// Who made a call, as the handlers see it.
#[derive(Debug, Clone)]
pub enum Caller {
    /// The service checks no credentials: every call is admitted.
    Open,
    Known(Arc<Identity>),
}

impl Caller {
    /// The caller of `req`, as the auth layer (or the bulk stream) left it.
    pub fn of<T>(req: &tonic::Request<T>) -> Caller {
        req.extensions()
            .get::<Caller>()
            .cloned()
            .unwrap_or(Caller::Open)
    }

    /// Who, for binding ids to it: empty for [`Caller::Open`].
    pub fn name(&self) -> &str {
        match self {
            Caller::Open => "",
            Caller::Known(id) => &id.name,
        }
    }

    pub fn role(&self) -> Option<Role> {
        match self {
            Caller::Open => None,
            Caller::Known(id) => Some(id.role),
        }
    }

    /// Refuses a caller whose jobs do not include `job`.
    pub fn may_touch_job(&self, job: &str) -> Result<(), Status> {
        match self {
            Caller::Open => Ok(()),
            Caller::Known(id) if id.jobs.contains(job) => Ok(()),
            Caller::Known(id) => Err(denied(format!(
                "`{}` ({}) may not touch job `{job}`",
                id.name, id.role
            ))),
        }
    }

    /// Refuses a caller who may not touch `table`: a table is its job's when named
    /// `<job>/...`; one without a job needs every job.
    pub fn may_touch_table(&self, table: &str) -> Result<(), Status> {
        match table.split_once('/') {
            Some((job, _)) => self.may_touch_job(job),
            None => self.cluster_wide(&format!("table `{table}`, which belongs to no job,")),
        }
    }

    /// Refuses a caller limited to some jobs: `what` spans them all.
    pub fn cluster_wide(&self, what: &str) -> Result<(), Status> {
        match self {
            Caller::Known(id) if id.jobs != Jobs::All => Err(denied(format!(
                "`{}` ({}) is limited to jobs {:?}; {what} needs a token for every job",
                id.name,
                id.role,
                match &id.jobs {
                    Jobs::Only(j) => j.as_slice(),
                    Jobs::All => &[],
                }
            ))),
            _ => Ok(()),
        }
    }

    /// A client-chosen id (a push's client id, a delta-pull replica's) as the service keeps
    /// it: the caller's own, so that no caller can act under another's. Open: as given.
    pub fn own_id(&self, id: u64) -> u64 {
        match self {
            Caller::Open => id,
            Caller::Known(who) => {
                ps_core::hash::combine(ps_core::hash::fnv1a(who.name.as_bytes()), id).max(1)
            }
        }
    }
}

fn denied(msg: String) -> Status {
    crate::metrics::auth_refused(Code::PermissionDenied);
    Status::permission_denied(msg)
}

fn unauthenticated(msg: &str) -> Status {
    crate::metrics::auth_refused(Code::Unauthenticated);
    Status::unauthenticated(msg.to_owned())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenFile {
    #[serde(default)]
    token: Vec<Entry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    name: String,
    role: Role,
    #[serde(default)]
    jobs: Vec<String>,
    sha256: Option<String>,
    cert_name: Option<String>,
    max_in_flight: Option<u32>,
    max_calls_per_second: Option<f64>,
}

/// The tokens file, loaded: callers by token hash and by certificate name.
#[derive(Debug, Default)]
pub struct Tokens {
    by_hash: HashMap<[u8; 32], Arc<Identity>>,
    by_cert: HashMap<String, Arc<Identity>>,
}

/// SHA-256 of a token: what the tokens file holds.
pub fn token_hash(token: &str) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

/// A new random token: 32 bytes from the system's generator, as hex.
pub fn new_token() -> std::io::Result<String> {
    use ring::rand::SecureRandom as _;
    let mut b = [0u8; 32];
    ring::rand::SystemRandom::new()
        .fill(&mut b)
        .map_err(|_| std::io::Error::other("the system's random generator failed"))?;
    Ok(hex(&b))
}

/// The tokens-file entry of `token`, held by `name` in `role` for `jobs` (`*`: every job): its
/// SHA-256, never the token.
pub fn token_entry(name: &str, role: Role, jobs: &[String], token: &str) -> String {
    let jobs = jobs
        .iter()
        .map(|j| format!("{j:?}"))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "[[token]]\nname = {name:?}\nrole = \"{role}\"\njobs = [{jobs}]\nsha256 = \"{}\"\n",
        hex(&token_hash(token))
    )
}

/// Lower-case hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

impl Tokens {
    /// Parses and checks a tokens file's text.
    pub fn parse(text: &str) -> Result<Self, String> {
        let file: TokenFile = toml::from_str(text).map_err(|e| e.to_string())?;
        let mut tokens = Tokens::default();
        let mut names = std::collections::HashSet::new();
        for e in file.token {
            let at = format!("token `{}`", e.name);
            if e.name.is_empty() || e.name.len() > 128 || e.name.chars().any(char::is_control) {
                return Err("a token's name is 1 to 128 printable characters".into());
            }
            if !names.insert(e.name.clone()) {
                return Err(format!("{at}: the name appears twice"));
            }
            if e.sha256.is_none() && e.cert_name.is_none() {
                return Err(format!(
                    "{at}: give sha256 (a bearer token), cert_name, or both"
                ));
            }
            let jobs = if e.jobs.iter().any(|j| j == "*") {
                Jobs::All
            } else if e.jobs.is_empty() && e.role != Role::Shard {
                return Err(format!(
                    "{at}: jobs is empty; list the jobs it may touch, or [\"*\"] for every job"
                ));
            } else {
                Jobs::Only(e.jobs.clone())
            };
            // A shard serves every job's tables.
            let jobs = if e.role == Role::Shard {
                Jobs::All
            } else {
                jobs
            };
            if e.max_in_flight == Some(0)
                || e.max_calls_per_second
                    .is_some_and(|r| !(r.is_finite() && r > 0.0))
            {
                return Err(format!(
                    "{at}: max_in_flight and max_calls_per_second are above 0 when set"
                ));
            }
            let limits = (e.max_in_flight.is_some() || e.max_calls_per_second.is_some())
                .then(|| Limiter::new(e.max_in_flight, e.max_calls_per_second));
            let id = Arc::new(Identity {
                name: e.name.clone(),
                role: e.role,
                jobs,
                limits,
            });
            if let Some(h) = &e.sha256 {
                let h = unhex(&h.to_ascii_lowercase())
                    .ok_or_else(|| format!("{at}: sha256 is not 64 hex digits"))?;
                if tokens.by_hash.insert(h, id.clone()).is_some() {
                    return Err(format!("{at}: the same token hash appears twice"));
                }
            }
            if let Some(c) = &e.cert_name
                && tokens.by_cert.insert(c.clone(), id.clone()).is_some()
            {
                return Err(format!("{at}: cert_name `{c}` appears twice"));
            }
        }
        Ok(tokens)
    }

    fn load(path: &Path) -> Result<Self, FileError> {
        let text =
            std::fs::read_to_string(path).map_err(|e| FileError::new("tokens file", path, e))?;
        Self::parse(&text).map_err(|e| FileError::new("tokens file", path, e))
    }
}

/// The credentials check of one service: cheap to clone.
#[derive(Debug, Clone)]
pub struct Auth {
    tokens: Arc<Reloading<Tokens>>,
}

impl Auth {
    /// Loads the tokens file now: a missing or bad file stops the service at start-up.
    pub fn load(path: PathBuf) -> Result<Self, FileError> {
        let p = path.clone();
        let tokens = Reloading::new(vec![path], move || Tokens::load(&p))?;
        Ok(Self {
            tokens: Arc::new(tokens),
        })
    }

    /// Who calls, from the `authorization` value (`Bearer <token>`) or the peer's certificate,
    /// whether their role may call `path`, and whether their limits have room for the call
    /// (the [`Admission`] holds its place until dropped). A token, when given, decides: a
    /// wrong token is refused even with a good certificate.
    pub fn admit(
        &self,
        path: &str,
        authorization: Option<&str>,
        peer: Option<&Peer>,
    ) -> Result<(Caller, Admission), Status> {
        let Some(roles) = allowed(path) else {
            return Ok((Caller::Open, Admission { _permit: None }));
        };
        let tokens = self.tokens.get();
        let id = match authorization.filter(|a| !a.is_empty()) {
            Some(a) => {
                let token = a
                    .strip_prefix("Bearer ")
                    .or_else(|| a.strip_prefix("bearer "))
                    .ok_or_else(|| {
                        unauthenticated("the authorization metadata is not `Bearer <token>`")
                    })?;
                tokens
                    .by_hash
                    .get(&token_hash(token.trim()))
                    .ok_or_else(|| unauthenticated("unknown token"))?
            }
            None => peer
                .into_iter()
                .flat_map(|p| p.cert_names.iter())
                .find_map(|n| tokens.by_cert.get(n))
                .ok_or_else(|| {
                    unauthenticated(
                        "this service needs credentials: a bearer token in the authorization \
                         metadata, or a client certificate named in its tokens file",
                    )
                })?,
        };
        if !roles.contains(&id.role) {
            return Err(denied(format!(
                "`{}` is a {} and may not call {}",
                id.name,
                id.role,
                path.trim_start_matches('/')
            )));
        }
        let admission = match &id.limits {
            Some(l) => l.admit(&id.name)?,
            None => Admission { _permit: None },
        };
        Ok((Caller::Known(id.clone()), admission))
    }
}

/// The tower layer that runs [`admit_connection`] and [`Auth::admit`] on every gRPC call and
/// leaves the [`Caller`] in the request's extensions; a refusal is answered without reaching
/// the service.
#[derive(Debug, Clone)]
pub struct AuthLayer(pub Option<Auth>);

impl<S> tower::Layer<S> for AuthLayer {
    type Service = AuthService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        AuthService {
            inner,
            auth: self.0.clone(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct AuthService<S> {
    inner: S,
    auth: Option<Auth>,
}

impl<S> Service<http::Request<Body>> for AuthService<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<http::Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<Body>) -> Self::Future {
        if let Err(status) = admit_connection(req.uri().path(), req.extensions().get::<Peer>()) {
            return Box::pin(async move { Ok(status.into_http()) });
        }
        if let Some(auth) = &self.auth {
            let authorization = req
                .headers()
                .get(http::header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok());
            match auth.admit(
                req.uri().path(),
                authorization,
                req.extensions().get::<Peer>(),
            ) {
                Ok((caller, admission)) => {
                    req.extensions_mut().insert(caller);
                    let call = self.inner.call(req);
                    return Box::pin(async move {
                        let answer = call.await;
                        drop(admission);
                        answer
                    });
                }
                Err(status) => return Box::pin(async move { Ok(status.into_http()) }),
            }
        }
        Box::pin(self.inner.call(req))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auth(text: &str) -> (tempfile::TempDir, Auth) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("tokens.toml");
        std::fs::write(&p, text).unwrap();
        let a = Auth::load(p).unwrap();
        (dir, a)
    }

    #[test]
    fn tokens_admit_by_role_and_refuse_strangers() {
        let t = "a-worker-token-0123456789";
        // The entry as psctl token prints it.
        let (_d, a) = auth(&token_entry("w", Role::Worker, &["j".to_owned()], t));
        let push = "/ps.v1.ParameterServer/PushDense";
        let (c, _) = a.admit(push, Some(&format!("Bearer {t}")), None).unwrap();
        assert_eq!(c.name(), "w");
        c.may_touch_table("j/w0").unwrap();
        assert_eq!(
            c.may_touch_table("k/w0").unwrap_err().code(),
            Code::PermissionDenied
        );
        assert_eq!(
            c.may_touch_table("w0").unwrap_err().code(),
            Code::PermissionDenied
        );
        let drop = "/ps.v1.ParameterServer/DropTable";
        let e = a
            .admit(drop, Some(&format!("Bearer {t}")), None)
            .unwrap_err();
        assert_eq!(e.code(), Code::PermissionDenied);
        let e = a.admit(push, None, None).unwrap_err();
        assert_eq!(e.code(), Code::Unauthenticated);
        let e = a
            .admit(push, Some("Bearer not-a-known-token-at-all"), None)
            .unwrap_err();
        assert_eq!(e.code(), Code::Unauthenticated);
        let e = a.admit(push, Some(t), None).unwrap_err();
        assert_eq!(e.code(), Code::Unauthenticated);
        // Health checks need nothing.
        a.admit("/grpc.health.v1.Health/Check", None, None).unwrap();
        // Ids are the caller's own.
        assert_ne!(c.own_id(7), 7);
        assert_eq!(Caller::Open.own_id(7), 7);
    }

    #[test]
    fn a_caller_over_its_limits_is_refused_at_once_and_admitted_again_when_under() {
        let t = "a-flooding-token-0123456789";
        let (_d, a) = auth(&format!(
            "{}max_in_flight = 2\nmax_calls_per_second = 3\n",
            token_entry("f", Role::Worker, &["*".to_owned()], t)
        ));
        let bearer = format!("Bearer {t}");
        let pull = "/ps.v1.ParameterServer/PullDense";
        let first = a.admit(pull, Some(&bearer), None).unwrap();
        let second = a.admit(pull, Some(&bearer), None).unwrap();
        let e = a.admit(pull, Some(&bearer), None).unwrap_err();
        assert_eq!(e.code(), Code::ResourceExhausted);
        assert!(e.message().contains("2 calls in flight"), "{e:?}");
        drop((first, second));
        // Three calls in the second so far (one refused by the in-flight limit after taking a
        // token): the bucket is empty now.
        let e = a.admit(pull, Some(&bearer), None).unwrap_err();
        assert!(e.message().contains("3 calls per second"), "{e:?}");
        std::thread::sleep(std::time::Duration::from_millis(400));
        a.admit(pull, Some(&bearer), None).unwrap();
        // Limits are per caller: a health check is no call of the caller's.
        a.admit("/grpc.health.v1.Health/Check", None, None).unwrap();
    }

    #[test]
    fn a_certificate_name_stands_in_for_a_token() {
        let (_d, a) = auth("[[token]]\nname = \"s\"\nrole = \"shard\"\ncert_name = \"shard.ps\"\n");
        let peer = Peer {
            addr: None,
            cert_names: vec!["other".to_owned(), "shard.ps".to_owned()].into(),
            rate: None,
        };
        let (c, _) = a
            .admit("/ps.v1.Scheduler/RegisterShard", None, Some(&peer))
            .unwrap();
        assert_eq!(c.role(), Some(Role::Shard));
        let e = a
            .admit("/ps.v1.Scheduler/SubmitJob", None, Some(&peer))
            .unwrap_err();
        assert_eq!(e.code(), Code::PermissionDenied);
    }

    #[test]
    fn bad_token_files_are_refused_with_the_reason() {
        for (text, why) in [
            (
                "[[token]]\nname = \"a\"\nrole = \"worker\"\njobs = [\"j\"]\n",
                "sha256",
            ),
            (
                "[[token]]\nname = \"a\"\nrole = \"worker\"\nsha256 = \"00\"\n",
                "jobs is empty",
            ),
            (
                "[[token]]\nname = \"a\"\nrole = \"king\"\njobs = [\"*\"]\ncert_name = \"x\"\n",
                "unknown variant",
            ),
            (
                "[[token]]\nname = \"a\"\nrole = \"reader\"\njobs = [\"*\"]\nsha256 = \"zz\"\n",
                "64 hex",
            ),
        ] {
            let e = Tokens::parse(text).unwrap_err();
            assert!(e.contains(why), "{text}: {e}");
        }
    }
}
