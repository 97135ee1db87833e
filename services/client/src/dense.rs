//! Dense tensors: a push cut into its table's chunks, encoded under the table's codec (with
//! its error-feedback residual) and sent to the owning shards in requests of bounded size;
//! a pull reassembled in place. Plain f32 goes over a shard's bulk stream where it has one.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use futures::stream::{self, StreamExt, TryStreamExt};
use ps_core::request::DenseSlice;
use ps_core::{Payload, TableSpec};
use ps_proto::v1 as pb;

use crate::bulk;
use crate::compress::Sender;
use crate::push::{CallsInFlight, EncodedSlice, borrowed_f32, is_borrowed, settle, wire_metric};
use crate::{ClientError, PsClient, PullCodec, PushSummary, TableCodec};

impl PsClient {
    /// Pushes a gradient for the whole dense tensor `name`.
    pub async fn push_dense(&self, name: &str, grad: &[f32]) -> Result<PushSummary, ClientError> {
        let (_, shape) = self.dense_spec(name).await?;
        if grad.len() as u64 != shape.len() {
            return Err(ClientError::InvalidInput(format!(
                "table `{name}` holds {} values (shape {:?}); the gradient has {}",
                shape.len(),
                shape.shape,
                grad.len()
            )));
        }
        self.push_dense_chunks(name, 0, grad).await
    }

    /// Pushes a gradient for the chunks starting at `first_chunk`; `grad` must cover whole
    /// chunks (the last chunk of the tensor may be short).
    pub async fn push_dense_chunks(
        &self,
        name: &str,
        first_chunk: u64,
        grad: &[f32],
    ) -> Result<PushSummary, ClientError> {
        self.push_dense_then(name, first_chunk, grad, None).await
    }

    /// Pushes a gradient for the whole dense tensor `name` and pulls the tensor into `out`
    /// (which must hold exactly its values), as a training step's push and pull: each
    /// request's chunks are pulled as soon as the shard acknowledged their push, while the
    /// other requests' pushes are still on their way, so the shards serve pulls while they
    /// apply pushes instead of the two halves taking turns.
    ///
    /// Each chunk pulled holds this push (and whatever else the shard applied before the pull
    /// reached it), as after [`PsClient::push_dense`] then [`PsClient::pull_dense_into`]; the
    /// chunks are not pulled at one instant, as they never were across shards. Under a
    /// delta pull codec the pull follows the whole push. On an error, some requests may have
    /// been pushed and some chunks pulled: `out` is then partly written.
    pub async fn push_pull_dense(
        &self,
        name: &str,
        grad: &[f32],
        out: &mut [f32],
    ) -> Result<PushSummary, ClientError> {
        let (spec, shape) = self.dense_spec(name).await?;
        if out.len() as u64 != shape.len() {
            return Err(ClientError::InvalidInput(format!(
                "table `{name}` holds {} values; the buffer holds {}",
                shape.len(),
                out.len()
            )));
        }
        if self
            .inner
            .codecs
            .state_of(&spec.name)
            .codec
            .pull
            .delta_ratio()
            .is_some()
        {
            let summary = self.push_dense(name, grad).await?;
            self.pull_dense_into(name, out).await?;
            return Ok(summary);
        }
        if grad.len() != out.len() {
            return Err(ClientError::InvalidInput(format!(
                "table `{name}` holds {} values (shape {:?}); the gradient has {}",
                shape.len(),
                shape.shape,
                grad.len()
            )));
        }
        self.push_dense_then(name, 0, grad, Some(out)).await
    }

