//! The one mapping of the shard's errors to gRPC statuses: each variant picks its code and its
//! `google.rpc.ErrorInfo` reason (`ps_core::wire::reason`) here, exhaustively, for the gRPC
//! edge and the bulk stream alike.

use ps_core::wire::reason;
use ps_runtime::status::{invalid_field, refusal};
use tonic::{Code, Status};

use crate::engine::EngineError;

impl From<EngineError> for Status {
    fn from(e: EngineError) -> Self {
        let message = e.to_string();
        match e {
            EngineError::Invalid(v) => invalid_field(&v),
            EngineError::Decode {
                field, encoding, ..
            } => refusal(
                Code::InvalidArgument,
                reason::UNDECODABLE_PAYLOAD,
                message,
                [("field", field), ("encoding", encoding.name().to_owned())],
            ),
            EngineError::NonFinite { table, .. } => refusal(
                Code::InvalidArgument,
                reason::NON_FINITE,
                message,
                [("table", table.to_string())],
            ),
            EngineError::NoSuchTable { table } | EngineError::TableDropped { table } => refusal(
                Code::NotFound,
                reason::TABLE_NOT_FOUND,
                message,
                [("table", table.to_string())],
            ),
            EngineError::TableExists { table, .. } => refusal(
                Code::AlreadyExists,
                reason::TABLE_SPEC_CONFLICT,
                message,
                [("table", table.to_string())],
            ),
            EngineError::WrongKind { table, kind, .. } => refusal(
                Code::FailedPrecondition,
                reason::WRONG_TABLE_KIND,
                message,
                [("table", table.to_string()), ("kind", kind.to_owned())],
            ),
            EngineError::ChunkOutOfRange {
                table,
                chunk,
                chunks,
            } => refusal(
                Code::OutOfRange,
                reason::CHUNK_OUT_OF_RANGE,
                message,
                [
                    ("table", table.to_string()),
                    ("chunk", chunk.to_string()),
                    ("chunks", chunks.to_string()),
                ],
            ),
            EngineError::NotOwner {
                owner,
                shard,
                shards,
                ..
            } => refusal(
                Code::FailedPrecondition,
                reason::NOT_OWNER,
                message,
                [
                    ("owner", owner.to_string()),
                    ("shard", shard.to_string()),
                    ("shards", shards.to_string()),
                ],
            ),
            EngineError::StaleMap { request, current } => refusal(
                Code::FailedPrecondition,
                reason::STALE_MAP,
                message,
                epochs(request, current),
            ),
            EngineError::MapAhead { request, current } => refusal(
                Code::Unavailable,
                reason::MAP_AHEAD,
                message,
                epochs(request, current),
            ),
            EngineError::NoScheduler { request } => refusal(
                Code::FailedPrecondition,
                reason::NO_SCHEDULER,
                message,
                [("request_epoch", request.to_string())],
            ),
            EngineError::OverLimit {
                limit_name,
                needed,
                limit,
                ..
            } => refusal(
                Code::ResourceExhausted,
                reason::RESOURCE_LIMIT,
                message,
                [
                    ("resource", limit_name.to_owned()),
                    ("needed_bytes", needed.to_string()),
                    ("limit_bytes", limit.to_string()),
                ],
            ),
            EngineError::TableNotLoaded { table, .. } => refusal(
                Code::FailedPrecondition,
                reason::TABLE_NOT_LOADED,
                message,
                [("table", table.to_string())],
            ),
            EngineError::CheckpointDamaged { name, .. } => refusal(
                Code::DataLoss,
                reason::CHECKPOINT_DAMAGED,
                message,
                [("checkpoint", name)],
            ),
            EngineError::NotRegistered { request } => refusal(
                Code::Unavailable,
                reason::NOT_REGISTERED,
                message,
                [("request_epoch", request.to_string())],
            ),
            EngineError::ShuttingDown => {
                refusal(Code::Unavailable, reason::SHUTTING_DOWN, message, [])
            }
            EngineError::ReadOnly { .. } => {
                refusal(Code::Unavailable, reason::READ_ONLY, message, [])
            }
            EngineError::NotDurable => {
                refusal(Code::FailedPrecondition, reason::NOT_DURABLE, message, [])
            }
            EngineError::NoSuchCheckpoint { name } => refusal(
                Code::NotFound,
                reason::CHECKPOINT_NOT_FOUND,
                message,
                [("checkpoint", name)],
            ),
            EngineError::CheckpointInUse { name, .. } => refusal(
                Code::FailedPrecondition,
                reason::CHECKPOINT_IN_USE,
                message,
                [("checkpoint", name)],
            ),
            EngineError::CheckpointExists { name, .. } => refusal(
                Code::AlreadyExists,
                reason::CHECKPOINT_EXISTS,
                message,
                [("checkpoint", name)],
            ),
            EngineError::Checkpoint { .. }
            | EngineError::WrongIdentity { .. }
            | EngineError::ChunkNotLoaded { .. }
            | EngineError::Store(_)
            | EngineError::PushLog(_) => refusal(Code::Internal, reason::INTERNAL, message, []),
        }
    }
}

fn epochs(request: u64, current: u64) -> [(&'static str, String); 2] {
    [
        ("request_epoch", request.to_string()),
        ("current_epoch", current.to_string()),
    ]
}
