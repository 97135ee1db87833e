//! Tables (create on every shard, describe, list, drop), checkpoints of every shard and their
//! export, and the shards' statistics.

use ps_core::status::ShardStats;
use ps_core::{ExportPart, TableKind, TableName, TableSpec};
use ps_proto::v1 as pb;

use crate::{ClientError, Deleted, PsClient, ShardCheckpoint};

pub(crate) fn table_name(name: &str) -> Result<TableName, ClientError> {
    TableName::try_from(name).map_err(|e| ClientError::InvalidInput(e.to_string()))
}

/// The parts of one shard's export, as they arrive ([`PsClient::export_checkpoint`]).
pub struct ExportStream {
    shard: usize,
    endpoint: String,
    parts: tonic::Streaming<pb::ExportPart>,
}

impl std::fmt::Debug for ExportStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExportStream")
            .field("shard", &self.shard)
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

impl ExportStream {
    /// The next part; `None` once the shard sent everything.
    pub async fn next(&mut self) -> Result<Option<ExportPart>, ClientError> {
        match self.parts.message().await {
            Ok(Some(p)) => ExportPart::try_from(p)
                .map(Some)
                .map_err(|e| ClientError::Protocol(format!("shard {}: {e}", self.shard))),
            Ok(None) => Ok(None),
            Err(s) => Err(ClientError::from_status(self.shard, &self.endpoint, s)),
        }
    }
}

impl PsClient {
    /// Starts shard `shard`'s export of its checkpoint `checkpoint` (with `since`, an
    /// incremental one: the sparse rows changed since that earlier checkpoint, and the keys
    /// gone) for `tables`, in that order.
    pub async fn export_checkpoint(
        &self,
        shard: usize,
        checkpoint: &str,
        since: Option<&str>,
        tables: &[String],
    ) -> Result<ExportStream, ClientError> {
        if shard >= self.inner.num_shards {
            return Err(ClientError::InvalidInput(format!(
                "shard {shard} of {}",
                self.inner.num_shards
            )));
        }
        let req = pb::ExportCheckpointRequest {
            checkpoint: checkpoint.to_owned(),
            since: since.unwrap_or_default().to_owned(),
            tables: tables.to_vec(),
        };
        let (endpoint, parts) = self
            .inner
            .call_shard(shard, |s, _| {
                let req = req.clone();
                let mut c = s.grpc;
                let endpoint = s.endpoint;
                async move {
                    c.export_checkpoint(req)
                        .await
                        .map(|r| (endpoint, r.into_inner()))
                }
            })
            .await?;
        Ok(ExportStream {
            shard,
            endpoint,
            parts,
        })
    }

    /// Creates a table on every shard (idempotent: the same spec again is fine) and returns the
    /// spec as stored, defaults filled in.
    pub async fn create_table(&self, spec: TableSpec) -> Result<TableSpec, ClientError> {
        let req = pb::CreateTableRequest {
            spec: Some((&spec).into()),
        };
        let answers = self
            .inner
            .all(|mut c, _| {
                let req = req.clone();
                async move { c.create_table(req).await }
            })
            .await?;
        let stored = answers
            .into_iter()
            .next()
            .and_then(|a| a.spec)
            .ok_or_else(|| ClientError::Protocol("CreateTable answered without a spec".into()))?;
        let stored =
            TableSpec::try_from(stored).map_err(|e| ClientError::Protocol(e.to_string()))?;
        self.inner
            .specs
            .write()
            .insert(stored.name.clone(), stored.clone());
        Ok(stored)
    }

    /// The spec of table `name` (cached after the first call).
    pub async fn describe_table(&self, name: &str) -> Result<TableSpec, ClientError> {
        let name = table_name(name)?;
        if let Some(s) = self.inner.specs.read().get(&name) {
            return Ok(s.clone());
        }
        let req = pb::DescribeTableRequest {
            name: name.to_string(),
        };
        let resp = self
            .inner
            .call(0, |mut c, _| {
                let req = req.clone();
                async move { c.describe_table(req).await }
            })
            .await?;
        let spec = resp
            .spec
            .ok_or_else(|| ClientError::Protocol("DescribeTable answered without a spec".into()))?;
        let spec = TableSpec::try_from(spec).map_err(|e| ClientError::Protocol(e.to_string()))?;
        self.inner.specs.write().insert(name, spec.clone());
        Ok(spec)
    }