    /// Pushes `grad` for the chunks from `first_chunk` on and, with `pull_into`, pulls each
    /// request's chunks into their places there once its push is acknowledged (`pull_into`
    /// then covers the same chunks as `grad`).
    async fn push_dense_then(
        &self,
        name: &str,
        first_chunk: u64,
        grad: &[f32],
        pull_into: Option<&mut [f32]>,
    ) -> Result<PushSummary, ClientError> {
        let (spec, shape) = self.dense_spec(name).await?;
        // The chunks the gradient covers; it must end on a chunk boundary.
        let mut last = first_chunk;
        let mut covered = 0usize;
        while covered < grad.len() {
            let len = shape.chunk_len(last).ok_or_else(|| {
                ClientError::InvalidInput(format!(
                    "chunk {last} is past the end of `{name}` ({} chunks)",
                    shape.num_chunks()
                ))
            })?;
            covered += len;
            last += 1;
        }
        if covered != grad.len() {
            return Err(ClientError::InvalidInput(format!(
                "the gradient ends inside chunk {}: push whole chunks of {} values",
                last - 1,
                shape.chunk_elems
            )));
        }
        let base = first_chunk * shape.chunk_elems;
        let (codec, sender) = self.inner.codecs.get(&spec.name);
        let floor = self.inner.codecs.dense_floor();
        let plan = self.plan_chunks(
            &spec,
            &shape,
            first_chunk..last,
            codec.push.codec.max_bytes_per_value(),
        );
        // Encode every slice under the table's lock (the residual is shared by this client's
        // pushes to the table), then send without it.
        let encoding = tracing::info_span!("encode", table = %spec.name, codec = %codec.push.codec);
        let started = Instant::now();
        let requests =
            encoding.in_scope(|| -> Result<Vec<(usize, Vec<EncodedSlice>)>, ClientError> {
                let mut guard = sender.lock();
                let Sender { enc, dense, .. } = &mut *guard;
                let lossy = enc.options().keeps_residual();
                if lossy {
                    dense
                        .accumulate_at(shape.len() as usize, base as usize, grad)
                        .map_err(|e| ClientError::InvalidInput(e.to_string()))?;
                }
                // Every chunk takes the codec the whole push would: a push over the
                // compression floor (the codec's, raised to what the link makes worth it)
                // compresses its short last chunk too, and one under it sends every chunk
                // whole.
                enc.for_parts_of(grad.len(), floor, |enc| {
                    let mut requests = Vec::with_capacity(plan.len());
                    for (shard, chunks) in plan {
                        let mut slices = Vec::with_capacity(chunks.len());
                        for c in chunks {
                            let Some(r) = shape.chunk_range(c) else {
                                continue;
                            };
                            let abs = r.start as usize..r.end as usize;
                            let e = if lossy {
                                dense
                                    .take(enc, abs.clone())
                                    .map_err(|e| ClientError::InvalidInput(e.to_string()))?
                            } else {
                                let rel = abs.start - base as usize..abs.end - base as usize;
                                plain_or_encoded(enc, &grad[rel])
                            };
                            slices.push((c, abs, e));
                        }
                        requests.push((shard, slices));
                    }
                    Ok(requests)
                })
            })?;
        self.inner
            .encode_nanos
            .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        let table = spec.name.to_string();
        let codec_name = codec.push.codec.to_string();
        // The wire form of each request: its shard; its slices; whether they are all plain
        // f32; and where in `grad` the values of each borrowed slice are (sent from there,
        // never copied for the bulk stream; copied into the payload only for gRPC). A request
        // goes by the bulk stream where the shard has one: plain f32 as the body, compressed
        // slices (up to `MAX_COMPRESSED_BYTES`) in its header.
        type Call = (usize, Vec<pb::DenseSlice>, bool, Vec<Option<Range<usize>>>);
        let calls: Vec<(usize, Call)> = requests
            .iter()
            .enumerate()
            .map(|(i, (shard, slices))| {
                let wire: Vec<pb::DenseSlice> = slices
                    .iter()
                    .map(|(c, _, e)| {
                        wire_metric("push", &table, &codec_name, e, e.header.num_values);
                        pb::DenseSlice {
                            chunk: *c,
                            values: Some(Payload::from(e.clone()).into()),
                        }
                    })
                    .collect();
                let plain = wire
                    .iter()
                    .all(|s| s.values.as_ref().is_some_and(ps_proto::bulk::is_plain_f32));
                let borrowed = slices
                    .iter()
                    .map(|(_, abs, e)| {
                        is_borrowed(e).then(|| abs.start - base as usize..abs.end - base as usize)
                    })
                    .collect();
                (*shard, (i, wire, plain, borrowed))
            })
            .collect();
        // With a pull: each request's chunks, their places in `pull_into`, and how they are
        // pulled (the table's pull codec, in requests within the client's size).
        let pull_codec = codec.pull;
        let accept = pull_codec.encoding();
        let pull_name = pull_codec.to_string();
        let max_pulled = ((self.inner.cfg.max_request_bytes as f64
            / codec.pull_bytes_per_value().max(0.01)) as usize)
            .max(1);
        let pulls: Vec<tokio::sync::Mutex<Vec<bulk::Dst<'_>>>> = match pull_into {
            Some(out) => {
                let mut places = chunk_places(out, shape.chunk_elems);
                requests
                    .iter()
                    .map(|(_, slices)| {
                        let chunks = slices.iter().map(|(c, _, _)| *c);
                        tokio::sync::Mutex::new(take_places(&mut places, first_chunk, chunks))
                    })
                    .collect()
            }
            None => Vec::new(),
        };
        // A plain-f32 request whose chunks are pulled as plain f32 in one request goes as a
        // push-and-pull by the bulk stream: one exchange where there would be two. Which
        // requests had their chunks pulled that way:
        let fused: Vec<AtomicBool> = pulls.iter().map(|_| AtomicBool::new(false)).collect();
        let fusable = |i: usize| {
            accept == ps_core::Encoding::F32
                && requests[i].1.iter().map(|(_, r, _)| r.len()).sum::<usize>() <= max_pulled
        };
        let pull_after = |i: usize| {
            let (table, pull_name, pulls, requests) = (&table, &pull_name, &pulls, &requests);
            let fused = &fused;
            async move {
                let Some(dsts) = pulls.get(i) else {
                    return Ok(());
                };
                if fused[i].load(Ordering::Relaxed) {
                    return Ok(());
                }
                let shard = requests[i].0;
                let mut dsts = dsts.lock().await;
                let mut rest: &mut [bulk::Dst<'_>] = &mut dsts;
                while !rest.is_empty() {
                    // Chunks up to the pull's size, at least one.
                    let mut values = 0;
                    let n = rest
                        .iter()
                        .take_while(|(_, d)| {
                            values += d.len();
                            values <= max_pulled
                        })
                        .count()
                        .max(1);
                    let (part, tail) = rest.split_at_mut(n);
                    self.pull_request(table, pull_name, shard, accept, part)
                        .await?;
                    rest = tail;
                }
                Ok(())
            }
        };
        let results = self
            .inner
            .push_each_then(
                calls,
                |mut s, (i, slices, plain, borrowed), push_id, map_epoch| {
                    let mut req = pb::PushDenseRequest {
                        table: table.clone(),
                        push_id: Some(push_id),
                        map_epoch,
                        slices,
                        trace_context: Default::default(),
                        authorization: String::new(),
                    };
                    let (pulls, fused, pull_name, table) = (&pulls, &fused, &pull_name, &table);
                    let compressed: usize = req
                        .slices
                        .iter()
                        .filter_map(|s| s.values.as_ref())
                        .filter(|v| !ps_proto::bulk::is_plain_f32(v))
                        .map(|v| v.data.len())
                        .sum();
                    async move {
                        if let Some(bulk) = s.bulk().filter(|b| {
                            plain
                                || (compressed <= bulk::MAX_COMPRESSED_BYTES
                                    && b.takes_compressed())
                        }) {
                            let mut header = req.clone();
                            // Plain slices' values leave the header for the body; compressed
                            // ones stay.
                            let mut data = Vec::new();
                            let mut body_of = Vec::new();
                            for (slice, b) in header.slices.iter_mut().zip(&borrowed) {
                                if let Some(v) = slice
                                    .values
                                    .as_mut()
                                    .filter(|v| ps_proto::bulk::is_plain_f32(v))
                                {
                                    data.push(std::mem::take(&mut v.data));
                                    body_of.push(b);
                                }
                            }
                            let body: Vec<&[u8]> = data
                                .iter()
                                .zip(body_of)
                                .map(|(d, b)| b.as_ref().map_or(d.as_ref(), |r| bytes_of(grad, r)))
                                .collect();
                            let answer = match pulls.get(i).filter(|_| plain && fusable(i)) {
                                Some(dsts) => {
                                    let mut dsts = dsts.lock().await;
                                    let answer = bulk.push_pull_dense(header, &body, &mut dsts);
                                    answer.await?.map(|(answer, pulled)| {
                                        if pulled {
                                            fused[i].store(true, Ordering::Relaxed);
                                            let n: u64 =
                                                dsts.iter().map(|(_, d)| d.len() as u64).sum();
                                            self.inner.count_pull(table, pull_name, n * 4, n);
                                        }
                                        answer
                                    })
                                }
                                None => bulk.push_dense(header, &body).await?,
                            };
                            if let Some(answer) = answer {
                                return Ok(answer);
                            }
                        }
                        s.rediscover_bulk().await;
                        for (slice, b) in req.slices.iter_mut().zip(&borrowed) {
                            if let (Some(v), Some(r)) = (slice.values.as_mut(), b) {
                                v.data = bytes::Bytes::copy_from_slice(bytes_of(grad, r));
                            }
                        }
                        s.grpc
                            .push_dense(req)
                            .await
                            .map(tonic::Response::into_inner)
                    }
                },
                pull_after,
                self.inner.cfg.call_threads,
            )
            .await;
        let mut pulled = None;
        let results = results
            .into_iter()
            .map(|(i, answer, pull)| {
                if let Some(Err(e)) = pull {
                    pulled.get_or_insert(e);
                }
                (i, answer)
            })
            .collect();
        let mut summary = settle(
            results,
            |i| {
                requests[i]
                    .1
                    .iter()
                    .map(|(_, _, e)| (e, e.header.num_values))
            },
            |i| {
                let mut guard = sender.lock();
                if guard.lossy() {
                    for (_, range, sent) in &requests[i].1 {
                        let _ = guard.dense.restore(range.clone(), sent);
                    }
                }
            },
        )?;
        summary.sent = sent_positions(requests.iter().flat_map(|(_, slices)| slices));
        match pulled {
            Some(e) => Err(e),
            None => Ok(summary),
        }
    }

