//! The client's typed errors.

/// What went wrong with a call, with the shard it came from.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// A shard answered with an error status (after any retries).
    #[error("shard {shard} ({endpoint}) answered {code:?}: {message}")]
    Status {
        shard: usize,
        endpoint: String,
        code: tonic::Code,
        /// The `google.rpc.ErrorInfo` reason the shard gave (`ps_core::wire::reason`).
        reason: Option<String>,
        message: String,
    },
    /// The scheduler answered with an error status (after any retries).
    #[error("scheduler ({endpoint}) answered {code:?}: {message}")]
    Scheduler {
        endpoint: String,
        code: tonic::Code,
        /// The `google.rpc.ErrorInfo` reason the scheduler gave (`ps_core::wire::reason`).
        reason: Option<String>,
        message: String,
    },
    /// The endpoint list does not describe the cluster.
    #[error("shard list does not match the cluster: {0}")]
    Topology(String),
    /// The scheduler's map lacks shards that have not registered (yet, or again after a
    /// restart): ask again later.
    #[error(
        "not every shard is registered with the scheduler yet (map epoch {epoch}: {registered} of {num_shards})"
    )]
    ShardsMissing {
        epoch: u64,
        registered: usize,
        num_shards: u32,
    },
    /// The caller's input is wrong before anything is sent.
    #[error("{0}")]
    InvalidInput(String),
    /// A shard answered something this client cannot read.
    #[error("unexpected answer: {0}")]
    Protocol(String),
}

impl ClientError {
    pub(crate) fn from_status(shard: usize, endpoint: &str, s: tonic::Status) -> Self {
        Self::Status {
            shard,
            endpoint: endpoint.to_owned(),
            code: s.code(),
            reason: reason_of(&s),
            message: s.message().to_owned(),
        }
    }

    pub(crate) fn from_scheduler(endpoint: &str, s: tonic::Status) -> Self {
        Self::Scheduler {
            endpoint: endpoint.to_owned(),
            code: s.code(),
            reason: reason_of(&s),
            message: s.message().to_owned(),
        }
    }

    /// The gRPC code when a service answered with an error.
    /// Whether asking again later may succeed: a service that cannot be reached now, or shards
    /// not registered yet.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, Self::ShardsMissing { .. }) || self.code() == Some(tonic::Code::Unavailable)
    }

    pub fn code(&self) -> Option<tonic::Code> {
        match self {
            Self::Status { code, .. } | Self::Scheduler { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// Why a service refused the call (`ps_core::wire::reason`), when it said.
    pub fn reason(&self) -> Option<&str> {
        match self {
            Self::Status { reason, .. } | Self::Scheduler { reason, .. } => reason.as_deref(),
            _ => None,
        }
    }
}

/// The `google.rpc.ErrorInfo` reason of a status from one of the services, if it carries one.
pub(crate) fn reason_of(s: &tonic::Status) -> Option<String> {
    use tonic_types::StatusExt;
    s.get_details_error_info()
        .filter(|i| i.domain == ps_core::wire::ERROR_DOMAIN)
        .map(|i| i.reason)
}

/// Whether a call may succeed if sent again: the shard said `unavailable`, or the connection
/// failed under the call (tonic reports that as `unknown` with a transport error as its source,
/// or as `cancelled` when the shard's process died while the request was in flight: this
/// client still awaits the call, so nobody on its side cancelled it). Retrying a push is safe
/// either way: it carries the same (client id, seq).
pub(crate) fn is_transient(s: &tonic::Status) -> bool {
    match s.code() {
        tonic::Code::Unavailable | tonic::Code::Cancelled => true,
        // Over the caller's own limits: the next attempt, after the backoff, may pass.
        tonic::Code::ResourceExhausted => {
            reason_of(s).as_deref() == Some(ps_core::wire::reason::CALLER_LIMIT)
        }
        tonic::Code::Unknown => {
            let mut source = std::error::Error::source(s);
            while let Some(e) = source {
                if e.is::<tonic::transport::Error>() || e.to_string().contains("connection") {
                    return true;
                }
                source = e.source();
            }
            s.message() == "transport error"
        }
        _ => false,
    }
}
