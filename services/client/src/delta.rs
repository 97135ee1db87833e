//! Delta pulls: each chunk as the top-k of its change since what this client was last sent,
//! added to the client's replica of the table (the shard keeps the matching replica); a chunk
//! the shard has no replica for comes whole.

use std::ops::Range;

use futures::stream::{self, StreamExt};
use ps_codec::Encoded;
use ps_core::TableSpec;
use ps_core::request::DenseSlice;
use ps_proto::v1 as pb;

use crate::compress::DeltaReplica;
use crate::{ClientError, PsClient};

impl PsClient {
    /// A dense pull as the top `ratio` of each chunk's change since this client's last pull,
    /// applied to the client's replica of the table (one delta pull of a table at a time).
    pub(crate) async fn pull_dense_delta(
        &self,
        spec: &TableSpec,
        shape: &ps_core::DenseShape,
        chunks: Range<u64>,
        ratio: f64,
        replica: &tokio::sync::Mutex<DeltaReplica>,
    ) -> Result<Vec<f32>, ClientError> {
        let mut rep = replica.lock().await;
        if rep.values.len() as u64 != shape.len() {
            rep.values = vec![0.0; shape.len() as usize];
            rep.versions.clear();
        }
        let range = (chunks.start * shape.chunk_elems) as usize
            ..(chunks.start * shape.chunk_elems) as usize
                + chunks
                    .clone()
                    .filter_map(|c| shape.chunk_len(c))
                    .sum::<usize>();
        // A chunk may come whole, in f32: plan for that.
        let requests = self.plan_chunks(spec, shape, chunks, 4.0);
        let table = spec.name.to_string();
        let client_id = self.inner.client_id;
        let answers = stream::iter(requests)
            .map(|(shard, chunks)| {
                let versions: Vec<u64> = chunks
                    .iter()
                    .map(|c| rep.versions.get(c).copied().unwrap_or(0))
                    .collect();
                let req = pb::PullDenseRequest {
                    table: table.clone(),
                    chunks,
                    accept: pb::Encoding::F32 as i32,
                    map_epoch: 0,
                    delta: Some(pb::DeltaPull {
                        client_id,
                        ratio,
                        versions,
                    }),
                    trace_context: Default::default(),
                    authorization: String::new(),
                };
                self.inner
                    .count_pull_request(&req.table, prost::Message::encoded_len(&req));
                // By the shard's bulk stream, answered whole in its header; through gRPC
                // where it has none or is older than delta pulls there.
                let call = self.inner.call_shard(shard, move |mut s, map_epoch| {
                    let req = pb::PullDenseRequest {
                        map_epoch,
                        ..req.clone()
                    };
                    async move { s.pull_dense_answered(req).await }
                });
                async move { call.await.map(|r| (r, shard)) }
            })
            .buffer_unordered(self.inner.cfg.max_in_flight)
            .collect::<Vec<_>>()
            .await;
        let codec_name = crate::PullCodec::DeltaTopK { ratio }.to_string();
        for answer in answers {
            let (resp, _) = answer?;
            let (wire, values) = crate::dense::slice_bytes(&resp.slices);
            self.inner.count_pull(&table, &codec_name, wire, values);
            if resp.is_delta.len() != resp.slices.len() || resp.versions.len() != resp.slices.len()
            {
                return Err(ClientError::Protocol(
                    "a delta pull answered without a version per slice".into(),
                ));
            }
            for ((slice, is_delta), version) in resp
                .slices
                .into_iter()
                .zip(resp.is_delta)
                .zip(resp.versions)
            {
                let slice = DenseSlice::try_from(slice)
                    .map_err(|e| ClientError::Protocol(e.to_string()))?;
                let start = (slice.chunk * shape.chunk_elems) as usize;
                let chunk = slice.chunk;
                let bad =
                    |e: ps_codec::CodecError| ClientError::Protocol(format!("chunk {chunk}: {e}"));
                let dst = rep
                    .values
                    .get_mut(start..start + slice.values.len())
                    .ok_or_else(|| {
                        ClientError::Protocol(format!("chunk {chunk} answered out of range"))
                    })?;
                if is_delta {
                    Encoded::from(slice.values)
                        .decode_add(dst, 1.0)
                        .map_err(bad)?;
                } else {
                    slice.values.decode_into(dst).map_err(bad)?;
                }
                if version == 0 {
                    rep.versions.remove(&chunk);
                } else {
                    rep.versions.insert(chunk, version);
                }
            }
        }
        Ok(rep.values[range].to_vec())
    }
}