    /// Groups `chunks` by owning shard into requests of at most `max_request_bytes` each, for
    /// values of at most `bytes_per_value` bytes: (shard, chunks of one request).
    pub(crate) fn plan_chunks(
        &self,
        spec: &TableSpec,
        shape: &ps_core::DenseShape,
        chunks: Range<u64>,
        bytes_per_value: f64,
    ) -> Vec<(usize, Vec<u64>)> {
        let hash = spec.name.hash64();
        let max_values =
            ((self.inner.cfg.max_request_bytes as f64 / bytes_per_value.max(0.01)) as usize).max(1);
        let n = self.inner.num_shards;
        // Per shard: requests under construction, and the values in the last one.
        let mut per_shard: Vec<Vec<Vec<u64>>> = vec![Vec::new(); n];
        let mut fill = vec![usize::MAX; n];
        for c in chunks {
            let len = shape.chunk_len(c).unwrap_or(0);
            let s = self.inner.partitioner.shard_for_chunk(hash, c) as usize;
            if fill[s].saturating_add(len) > max_values {
                per_shard[s].push(Vec::new());
                fill[s] = 0;
            }
            if let Some(r) = per_shard[s].last_mut() {
                r.push(c);
            }
            fill[s] += len;
        }
        per_shard
            .into_iter()
            .enumerate()
            .flat_map(|(s, reqs)| reqs.into_iter().map(move |r| (s, r)))
            .collect()
    }

