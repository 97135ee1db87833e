//! gRPC calls with the message as bytes: any method of the services by name, with a request
//! built from JSON through their descriptors or written byte by byte (the hostile-input corpus,
//! the method × role table of the security tests).

use std::str::FromStr;
use std::time::Duration;

use bytes::{Buf, BufMut};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::Channel;

/// Message bytes in and out.
#[derive(Debug, Clone, Default)]
pub struct Raw;

#[derive(Debug, Clone, Default)]
pub struct RawCoder;

impl Codec for Raw {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawCoder;
    type Decoder = RawCoder;

    fn encoder(&mut self) -> RawCoder {
        RawCoder
    }

    fn decoder(&mut self) -> RawCoder {
        RawCoder
    }
}

impl Encoder for RawCoder {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn encode(&mut self, item: Vec<u8>, buf: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        buf.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawCoder {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, tonic::Status> {
        Ok(Some(buf.copy_to_bytes(buf.remaining()).to_vec()))
    }
}

/// One gRPC call of `ps.v1.<service>`'s `method` with `body` as the message.
pub async fn call(
    ch: &Channel,
    service: &str,
    method: &str,
    body: Vec<u8>,
) -> Result<Vec<u8>, tonic::Status> {
    call_as(ch, service, method, body, None).await
}

/// [`call`] with `token` as the bearer token in the call's `authorization` metadata.
pub async fn call_as(
    ch: &Channel,
    service: &str,
    method: &str,
    body: Vec<u8>,
    token: Option<&str>,
) -> Result<Vec<u8>, tonic::Status> {
    let mut grpc = tonic::client::Grpc::new(ch.clone());
    grpc.ready()
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let path =
        tonic::codegen::http::uri::PathAndQuery::from_str(&format!("/ps.v1.{service}/{method}"))
            .map_err(|e| tonic::Status::invalid_argument(e.to_string()))?;
    let mut req = tonic::Request::new(body);
    req.set_timeout(Duration::from_secs(30));
    if let Some(t) = token {
        let v = format!("Bearer {t}")
            .parse()
            .map_err(|_| tonic::Status::invalid_argument("a token that is no header value"))?;
        req.metadata_mut().insert("authorization", v);
    }
    grpc.unary(req, path, Raw).await.map(|r| r.into_inner())
}
