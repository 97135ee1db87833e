//! Refusals with their meaning attached. Every error status a service answers carries a
//! `google.rpc.ErrorInfo` (the gRPC richer error model): domain `ps.v1`, a reason from
//! [`ps_core::wire::reason`] and metadata such as the table or the epochs; a bad field also a
//! `google.rpc.BadRequest` that names it. Any gRPC client reads them from the
//! `grpc-status-details-bin` trailer, so none has to parse the message.

use std::collections::HashMap;

use ps_core::ValidationError;
use ps_core::wire::{ERROR_DOMAIN, reason};
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

/// A status with `code`, `message` and an `ErrorInfo` of `reason` and `metadata`.
pub fn refusal<'a>(
    code: Code,
    reason: &str,
    message: impl Into<String>,
    metadata: impl IntoIterator<Item = (&'a str, String)>,
) -> Status {
    let metadata: HashMap<String, String> = metadata
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
    Status::with_error_details(
        code,
        message,
        ErrorDetails::with_error_info(reason, ERROR_DOMAIN, metadata),
    )
}

/// `invalid_argument` for a field of a request, with `ErrorInfo` (`INVALID_FIELD`, `field`)
/// and a `BadRequest` naming the field.
pub fn invalid_field(e: &ValidationError) -> Status {
    let mut details = ErrorDetails::with_error_info(
        reason::INVALID_FIELD,
        ERROR_DOMAIN,
        HashMap::from([("field".to_owned(), e.field.clone())]),
    );
    details.add_bad_request_violation(e.field.clone(), e.reason.clone());
    Status::with_error_details(Code::InvalidArgument, e.to_string(), details)
}

/// The `ErrorInfo` reason of a status from one of the services, if it carries one.
pub fn reason_of(s: &Status) -> Option<String> {
    s.get_details_error_info()
        .filter(|i| i.domain == ERROR_DOMAIN)
        .map(|i| i.reason)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reason_and_field_survive_the_trailer() {
        let s = invalid_field(&ValidationError::new("spec.dense.shape", "is empty"));
        // What a client receives: the status rebuilt from its headers.
        let mut headers = http::HeaderMap::new();
        s.add_header(&mut headers).unwrap();
        let got = Status::from_header_map(&headers).unwrap();
        assert_eq!(got.code(), Code::InvalidArgument);
        assert_eq!(reason_of(&got).as_deref(), Some(reason::INVALID_FIELD));
        let bad = got.get_details_bad_request().unwrap();
        assert_eq!(bad.field_violations[0].field, "spec.dense.shape");
        let s = refusal(
            Code::FailedPrecondition,
            reason::STALE_MAP,
            "stale",
            [("request_epoch", "3".to_owned())],
        );
        let info = s.get_details_error_info().unwrap();
        assert_eq!(info.metadata["request_epoch"], "3");
        assert_eq!(reason_of(&Status::internal("plain")), None);
    }
}