    /// Pulls the whole dense tensor `name`.
    pub async fn pull_dense(&self, name: &str) -> Result<Vec<f32>, ClientError> {
        let (_, shape) = self.dense_spec(name).await?;
        self.pull_dense_chunks(name, 0..shape.num_chunks()).await
    }

    /// Pulls the whole dense tensor `name` exactly, in f32, whatever the table's pull codec
    /// (for evaluating or exporting what the shards hold).
    pub async fn pull_dense_f32(&self, name: &str) -> Result<Vec<f32>, ClientError> {
        let (_, shape) = self.dense_spec(name).await?;
        self.pull_dense_as(name, 0..shape.num_chunks(), Some(PullCodec::F32))
            .await
    }

    /// Pulls chunks `chunks` of dense tensor `name`, concatenated.
    pub async fn pull_dense_chunks(
        &self,
        name: &str,
        chunks: Range<u64>,
    ) -> Result<Vec<f32>, ClientError> {
        self.pull_dense_as(name, chunks, None).await
    }

    /// Pulls the whole dense tensor `name` into `out`, which must hold exactly its values. A
    /// caller that keeps one buffer from step to step spares each pull the fresh pages of a
    /// new tensor (their faults and zeroing are the client's largest cost per byte of a large
    /// pull once its copies are gone).
    pub async fn pull_dense_into(&self, name: &str, out: &mut [f32]) -> Result<(), ClientError> {
        let (_, shape) = self.dense_spec(name).await?;
        self.pull_dense_as_into(name, 0..shape.num_chunks(), None, out)
            .await
    }

