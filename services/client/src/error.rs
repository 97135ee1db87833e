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
/// as `cancelled` when the shard's process died while the request was in flight: this client
/// still awaits the call, so nobody on its side cancelled it, or as `internal` when the server
/// closed the HTTP/2 connection under it, as a stopping scheduler does to a long poll). Retrying
/// a push is safe either way: it carries the same (client id, seq); so is a repeated clock
/// report.
pub(crate) fn is_transient(s: &tonic::Status) -> bool {
    match s.code() {
        tonic::Code::Unavailable | tonic::Code::Cancelled => true,
        // tonic's own status for an HTTP/2 stream or connection that ended without a gRPC
        // status: made on this side from the h2 error (its source), never sent by a server.
        tonic::Code::Internal => {
            std::error::Error::source(s).is_some() && s.message().starts_with("h2 protocol error")
        }
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

#[cfg(test)]
mod tests {
    use super::is_transient;
    use tonic::{Code, Status};

    /// A connection the server closed under a call (a scheduler stopping while a worker's long
    /// poll waits) comes back from tonic as `internal`, made from the h2 error: it is retried.
    /// The same code sent by a server is an answer, and is not.
    #[test]
    fn a_connection_closed_under_a_call_is_transient_and_a_servers_internal_is_not() {
        for reason in [
            h2::Reason::NO_ERROR,
            h2::Reason::PROTOCOL_ERROR,
            h2::Reason::INTERNAL_ERROR,
        ] {
            let cut = Status::from_error(Box::new(h2::Error::from(reason)));
            assert_eq!(cut.code(), Code::Internal, "{cut:?}");
            assert!(is_transient(&cut), "{cut:?}");
        }
        let refused = Status::from_error(Box::new(h2::Error::from(h2::Reason::REFUSED_STREAM)));
        assert_eq!(refused.code(), Code::Unavailable);
        assert!(is_transient(&refused));
        assert!(!is_transient(&Status::internal(
            "h2 protocol error: sent by a server"
        )));
        assert!(!is_transient(&Status::internal("the table's store failed")));
        assert!(!is_transient(&Status::invalid_argument("bad shape")));
    }
}
