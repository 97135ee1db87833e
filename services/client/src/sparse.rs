//! Sparse rows: ids grouped by their owning shard (the consistent-hash ring), in requests of
//! bounded size, with per-row error feedback for lossy codecs; pulls reassembled in request
//! order.

use futures::stream::{self, StreamExt, TryStreamExt};
use ps_codec::PullCodec;
use ps_codec::{Encoded, RowErrorFeedback};
use ps_core::request::{WireIds, ids_to_pb};
use ps_core::{Held, Payload};
use ps_proto::v1 as pb;

use crate::compress::Sender;
use crate::held::HeldRows;
use crate::push::{settle, wire_metric};
use crate::{ClientError, PsClient, PushSummary};

impl PsClient {
    /// Pushes gradients for rows `ids` of sparse table `name`: `grads` holds `ids.len() * dim`
    /// values, row after row. Duplicate ids are summed by the shard.
    pub async fn push_sparse(
        &self,
        name: &str,
        ids: &[u64],
        grads: &[f32],
    ) -> Result<PushSummary, ClientError> {
        let (spec, dim) = self.sparse_dim(name).await?;
        if grads.len() != ids.len() * dim {
            return Err(ClientError::InvalidInput(format!(
                "{} ids of dim {dim} need {} gradient values; got {}",
                ids.len(),
                ids.len() * dim,
                grads.len()
            )));
        }
        let (codec, sender) = self.inner.codecs.get(&spec.name);
        let started = std::time::Instant::now();
        let groups = self.group_ids(
            spec.placement_hash(),
            ids,
            dim as f64 * codec.push.codec.max_bytes_per_value().max(0.01) + 8.0,
        );
        // Encode every request under the table's lock, with per-row error feedback.
        let requests: Vec<(usize, Vec<u64>, Encoded)> = {
            let mut guard = sender.lock();
            let Sender { enc, rows, .. } = &mut *guard;
            let lossy = enc.options().keeps_row_residual();
            let rows = rows.get_or_insert_with(|| {
                let budget = self.inner.cfg.row_residual_mib.saturating_mul(1 << 20);
                RowErrorFeedback::bounded(dim, RowErrorFeedback::rows_in(budget, dim))
            });
            // The requests are parts of one push: each takes the codec the whole push would,
            // however its ids split over the shards (a part under `min_values` would otherwise
            // go as plain f32, every row with its id).
            enc.for_parts_of(grads.len(), 0, |enc| {
                let mut out = Vec::with_capacity(groups.len());
                for (shard, positions) in groups {
                    let ids: Vec<u64> = positions.iter().map(|&p| ids[p]).collect();
                    let mut values = Vec::with_capacity(positions.len() * dim);
                    for &p in &positions {
                        values.extend_from_slice(&grads[p * dim..(p + 1) * dim]);
                    }
                    let e = if lossy {
                        rows.compress(enc, &ids, &values)
                            .map_err(|e| ClientError::InvalidInput(e.to_string()))?
                    } else {
                        enc.encode(&values)
                    };
                    out.push((shard, ids, e));
                }
                Ok::<_, ClientError>(out)
            })?
        };
        // What goes on the wire: a sparse codec's request carries only the rows it has an
        // entry for, and their ids (the rest of each row is in the residual, or was zero).
        let mut sent: Vec<(usize, Vec<u64>, Encoded)> = Vec::with_capacity(requests.len());
        for (i, (_, ids, e)) in requests.iter().enumerate() {
            match e
                .rows_carried(dim)
                .map_err(|e| ClientError::InvalidInput(e.to_string()))?
            {
                Some((rows, _)) if rows.is_empty() => {}
                Some((rows, compact)) => {
                    sent.push((i, rows.iter().map(|&r| ids[r]).collect(), compact))
                }
                None => sent.push((i, ids.clone(), e.clone())),
            }
        }
        self.inner.encode_nanos.fetch_add(
            started.elapsed().as_nanos() as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
        let table = spec.name.to_string();
        let codec_name = codec.push.codec.to_string();
        let clock = Some(self.inner.clock.load(std::sync::atomic::Ordering::Relaxed))
            .filter(|&c| c != u64::MAX);
        let calls: Vec<(usize, (WireIds, pb::Payload))> = sent
            .iter()
            .map(|(i, ids, e)| {
                let (shard, _, full) = &requests[*i];
                wire_metric("push", &table, &codec_name, e, full.header.num_values);
                (
                    *shard,
                    (ids_to_pb(ids.clone()), Payload::from(e.clone()).into()),
                )
            })
            .collect();
        let results = self
            .inner
            .push_each(
                calls,
                |mut s, (WireIds { ids, fixed_ids }, values), push_id, map_epoch| {
                    let mut req = pb::PushSparseRequest {
                        table: table.clone(),
                        push_id: Some(push_id),
                        map_epoch,
                        ids,
                        fixed_ids,
                        values: Some(values),
                        clock,
                        ..Default::default()
                    };
                    async move {
                        // Rows go by the shard's bulk stream where it has one: plain f32
                        // values after the header as they are, no HTTP/2 frames around them;
                        // compressed ones (up to `MAX_COMPRESSED_BYTES`) in the header, for
                        // the stream's lower cost per call.
                        let plain = req
                            .values
                            .as_ref()
                            .is_some_and(ps_proto::bulk::is_plain_f32);
                        let compressed = req.values.as_ref().map_or(0, |v| v.data.len());
                        if let Some(bulk) = s.bulk().filter(|b| {
                            plain
                                || (compressed <= crate::bulk::MAX_COMPRESSED_BYTES
                                    && b.takes_compressed())
                        }) {
                            // Plain values leave the request for the body and come back for a
                            // fallback to gRPC: nothing is copied.
                            let body = req
                                .values
                                .as_mut()
                                .filter(|_| plain)
                                .map(|v| std::mem::take(&mut v.data))
                                .unwrap_or_default();
                            let sent = bulk.push_sparse(&mut req, &body).await;
                            if let Some(v) = req.values.as_mut().filter(|_| plain) {
                                v.data = body;
                            }
                            if let Some(answer) = sent? {
                                return Ok(answer);
                            }
                            s.rediscover_bulk().await;
                        }
                        s.grpc
                            .push_sparse(req)
                            .await
                            .map(tonic::Response::into_inner)
                    }
                },
            )
            .await;
        let mut summary = settle(
            results,
            |j| {
                let (i, _, e) = &sent[j];
                std::iter::once((e, requests[*i].2.header.num_values))
            },
            |j| {
                let mut guard = sender.lock();
                if guard.enc.options().keeps_row_residual()
                    && let Some(rows) = guard.rows.as_mut()
                {
                    let (_, ids, full) = &requests[sent[j].0];
                    let _ = rows.restore(ids, full);
                }
            },
        )?;
        summary.rows = sent.iter().map(|(_, ids, _)| ids.len() as u64).sum();
        Ok(summary)
    }

    /// Pulls rows `ids` of sparse table `name`: `ids.len() * dim` values, row after row.
    pub async fn pull_sparse(&self, name: &str, ids: &[u64]) -> Result<Vec<f32>, ClientError> {
        self.pull_sparse_as(name, ids, None).await
    }

    /// Pulls rows `ids` of sparse table `name` exactly, in f32, whatever the table's pull codec
    /// (for evaluating what the shards hold).
    pub async fn pull_sparse_f32(&self, name: &str, ids: &[u64]) -> Result<Vec<f32>, ClientError> {
        self.pull_sparse_as(name, ids, Some(PullCodec::F32)).await
    }

    /// Pulls rows `ids` of every sparse table of `names`, each under its pull codec: per
    /// table, `ids.len() * dim` values, row after row, as [`PsClient::pull_sparse`] gets them.
    /// Tables placed alike (`TableSpec::placed_with`) are read by one request per shard
    /// that sends the ids once; the others by requests of their own, at the same time.
    pub async fn pull_sparse_tables(
        &self,
        names: &[&str],
        ids: &[u64],
    ) -> Result<Vec<Vec<f32>>, ClientError> {
        self.pull_sparse_many(names, ids, None).await
    }

    /// [`PsClient::pull_sparse_tables`] exactly, in f32 (for evaluating what the shards hold).
    pub async fn pull_sparse_tables_f32(
        &self,
        names: &[&str],
        ids: &[u64],
    ) -> Result<Vec<Vec<f32>>, ClientError> {
        self.pull_sparse_many(names, ids, Some(PullCodec::F32))
            .await
    }

    /// Pulls rows under `pull`, or the table's pull codec.
    async fn pull_sparse_as(
        &self,
        name: &str,
        ids: &[u64],
        pull: Option<PullCodec>,
    ) -> Result<Vec<f32>, ClientError> {
        let mut rows = self.pull_sparse_many(&[name], ids, pull).await?;
        Ok(rows.pop().unwrap_or_default())
    }

    /// Pulls rows of each of `names` under `pull`, or each table's pull codec; the tables of
    /// one placement together.
    async fn pull_sparse_many(
        &self,
        names: &[&str],
        ids: &[u64],
        pull: Option<PullCodec>,
    ) -> Result<Vec<Vec<f32>>, ClientError> {
        let mut tables = Vec::with_capacity(names.len());
        for name in names {
            let (spec, dim) = self.sparse_dim(name).await?;
            let state = self.inner.codecs.state_of(&spec.name);
            let mut codec = state.codec;
            codec.pull = pull.unwrap_or(codec.pull);
            let accept = codec.pull.encoding();
            // The table's held rows, for pulls under its own codec whose rows are rounded
            // each on its own.
            let held = (pull.is_none()
                && self.inner.cfg.held_rows_mib > 0
                && PullCodec::rows_stand_alone(accept, dim))
            .then_some(state.held);
            tables.push(TablePull {
                placement: spec.placement_hash(),
                name: spec.name.to_string(),
                dim,
                accept,
                bytes_per_value: codec.pull_bytes_per_value(),
                codec_name: codec.pull.for_rows().to_string(),
                held,
            });
        }
        // Tables in groups of one placement, in the order their first table comes.
        let mut groups: Vec<Vec<usize>> = Vec::new();
        for (i, t) in tables.iter().enumerate() {
            match groups
                .iter_mut()
                .find(|g| tables[g[0]].placement == t.placement)
            {
                Some(g) => g.push(i),
                None => groups.push(vec![i]),
            }
        }
        let pulled = futures::future::try_join_all(groups.iter().map(|g| {
            let group: Vec<&TablePull> = g.iter().map(|&i| &tables[i]).collect();
            self.pull_placed_alike(group, ids)
        }))
        .await?;
        let mut out = vec![Vec::new(); tables.len()];
        for (g, rows) in groups.iter().zip(pulled) {
            for (&i, r) in g.iter().zip(rows) {
                out[i] = r;
            }
        }
        Ok(out)
    }

    /// Pulls rows `ids` of `tables`, which are placed alike: one request per shard (and
    /// bounded size), the first table's fields its own and the others' in `also`.
    async fn pull_placed_alike(
        &self,
        tables: Vec<&TablePull>,
        ids: &[u64],
    ) -> Result<Vec<Vec<f32>>, ClientError> {
        let Some(first) = tables.first() else {
            return Ok(Vec::new());
        };
        let row_bytes: f64 = tables
            .iter()
            .map(|t| t.dim as f64 * t.bytes_per_value.max(0.01))
            .sum::<f64>()
            + 8.0;
        let groups = self.group_ids(first.placement, ids, row_bytes);
        let mut out: Vec<Vec<f32>> = tables
            .iter()
            .map(|t| vec![0.0f32; ids.len() * t.dim])
            .collect();
        // What each request says it holds of each table; the held values go into `out` now.
        let mut asked: Vec<Vec<Held>> = vec![Vec::with_capacity(tables.len()); groups.len()];
        for (table, values) in tables.iter().zip(out.iter_mut()) {
            let Some(held) = &table.held else {
                asked.iter_mut().for_each(|a| a.push(Held::default()));
                continue;
            };
            let mut guard = held.lock();
            let rows = match guard.as_mut() {
                Some(rows) if rows.dim() == table.dim => rows,
                _ => guard.insert(HeldRows::new(
                    table.dim,
                    self.inner.cfg.held_rows_mib.saturating_mul(1 << 20),
                )),
            };
            for ((_, positions), a) in groups.iter().zip(asked.iter_mut()) {
                a.push(rows.ask(ids, positions, values));
            }
        }
        let mut answers = stream::iter(groups.into_iter().zip(asked).map(
            |((shard, positions), asked)| {
                let also: Vec<pb::PullSparseAlso> = tables[1..]
                    .iter()
                    .zip(&asked[1..])
                    .map(|(t, a)| pb::PullSparseAlso {
                        table: t.name.clone(),
                        accept: ps_core::payload::encoding_to_pb(t.accept) as i32,
                        held: a.mask.clone(),
                        held_digests: a.digests.clone(),
                    })
                    .collect();
                for (t, a) in tables[1..].iter().zip(&also) {
                    self.inner
                        .count_pull_request(&t.name, prost::Message::encoded_len(a));
                }
                let WireIds {
                    ids: varint_ids,
                    fixed_ids,
                } = ids_to_pb(positions.iter().map(|&p| ids[p]).collect());
                let req = pb::PullSparseRequest {
                    table: first.name.clone(),
                    ids: varint_ids,
                    fixed_ids,
                    accept: ps_core::payload::encoding_to_pb(first.accept) as i32,
                    map_epoch: 0,
                    held: asked[0].mask.clone(),
                    held_digests: asked[0].digests.clone(),
                    also,
                    ..Default::default()
                };
                let also_bytes: usize = req.also.iter().map(prost::Message::encoded_len).sum();
                let req_bytes = prost::Message::encoded_len(&req);
                self.inner
                    .count_pull_request(&req.table, req_bytes.saturating_sub(also_bytes));
                // By the shard's bulk stream where it has one (the answer whole in its
                // header), for the stream's lower cost per call; a large pull through gRPC.
                let bulk_sized = req_bytes <= crate::bulk::MAX_COMPRESSED_BYTES
                    && positions.len() as f64 * row_bytes <= crate::bulk::MAX_SPARSE_ANSWER as f64;
                let call = self.inner.call_shard(shard, move |mut s, map_epoch| {
                    let req = pb::PullSparseRequest {
                        map_epoch,
                        ..req.clone()
                    };
                    async move {
                        if let Some(bulk) = s.bulk().filter(|_| bulk_sized) {
                            if let Some(answer) = bulk.pull_sparse(&req).await? {
                                return Ok(answer);
                            }
                            s.rediscover_bulk().await;
                        }
                        s.grpc
                            .pull_sparse(req)
                            .await
                            .map(tonic::Response::into_inner)
                    }
                });
                async move { call.await.map(|r| (positions, asked, r)) }
            },
        ))
        .buffer_unordered(self.inner.cfg.max_in_flight);
        while let Some((positions, asked, resp)) = answers.try_next().await? {
            if resp.also.len() + 1 != tables.len() {
                return Err(ClientError::Protocol(format!(
                    "PullSparse of {} tables answered for {}",
                    tables.len(),
                    resp.also.len() + 1
                )));
            }
            let parts = std::iter::once(pb::PullSparseAnswer {
                values: resp.values,
                unchanged: resp.unchanged,
            })
            .chain(resp.also);
            for (((table, values), asked), answer) in
                tables.iter().zip(out.iter_mut()).zip(&asked).zip(parts)
            {
                self.take_rows(table, ids, &positions, asked, answer, values)?;
            }
        }
        Ok(out)
    }

    /// Takes one table's answer to a pull of `ids[positions]` into `out` (held rows the answer
    /// marks unchanged are already there) and keeps the rows it brought.
    fn take_rows(
        &self,
        table: &TablePull,
        ids: &[u64],
        positions: &[usize],
        asked: &Held,
        answer: pb::PullSparseAnswer,
        out: &mut [f32],
    ) -> Result<(), ClientError> {
        let dim = table.dim;
        let unchanged = Held {
            mask: answer.unchanged,
            digests: Vec::new(),
        };
        let kept = unchanged_rows(positions, asked, &unchanged)?;
        if let Some(v) = &answer.values {
            self.inner.count_pull(
                &table.name,
                &table.codec_name,
                v.data.len() as u64,
                (positions.len() * dim) as u64,
            );
        }
        let values = answer
            .values
            .ok_or_else(|| ClientError::Protocol("PullSparse answered without values".into()))
            .and_then(|v| Payload::try_from(v).map_err(|e| ClientError::Protocol(e.to_string())))?;
        let sent = positions.len() - kept;
        if values.len() != sent * dim {
            return Err(ClientError::Protocol(format!(
                "asked for {} rows of dim {dim} of `{}`, {kept} of them unchanged, got {} values",
                positions.len(),
                table.name,
                values.len()
            )));
        }
        let rows = values
            .to_vec()
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        let fresh = positions
            .iter()
            .enumerate()
            .filter(|(i, _)| !unchanged.has(*i))
            .map(|(_, &p)| p);
        for (p, row) in fresh.clone().zip(rows.chunks_exact(dim)) {
            out[p * dim..(p + 1) * dim].copy_from_slice(row);
        }
        if let Some(held) = &table.held {
            let mut guard = held.lock();
            if let Some(h) = guard.as_mut().filter(|h| h.dim() == dim) {
                let fresh_ids: Vec<u64> = fresh.map(|p| ids[p]).collect();
                h.keep(&fresh_ids, &rows[..fresh_ids.len() * dim]);
            }
        }
        self.inner
            .rows_unchanged
            .fetch_add(kept as u64, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// Groups positions of `ids` by owning shard under placement hash `placement`
    /// ([`ps_core::TableSpec::placement_hash`]), in requests of at most about `max_request_bytes` at
    /// `row_bytes` a row.
    fn group_ids(&self, placement: u64, ids: &[u64], row_bytes: f64) -> Vec<(usize, Vec<usize>)> {
        let n = self.inner.num_shards;
        let per_request = ((self.inner.cfg.max_request_bytes as f64 / row_bytes) as usize).max(1);
        let mut by_shard: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (p, &id) in ids.iter().enumerate() {
            by_shard[self.inner.partitioner.shard_for_id(placement, id) as usize].push(p);
        }
        by_shard
            .into_iter()
            .enumerate()
            .flat_map(|(s, pos)| {
                pos.chunks(per_request)
                    .map(|c| (s, c.to_vec()))
                    .collect::<Vec<_>>()
            })
            .collect()
    }
}

/// One table of a sparse pull: what its requests ask and how its answers are taken.
struct TablePull {
    placement: u64,
    name: String,
    dim: usize,
    accept: ps_codec::Encoding,
    bytes_per_value: f64,
    /// The rows' pull codec, as metrics name it.
    codec_name: String,
    /// The rows this client holds of the table, where it holds any.
    held: Option<std::sync::Arc<parking_lot::Mutex<Option<HeldRows>>>>,
}

/// How many rows of a pull's answer are marked `unchanged`: none when the mask is empty, else
/// it must be a bit per row asked for, marking only rows the request said it held.
fn unchanged_rows(
    positions: &[usize],
    asked: &Held,
    unchanged: &Held,
) -> Result<usize, ClientError> {
    if unchanged.mask.is_empty() {
        return Ok(0);
    }
    let bad = |why: &str| Err(ClientError::Protocol(format!("PullSparse answer: {why}")));
    if let Err(e) = unchanged.check_mask(positions.len()) {
        return bad(&format!("the unchanged rows' mask: {}", e.reason));
    }
    if unchanged
        .mask
        .iter()
        .zip(asked.mask.iter().chain(std::iter::repeat(&0)))
        .any(|(u, h)| u & !h != 0)
    {
        return bad("a row marked unchanged that the client does not hold");
    }
    Ok(unchanged.count())
}
