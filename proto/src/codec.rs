//! The codec the generated `ps.v1` services use: prost's wire format, with one change to how
//! a message is encoded.
//!
//! tonic hands an encoder an 8 KiB buffer and lets it grow as fields are appended, so a 1 MiB
//! payload was copied once into the buffer and again each time the buffer doubled (about a
//! second full copy, and fresh pages to fault in). [`PsCodec`] reserves the message's encoded
//! length first, so every payload byte is copied into the request exactly once. Every gRPC
//! test of the workspace goes through it.
//!
//! A message that does not decode (truncated, a wrong wire type, invalid UTF-8 in a string)
//! is the sender's fault: [`PsDecoder`] answers it `invalid_argument`, where prost's decoder
//! says `internal`.

use std::marker::PhantomData;

use prost::Message;
use tonic::Status;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};

/// Prost encoding with the whole message reserved up front.
#[derive(Debug, Clone)]
pub struct PsCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for PsCodec<T, U> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<T, U> Codec for PsCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = PsEncoder<T>;
    type Decoder = PsDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        PsEncoder(PhantomData)
    }

    fn decoder(&mut self) -> Self::Decoder {
        PsDecoder(PhantomData)
    }
}

/// Prost decoding, with a message that does not decode answered `invalid_argument`.
#[derive(Debug)]
pub struct PsDecoder<U>(PhantomData<U>);

impl<U: Message + Default> Decoder for PsDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        U::decode(buf).map(Some).map_err(|e| {
            Status::invalid_argument(format!(
                "the message does not decode as {}: {e}",
                std::any::type_name::<U>()
                    .rsplit("::")
                    .next()
                    .unwrap_or("its type"),
            ))
        })
    }

    fn buffer_settings(&self) -> BufferSettings {
        BufferSettings::default()
    }
}

/// Encodes `T` into a buffer reserved for all of it.
#[derive(Debug, Clone)]
pub struct PsEncoder<T>(PhantomData<T>);

impl<T: Message> Encoder for PsEncoder<T> {
    type Item = T;
    type Error = Status;

    fn encode(&mut self, item: T, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        buf.reserve(item.encoded_len());
        item.encode(buf)
            .map_err(|e| Status::internal(format!("encoding a message: {e}")))
    }
}