    pub async fn list_tables(&self) -> Result<Vec<TableSpec>, ClientError> {
        let resp = self
            .inner
            .call(0, |mut c, _| async move {
                c.list_tables(pb::ListTablesRequest {}).await
            })
            .await?;
        resp.tables
            .into_iter()
            .map(|t| TableSpec::try_from(t).map_err(|e| ClientError::Protocol(e.to_string())))
            .collect()
    }

    /// Drops table `name` on every shard.
    pub async fn drop_table(&self, name: &str) -> Result<(), ClientError> {
        let name = table_name(name)?;
        self.inner.specs.write().remove(&name);
        self.inner.codecs.forget(&name);
        let req = pb::DropTableRequest {
            name: name.to_string(),
        };
        self.inner
            .all(|mut c, _| {
                let req = req.clone();
                async move { c.drop_table(req).await }
            })
            .await?;
        Ok(())
    }

    pub(crate) async fn dense_spec(
        &self,
        name: &str,
    ) -> Result<(TableSpec, ps_core::DenseShape), ClientError> {
        let spec = self.describe_table(name).await?;
        match &spec.kind {
            TableKind::Dense(shape) => {
                let shape = shape.clone();
                Ok((spec, shape))
            }
            TableKind::Sparse { .. } => Err(ClientError::InvalidInput(format!(
                "table `{name}` is sparse; use push_sparse / pull_sparse"
            ))),
        }
    }

    pub(crate) async fn sparse_dim(&self, name: &str) -> Result<(TableSpec, usize), ClientError> {
        let spec = self.describe_table(name).await?;
        match spec.kind {
            TableKind::Sparse { dim } => Ok((spec, dim as usize)),
            TableKind::Dense(_) => Err(ClientError::InvalidInput(format!(
                "table `{name}` is dense; use push_dense / pull_dense"
            ))),
        }
    }

    /// Checkpoints every shard under the same name (empty: a time-based name per shard).
    pub async fn checkpoint(&self, name: &str) -> Result<Vec<ShardCheckpoint>, ClientError> {
        let req = pb::CheckpointRequest {
            name: name.to_owned(),
        };
        let answers = self
            .inner
            .all(|mut c, _| {
                let req = req.clone();
                async move { c.checkpoint(req).await }
            })
            .await?;
        Ok(answers
            .into_iter()
            .enumerate()
            .map(|(shard, a)| ShardCheckpoint {
                shard,
                name: a.name,
                path: a.path,
                files: a.files,
                bytes: a.bytes,
                sequence: a.sequence,
            })
            .collect())
    }

    /// Deletes checkpoint `name` from every shard that has it (a shard without it answers
    /// `deleted: false`); what each shard did, by shard index.
    pub async fn delete_checkpoint(&self, name: &str) -> Result<Vec<Deleted>, ClientError> {
        let req = pb::DeleteCheckpointRequest {
            name: name.to_owned(),
        };
        let answers = self
            .inner
            .all(|mut c, _| {
                let req = req.clone();
                async move { c.delete_checkpoint(req).await }
            })
            .await?;
        Ok(answers
            .into_iter()
            .map(|a| Deleted {
                deleted: a.deleted,
                freed_bytes: a.freed_bytes,
            })
            .collect())
    }

    /// Restores checkpoint `name` on every shard, replacing each shard's whole state (pushes
    /// acknowledged after the checkpoint are discarded). The scheduler's resume calls this with
    /// the workers held; calling it under running training loses their recent updates.
    pub async fn restore_checkpoint(&self, names: &[String]) -> Result<(), ClientError> {
        if names.len() != self.inner.num_shards {
            return Err(ClientError::InvalidInput(format!(
                "{} checkpoint names for {} shards",
                names.len(),
                self.inner.num_shards
            )));
        }
        futures::future::try_join_all(names.iter().enumerate().map(|(s, name)| {
            let req = pb::RestoreCheckpointRequest { name: name.clone() };
            self.inner.call(s, move |mut c, _| {
                let req = req.clone();
                async move { c.restore_checkpoint(req).await }
            })
        }))
        .await?;
        Ok(())
    }

    /// Every shard's statistics, in shard order.
    pub async fn stats(&self) -> Result<Vec<ShardStats>, ClientError> {
        let answers = self
            .inner
            .all(|mut c, _| async move { c.get_stats(pb::GetStatsRequest {}).await })
            .await?;
        Ok(answers.into_iter().map(ShardStats::from).collect())
    }
}
