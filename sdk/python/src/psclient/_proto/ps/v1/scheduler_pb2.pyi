from psclient._proto.ps.v1 import ps_pb2 as _ps_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ConsistencyModel(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CONSISTENCY_MODEL_UNSPECIFIED: _ClassVar[ConsistencyModel]
    CONSISTENCY_MODEL_BSP: _ClassVar[ConsistencyModel]
    CONSISTENCY_MODEL_SSP: _ClassVar[ConsistencyModel]
    CONSISTENCY_MODEL_ASP: _ClassVar[ConsistencyModel]

class JobState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JOB_STATE_UNSPECIFIED: _ClassVar[JobState]
    JOB_STATE_WAITING: _ClassVar[JobState]
    JOB_STATE_RUNNING: _ClassVar[JobState]
    JOB_STATE_PAUSED: _ClassVar[JobState]
    JOB_STATE_SUCCEEDED: _ClassVar[JobState]
    JOB_STATE_CANCELED: _ClassVar[JobState]
    JOB_STATE_FAILED: _ClassVar[JobState]
CONSISTENCY_MODEL_UNSPECIFIED: ConsistencyModel
CONSISTENCY_MODEL_BSP: ConsistencyModel
CONSISTENCY_MODEL_SSP: ConsistencyModel
CONSISTENCY_MODEL_ASP: ConsistencyModel
JOB_STATE_UNSPECIFIED: JobState
JOB_STATE_WAITING: JobState
JOB_STATE_RUNNING: JobState
JOB_STATE_PAUSED: JobState
JOB_STATE_SUCCEEDED: JobState
JOB_STATE_CANCELED: JobState
JOB_STATE_FAILED: JobState

class JobTable(_message.Message):
    __slots__ = ("spec", "codec", "pull_codec")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    CODEC_FIELD_NUMBER: _ClassVar[int]
    PULL_CODEC_FIELD_NUMBER: _ClassVar[int]
    spec: _ps_pb2.TableSpec
    codec: str
    pull_codec: str
    def __init__(self, spec: _Optional[_Union[_ps_pb2.TableSpec, _Mapping]] = ..., codec: _Optional[str] = ..., pull_codec: _Optional[str] = ...) -> None: ...

class JobSpec(_message.Message):
    __slots__ = ("name", "tables", "consistency", "staleness", "num_shards", "num_workers", "data_shards", "dataset", "model", "checkpoint_every", "global_batch", "balance_batches", "max_clocks", "lease_ms", "seed", "keep_checkpoints")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TABLES_FIELD_NUMBER: _ClassVar[int]
    CONSISTENCY_FIELD_NUMBER: _ClassVar[int]
    STALENESS_FIELD_NUMBER: _ClassVar[int]
    NUM_SHARDS_FIELD_NUMBER: _ClassVar[int]
    NUM_WORKERS_FIELD_NUMBER: _ClassVar[int]
    DATA_SHARDS_FIELD_NUMBER: _ClassVar[int]
    DATASET_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_EVERY_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_BATCH_FIELD_NUMBER: _ClassVar[int]
    BALANCE_BATCHES_FIELD_NUMBER: _ClassVar[int]
    MAX_CLOCKS_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    KEEP_CHECKPOINTS_FIELD_NUMBER: _ClassVar[int]
    name: str
    tables: _containers.RepeatedCompositeFieldContainer[JobTable]
    consistency: ConsistencyModel
    staleness: int
    num_shards: int
    num_workers: int
    data_shards: int
    dataset: str
    model: str
    checkpoint_every: int
    global_batch: int
    balance_batches: bool
    max_clocks: int
    lease_ms: int
    seed: int
    keep_checkpoints: int
    def __init__(self, name: _Optional[str] = ..., tables: _Optional[_Iterable[_Union[JobTable, _Mapping]]] = ..., consistency: _Optional[_Union[ConsistencyModel, str]] = ..., staleness: _Optional[int] = ..., num_shards: _Optional[int] = ..., num_workers: _Optional[int] = ..., data_shards: _Optional[int] = ..., dataset: _Optional[str] = ..., model: _Optional[str] = ..., checkpoint_every: _Optional[int] = ..., global_batch: _Optional[int] = ..., balance_batches: _Optional[bool] = ..., max_clocks: _Optional[int] = ..., lease_ms: _Optional[int] = ..., seed: _Optional[int] = ..., keep_checkpoints: _Optional[int] = ...) -> None: ...

class SubmitJobRequest(_message.Message):
    __slots__ = ("spec",)
    SPEC_FIELD_NUMBER: _ClassVar[int]
    spec: JobSpec
    def __init__(self, spec: _Optional[_Union[JobSpec, _Mapping]] = ...) -> None: ...

class GetJobRequest(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: str
    def __init__(self, job: _Optional[str] = ...) -> None: ...

class ListJobsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListJobsResponse(_message.Message):
    __slots__ = ("jobs",)
    JOBS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[JobStatus]
    def __init__(self, jobs: _Optional[_Iterable[_Union[JobStatus, _Mapping]]] = ...) -> None: ...

class CancelJobRequest(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: str
    def __init__(self, job: _Optional[str] = ...) -> None: ...

class StalenessStats(_message.Message):
    __slots__ = ("max_gap", "mean_gap", "wait_ms_total", "wait_ms_p99", "param_age_ms_mean", "advances")
    MAX_GAP_FIELD_NUMBER: _ClassVar[int]
    MEAN_GAP_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_P99_FIELD_NUMBER: _ClassVar[int]
    PARAM_AGE_MS_MEAN_FIELD_NUMBER: _ClassVar[int]
    ADVANCES_FIELD_NUMBER: _ClassVar[int]
    max_gap: int
    mean_gap: float
    wait_ms_total: float
    wait_ms_p99: float
    param_age_ms_mean: float
    advances: int
    def __init__(self, max_gap: _Optional[int] = ..., mean_gap: _Optional[float] = ..., wait_ms_total: _Optional[float] = ..., wait_ms_p99: _Optional[float] = ..., param_age_ms_mean: _Optional[float] = ..., advances: _Optional[int] = ...) -> None: ...

class WorkerStatus(_message.Message):
    __slots__ = ("worker_id", "name", "live", "clock", "data_shards", "batch_size", "examples_per_sec", "staleness")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    LIVE_FIELD_NUMBER: _ClassVar[int]
    CLOCK_FIELD_NUMBER: _ClassVar[int]
    DATA_SHARDS_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    EXAMPLES_PER_SEC_FIELD_NUMBER: _ClassVar[int]
    STALENESS_FIELD_NUMBER: _ClassVar[int]
    worker_id: int
    name: str
    live: bool
    clock: int
    data_shards: _containers.RepeatedScalarFieldContainer[int]
    batch_size: int
    examples_per_sec: float
    staleness: StalenessStats
    def __init__(self, worker_id: _Optional[int] = ..., name: _Optional[str] = ..., live: _Optional[bool] = ..., clock: _Optional[int] = ..., data_shards: _Optional[_Iterable[int]] = ..., batch_size: _Optional[int] = ..., examples_per_sec: _Optional[float] = ..., staleness: _Optional[_Union[StalenessStats, _Mapping]] = ...) -> None: ...

class JobStatus(_message.Message):
    __slots__ = ("spec", "state", "message", "min_clock", "max_clock", "map_epoch", "workers", "staleness", "latest_checkpoint", "advances_per_sec", "cost")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    MIN_CLOCK_FIELD_NUMBER: _ClassVar[int]
    MAX_CLOCK_FIELD_NUMBER: _ClassVar[int]
    MAP_EPOCH_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    STALENESS_FIELD_NUMBER: _ClassVar[int]
    LATEST_CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    ADVANCES_PER_SEC_FIELD_NUMBER: _ClassVar[int]
    COST_FIELD_NUMBER: _ClassVar[int]
    spec: JobSpec
    state: JobState
    message: str
    min_clock: int
    max_clock: int
    map_epoch: int
    workers: _containers.RepeatedCompositeFieldContainer[WorkerStatus]
    staleness: StalenessStats
    latest_checkpoint: str
    advances_per_sec: float
    cost: JobCost
    def __init__(self, spec: _Optional[_Union[JobSpec, _Mapping]] = ..., state: _Optional[_Union[JobState, str]] = ..., message: _Optional[str] = ..., min_clock: _Optional[int] = ..., max_clock: _Optional[int] = ..., map_epoch: _Optional[int] = ..., workers: _Optional[_Iterable[_Union[WorkerStatus, _Mapping]]] = ..., staleness: _Optional[_Union[StalenessStats, _Mapping]] = ..., latest_checkpoint: _Optional[str] = ..., advances_per_sec: _Optional[float] = ..., cost: _Optional[_Union[JobCost, _Mapping]] = ...) -> None: ...

class JobCost(_message.Message):
    __slots__ = ("wall_seconds", "worker_cpu_seconds", "shard_cpu_seconds", "bytes_moved", "bytes_stored")
    WALL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    WORKER_CPU_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SHARD_CPU_SECONDS_FIELD_NUMBER: _ClassVar[int]
    BYTES_MOVED_FIELD_NUMBER: _ClassVar[int]
    BYTES_STORED_FIELD_NUMBER: _ClassVar[int]
    wall_seconds: float
    worker_cpu_seconds: float
    shard_cpu_seconds: float
    bytes_moved: int
    bytes_stored: int
    def __init__(self, wall_seconds: _Optional[float] = ..., worker_cpu_seconds: _Optional[float] = ..., shard_cpu_seconds: _Optional[float] = ..., bytes_moved: _Optional[int] = ..., bytes_stored: _Optional[int] = ...) -> None: ...

class RegisterShardRequest(_message.Message):
    __slots__ = ("shard_index", "num_shards", "virtual_nodes", "endpoint")
    SHARD_INDEX_FIELD_NUMBER: _ClassVar[int]
    NUM_SHARDS_FIELD_NUMBER: _ClassVar[int]
    VIRTUAL_NODES_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    shard_index: int
    num_shards: int
    virtual_nodes: int
    endpoint: str
    def __init__(self, shard_index: _Optional[int] = ..., num_shards: _Optional[int] = ..., virtual_nodes: _Optional[int] = ..., endpoint: _Optional[str] = ...) -> None: ...

class RegisterShardResponse(_message.Message):
    __slots__ = ("map_epoch", "lease_ms")
    MAP_EPOCH_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    map_epoch: int
    lease_ms: int
    def __init__(self, map_epoch: _Optional[int] = ..., lease_ms: _Optional[int] = ...) -> None: ...

class ShardHeartbeatRequest(_message.Message):
    __slots__ = ("shard_index", "endpoint")
    SHARD_INDEX_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    shard_index: int
    endpoint: str
    def __init__(self, shard_index: _Optional[int] = ..., endpoint: _Optional[str] = ...) -> None: ...

class ShardHeartbeatResponse(_message.Message):
    __slots__ = ("map_epoch",)
    MAP_EPOCH_FIELD_NUMBER: _ClassVar[int]
    map_epoch: int
    def __init__(self, map_epoch: _Optional[int] = ...) -> None: ...

class GetShardMapRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ShardMap(_message.Message):
    __slots__ = ("epoch", "num_shards", "virtual_nodes", "endpoints", "complete")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    NUM_SHARDS_FIELD_NUMBER: _ClassVar[int]
    VIRTUAL_NODES_FIELD_NUMBER: _ClassVar[int]
    ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    num_shards: int
    virtual_nodes: int
    endpoints: _containers.RepeatedScalarFieldContainer[str]
    complete: bool
    def __init__(self, epoch: _Optional[int] = ..., num_shards: _Optional[int] = ..., virtual_nodes: _Optional[int] = ..., endpoints: _Optional[_Iterable[str]] = ..., complete: _Optional[bool] = ...) -> None: ...

class JoinJobRequest(_message.Message):
    __slots__ = ("job", "worker_name", "worker_id")
    JOB_FIELD_NUMBER: _ClassVar[int]
    WORKER_NAME_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    job: str
    worker_name: str
    worker_id: int
    def __init__(self, job: _Optional[str] = ..., worker_name: _Optional[str] = ..., worker_id: _Optional[int] = ...) -> None: ...

class Assignment(_message.Message):
    __slots__ = ("version", "data_shards", "num_data_shards", "batch_size")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DATA_SHARDS_FIELD_NUMBER: _ClassVar[int]
    NUM_DATA_SHARDS_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    version: int
    data_shards: _containers.RepeatedScalarFieldContainer[int]
    num_data_shards: int
    batch_size: int
    def __init__(self, version: _Optional[int] = ..., data_shards: _Optional[_Iterable[int]] = ..., num_data_shards: _Optional[int] = ..., batch_size: _Optional[int] = ...) -> None: ...

class JoinJobResponse(_message.Message):
    __slots__ = ("worker_id", "lease_ms", "clock", "assignment", "shard_map", "spec")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    CLOCK_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENT_FIELD_NUMBER: _ClassVar[int]
    SHARD_MAP_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    worker_id: int
    lease_ms: int
    clock: int
    assignment: Assignment
    shard_map: ShardMap
    spec: JobSpec
    def __init__(self, worker_id: _Optional[int] = ..., lease_ms: _Optional[int] = ..., clock: _Optional[int] = ..., assignment: _Optional[_Union[Assignment, _Mapping]] = ..., shard_map: _Optional[_Union[ShardMap, _Mapping]] = ..., spec: _Optional[_Union[JobSpec, _Mapping]] = ...) -> None: ...

class WorkerHeartbeatRequest(_message.Message):
    __slots__ = ("job", "worker_id")
    JOB_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    job: str
    worker_id: int
    def __init__(self, job: _Optional[str] = ..., worker_id: _Optional[int] = ...) -> None: ...

class WorkerHeartbeatResponse(_message.Message):
    __slots__ = ("map_epoch", "state")
    MAP_EPOCH_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    map_epoch: int
    state: JobState
    def __init__(self, map_epoch: _Optional[int] = ..., state: _Optional[_Union[JobState, str]] = ...) -> None: ...

class AdvanceClockRequest(_message.Message):
    __slots__ = ("job", "worker_id", "finished", "examples", "compute_us", "param_age_us", "wait_ms", "cpu_us")
    JOB_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    EXAMPLES_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_US_FIELD_NUMBER: _ClassVar[int]
    PARAM_AGE_US_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    CPU_US_FIELD_NUMBER: _ClassVar[int]
    job: str
    worker_id: int
    finished: int
    examples: int
    compute_us: int
    param_age_us: int
    wait_ms: int
    cpu_us: int
    def __init__(self, job: _Optional[str] = ..., worker_id: _Optional[int] = ..., finished: _Optional[int] = ..., examples: _Optional[int] = ..., compute_us: _Optional[int] = ..., param_age_us: _Optional[int] = ..., wait_ms: _Optional[int] = ..., cpu_us: _Optional[int] = ...) -> None: ...

class AdvanceClockResponse(_message.Message):
    __slots__ = ("ready", "clock", "min_clock", "assignment", "map_epoch", "state", "stop")
    READY_FIELD_NUMBER: _ClassVar[int]
    CLOCK_FIELD_NUMBER: _ClassVar[int]
    MIN_CLOCK_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENT_FIELD_NUMBER: _ClassVar[int]
    MAP_EPOCH_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    ready: bool
    clock: int
    min_clock: int
    assignment: Assignment
    map_epoch: int
    state: JobState
    stop: bool
    def __init__(self, ready: _Optional[bool] = ..., clock: _Optional[int] = ..., min_clock: _Optional[int] = ..., assignment: _Optional[_Union[Assignment, _Mapping]] = ..., map_epoch: _Optional[int] = ..., state: _Optional[_Union[JobState, str]] = ..., stop: _Optional[bool] = ...) -> None: ...

class LeaveJobRequest(_message.Message):
    __slots__ = ("job", "worker_id")
    JOB_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    job: str
    worker_id: int
    def __init__(self, job: _Optional[str] = ..., worker_id: _Optional[int] = ...) -> None: ...

class LeaveJobResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CheckpointJobRequest(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: str
    def __init__(self, job: _Optional[str] = ...) -> None: ...

class ShardCheckpointRef(_message.Message):
    __slots__ = ("shard_index", "endpoint", "name", "path", "files", "bytes", "sequence")
    SHARD_INDEX_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    shard_index: int
    endpoint: str
    name: str
    path: str
    files: int
    bytes: int
    sequence: int
    def __init__(self, shard_index: _Optional[int] = ..., endpoint: _Optional[str] = ..., name: _Optional[str] = ..., path: _Optional[str] = ..., files: _Optional[int] = ..., bytes: _Optional[int] = ..., sequence: _Optional[int] = ...) -> None: ...

class JobCheckpoint(_message.Message):
    __slots__ = ("job", "name", "clock", "created_unix_ms", "map_epoch", "shards")
    JOB_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    CLOCK_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    MAP_EPOCH_FIELD_NUMBER: _ClassVar[int]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    job: str
    name: str
    clock: int
    created_unix_ms: int
    map_epoch: int
    shards: _containers.RepeatedCompositeFieldContainer[ShardCheckpointRef]
    def __init__(self, job: _Optional[str] = ..., name: _Optional[str] = ..., clock: _Optional[int] = ..., created_unix_ms: _Optional[int] = ..., map_epoch: _Optional[int] = ..., shards: _Optional[_Iterable[_Union[ShardCheckpointRef, _Mapping]]] = ...) -> None: ...

class ListCheckpointsRequest(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: str
    def __init__(self, job: _Optional[str] = ...) -> None: ...

class ListCheckpointsResponse(_message.Message):
    __slots__ = ("checkpoints",)
    CHECKPOINTS_FIELD_NUMBER: _ClassVar[int]
    checkpoints: _containers.RepeatedCompositeFieldContainer[JobCheckpoint]
    def __init__(self, checkpoints: _Optional[_Iterable[_Union[JobCheckpoint, _Mapping]]] = ...) -> None: ...

class DeleteJobCheckpointRequest(_message.Message):
    __slots__ = ("job", "name")
    JOB_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    job: str
    name: str
    def __init__(self, job: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class DeleteJobCheckpointResponse(_message.Message):
    __slots__ = ("freed_bytes",)
    FREED_BYTES_FIELD_NUMBER: _ClassVar[int]
    freed_bytes: int
    def __init__(self, freed_bytes: _Optional[int] = ...) -> None: ...

class ResumeJobRequest(_message.Message):
    __slots__ = ("job", "checkpoint")
    JOB_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    job: str
    checkpoint: str
    def __init__(self, job: _Optional[str] = ..., checkpoint: _Optional[str] = ...) -> None: ...