    /// Pulls `chunks` of `name` under `codec`, or the table's pull codec.
    async fn pull_dense_as(
        &self,
        name: &str,
        chunks: Range<u64>,
        codec: Option<PullCodec>,
    ) -> Result<Vec<f32>, ClientError> {
        let (_, shape) = self.dense_spec(name).await?;
        let total: usize = chunks.clone().filter_map(|c| shape.chunk_len(c)).sum();
        let mut out = vec![0.0f32; total];
        self.pull_dense_as_into(name, chunks, codec, &mut out)
            .await?;
        Ok(out)
    }

    /// Pulls `chunks` of `name` under `codec`, or the table's pull codec, into `out` (exactly
    /// their values).
    async fn pull_dense_as_into(
        &self,
        name: &str,
        chunks: Range<u64>,
        codec: Option<PullCodec>,
        out: &mut [f32],
    ) -> Result<(), ClientError> {
        let (spec, shape) = self.dense_spec(name).await?;
        if chunks.end > shape.num_chunks() || chunks.start > chunks.end {
            return Err(ClientError::InvalidInput(format!(
                "chunks {chunks:?} are out of range: `{name}` has {} chunks",
                shape.num_chunks()
            )));
        }
        let total: usize = chunks.clone().filter_map(|c| shape.chunk_len(c)).sum();
        if out.len() != total {
            return Err(ClientError::InvalidInput(format!(
                "chunks {chunks:?} of `{name}` hold {total} values; the buffer holds {}",
                out.len()
            )));
        }
        let state = self.inner.codecs.state_of(&spec.name);
        let codec = TableCodec {
            pull: codec.unwrap_or(state.codec.pull),
            ..state.codec
        };
        if let Some(ratio) = codec.pull.delta_ratio() {
            let values = self
                .pull_dense_delta(&spec, &shape, chunks, ratio, &state.replica)
                .await?;
            out.copy_from_slice(&values);
            return Ok(());
        }
        let accept = codec.pull.encoding();
        let bytes_per_value = codec.pull_bytes_per_value();
        let requests = self.plan_chunks(&spec, &shape, chunks.clone(), bytes_per_value);
        let table = spec.name.to_string();
        // Each chunk's place in `out`, handed to the request that pulls it: answers are
        // decoded (or, by the bulk stream, read) straight into the tensor.
        let mut places = chunk_places(out, shape.chunk_elems);
        let codec_name = codec.pull.to_string();
        let (table_ref, codec_ref) = (&table, &codec_name);
        let pulls = requests.into_iter().map(|(shard, chunks_of)| {
            let mut dsts = take_places(&mut places, chunks.start, chunks_of);
            async move {
                self.pull_request(table_ref, codec_ref, shard, accept, &mut dsts)
                    .await
            }
        });
        // Counted among the calls that leave fewer cores to a push's threads.
        let _counted = CallsInFlight::enter();
        stream::iter(pulls)
            .buffer_unordered(self.inner.cfg.max_in_flight)
            .try_collect::<Vec<()>>()
            .await?;
        Ok(())
    }

