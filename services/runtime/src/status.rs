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

/// Longest message a status carries, and longest metadata value: a status travels in HTTP/2
/// headers, which clients cap (16 KiB by default), and a message quoting a 10 KB name sent by
/// the caller must not turn a refusal into a protocol error.
const MAX_MESSAGE: usize = 1024;
const MAX_VALUE: usize = 256;

/// `s` cut to at most `max` bytes on a character boundary, marked when cut.
fn bounded(s: String, max: usize) -> String {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes in all)", &s[..end], s.len())
}

/// A status with `code`, `message` and an `ErrorInfo` of `reason` and `metadata`.
pub fn refusal<'a>(
    code: Code,
    reason: &str,
    message: impl Into<String>,
    metadata: impl IntoIterator<Item = (&'a str, String)>,
) -> Status {
    let metadata: HashMap<String, String> = metadata
        .into_iter()
        .map(|(k, v)| (k.to_owned(), bounded(v, MAX_VALUE)))
        .collect();
    Status::with_error_details(
        code,
        bounded(message.into(), MAX_MESSAGE),
        ErrorDetails::with_error_info(reason, ERROR_DOMAIN, metadata),
    )
}

/// `invalid_argument` for a field of a request, with `ErrorInfo` (`INVALID_FIELD`, `field`)
/// and a `BadRequest` naming the field.
pub fn invalid_field(e: &ValidationError) -> Status {
    let field = bounded(e.field.clone(), MAX_VALUE);
    let mut details = ErrorDetails::with_error_info(
        reason::INVALID_FIELD,
        ERROR_DOMAIN,
        HashMap::from([("field".to_owned(), field.clone())]),
    );
    details.add_bad_request_violation(field, bounded(e.reason.clone(), MAX_MESSAGE));
    Status::with_error_details(
        Code::InvalidArgument,
        bounded(e.to_string(), MAX_MESSAGE),
        details,
    )
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

    #[test]
    fn a_long_message_or_value_is_cut_to_fit_the_headers() {
        let name = "é".repeat(6000);
        let s = refusal(
            Code::NotFound,
            reason::JOB_NOT_FOUND,
            format!("no job `{name}`"),
            [("job", name.clone())],
        );
        assert!(
            s.message().len() < MAX_MESSAGE + 64,
            "{}",
            s.message().len()
        );
        assert!(s.message().ends_with("bytes in all)"));
        let info = s.get_details_error_info().unwrap();
        assert!(info.metadata["job"].len() < MAX_VALUE + 64);
        let s = invalid_field(&ValidationError::new("name", name));
        assert!(s.message().len() < MAX_MESSAGE + 64);
    }
}
