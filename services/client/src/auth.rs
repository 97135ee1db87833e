//! Who a client is, to the services: its TLS settings (with, for mutual TLS, its certificate)
//! and its bearer token. The token goes in every gRPC call's `authorization` metadata
//! ([`Bearer`]) and in the bulk stream's request header; the services check it
//! (`ps_runtime::auth`).

use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::task::{Context, Poll};

use tower_service::Service;

use crate::ClientError;
use crate::tls::ClientTls;

/// A bearer token. Its `Debug` form does not show it.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(Arc<str>);

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(..)")
    }
}

impl Token {
    /// A token as given: printable ASCII without spaces, 16 to 4096 characters.
    pub fn new(token: &str) -> Result<Self, ClientError> {
        let token = token.trim();
        if !(16..=4096).contains(&token.len()) || !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(ClientError::InvalidInput(
                "a token is 16 to 4096 printable ASCII characters without spaces".into(),
            ));
        }
        Ok(Self(token.into()))
    }

    /// The token in the file at `path` (its first line).
    pub fn from_file(path: &Path) -> Result<Self, ClientError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            ClientError::InvalidInput(format!("token file `{}`: {e}", path.display()))
        })?;
        Self::new(text.lines().next().unwrap_or_default())
            .map_err(|e| ClientError::InvalidInput(format!("token file `{}`: {e}", path.display())))
    }

    pub fn secret(&self) -> &str {
        &self.0
    }

    /// The `authorization` header's value: `Bearer <token>`.
    pub fn header_value(&self) -> http::HeaderValue {
        let mut v = http::HeaderValue::from_str(&format!("Bearer {}", self.0))
            .unwrap_or_else(|_| http::HeaderValue::from_static(""));
        v.set_sensitive(true);
        v
    }
}

/// How a client proves who it is and checks whom it talks to. The default: plaintext and no
/// token.
#[derive(Debug, Clone, Default)]
pub struct Credentials {
    /// TLS on every connection when set.
    pub tls: Option<ClientTls>,
    /// Sent with every call when set.
    pub token: Option<Token>,
}

/// A gRPC channel whose every call carries the client's token in its `authorization` metadata.
#[derive(Debug, Clone)]
pub struct Bearer<S> {
    inner: S,
    value: Option<http::HeaderValue>,
}

impl<S> Bearer<S> {
    pub fn new(inner: S, token: Option<&Token>) -> Self {
        Self {
            inner,
            value: token.map(Token::header_value),
        }
    }
}

impl<S, B> Service<http::Request<B>> for Bearer<S>
where
    S: Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        if let Some(v) = &self.value {
            request
                .headers_mut()
                .insert(http::header::AUTHORIZATION, v.clone());
        }
        self.inner.call(request)
    }
}