    /// Pulls the chunks of `dsts` (in order, each into its place) of `table` from `shard`,
    /// encoded as `accept` (`codec` names it in the metrics): by the shard's bulk stream when
    /// plain f32 goes there, else through gRPC.
    async fn pull_request(
        &self,
        table: &str,
        codec: &str,
        shard: usize,
        accept: ps_core::Encoding,
        dsts: &mut [bulk::Dst<'_>],
    ) -> Result<(), ClientError> {
        let req = pb::PullDenseRequest {
            table: table.to_owned(),
            chunks: dsts.iter().map(|(c, _)| *c).collect(),
            accept: ps_core::payload::encoding_to_pb(accept) as i32,
            map_epoch: 0,
            delta: None,
            trace_context: Default::default(),
            authorization: String::new(),
        };
        self.inner
            .count_pull_request(&req.table, prost::Message::encoded_len(&req));
        let plain = accept == ps_core::Encoding::F32;
        let dsts = tokio::sync::Mutex::new(dsts);
        self.inner
            .call_shard(shard, |mut s, map_epoch| {
                let req = pb::PullDenseRequest {
                    map_epoch,
                    ..req.clone()
                };
                let dsts = &dsts;
                async move {
                    let mut dsts = dsts.lock().await;
                    if plain
                        && let Some(bulk) = s.bulk()
                        && bulk.pull_dense(&req, &mut dsts).await?.is_some()
                    {
                        let values: u64 = dsts.iter().map(|(_, d)| d.len() as u64).sum();
                        self.inner.count_pull(table, codec, values * 4, values);
                        return Ok(Ok(()));
                    }
                    // Other encodings by the bulk stream too, answered in its header.
                    let resp = if plain {
                        s.rediscover_bulk().await;
                        s.grpc.pull_dense(req).await?.into_inner()
                    } else {
                        s.pull_dense_answered(req).await?
                    };
                    let (wire, values) = slice_bytes(&resp.slices);
                    self.inner.count_pull(table, codec, wire, values);
                    Ok(place_slices(resp.slices, &mut dsts))
                }
            })
            .await?
            .map_err(ClientError::Protocol)
    }
}

/// The places of `chunks` taken out of `places` (which start at chunk `first`), each with its
/// chunk, for the request that fills them.
fn take_places<'a>(
    places: &mut [Option<&'a mut [f32]>],
    first: u64,
    chunks: impl IntoIterator<Item = u64>,
) -> Vec<bulk::Dst<'a>> {
    chunks
        .into_iter()
        .map(|c| {
            let place = places
                .get_mut((c - first) as usize)
                .and_then(Option::take)
                .unwrap_or_default();
            (c, place)
        })
        .collect()
}

/// `out` cut into the places of its chunks (`chunk_elems` values each, the last one short),
/// each to be taken by the request that pulls it.
fn chunk_places(out: &mut [f32], chunk_elems: u64) -> Vec<Option<&mut [f32]>> {
    out.chunks_mut(usize::try_from(chunk_elems).unwrap_or(usize::MAX).max(1))
        .map(Some)
        .collect()
}

/// The bytes of `grad[r]`, as the wire carries f32 (little-endian, as this host's).
fn bytes_of<'a>(grad: &'a [f32], r: &Range<usize>) -> &'a [u8] {
    bytemuck::cast_slice(&grad[r.clone()])
}

/// The caller's values as a push sends them: what the encoder would send as they are stays in
/// the caller's memory (a [`borrowed_f32`] payload, sent from there); anything else is encoded.
fn plain_or_encoded(enc: &mut ps_codec::Encoder, values: &[f32]) -> ps_codec::Encoded {
    if enc.sends_plain(values) {
        return borrowed_f32(values.len());
    }
    enc.encode(values)
}

/// A pull answer's payload bytes on the wire and its number of values.
pub(crate) fn slice_bytes(slices: &[pb::DenseSlice]) -> (u64, u64) {
    slices
        .iter()
        .filter_map(|s| s.values.as_ref())
        .fold((0, 0), |(w, n), v| {
            (w + v.data.len() as u64, n + v.num_values)
        })
}

/// Decodes a pull's answered slices into the places of the chunks asked for, in order.
fn place_slices(slices: Vec<pb::DenseSlice>, dsts: &mut [bulk::Dst<'_>]) -> Result<(), String> {
    if slices.len() != dsts.len() {
        return Err(format!(
            "{} slices answered for {} chunks",
            slices.len(),
            dsts.len()
        ));
    }
    for (slice, (chunk, dst)) in slices.into_iter().zip(dsts.iter_mut()) {
        let slice = DenseSlice::try_from(slice).map_err(|e| e.to_string())?;
        if slice.chunk != *chunk || slice.values.len() != dst.len() {
            return Err(format!(
                "chunk {} of {} values answered where chunk {chunk} of {} was asked",
                slice.chunk,
                slice.values.len(),
                dst.len()
            ));
        }
        slice
            .values
            .decode_into(dst)
            .map_err(|e| format!("chunk {}: {e}", slice.chunk))?;
    }
    Ok(())
}

/// The tensor positions a push's slices carried, when a sparse codec sent only some of them;
/// `None` when any slice carried every position of its range.
fn sent_positions<'a>(slices: impl Iterator<Item = &'a EncodedSlice>) -> Option<Vec<usize>> {
    let mut sent = Vec::new();
    for (_, range, e) in slices {
        // The payload was encoded here; it decodes.
        let idx = e.indices().ok()??;
        sent.extend(idx.into_iter().map(|i| range.start + i));
    }
    sent.sort_unstable();
    Some(sent)
}
