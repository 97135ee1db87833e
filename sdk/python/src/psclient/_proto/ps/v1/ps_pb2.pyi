from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class NonFinitePolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NON_FINITE_POLICY_UNSPECIFIED: _ClassVar[NonFinitePolicy]
    NON_FINITE_POLICY_REJECT: _ClassVar[NonFinitePolicy]
    NON_FINITE_POLICY_SKIP: _ClassVar[NonFinitePolicy]

class Encoding(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ENCODING_UNSPECIFIED: _ClassVar[Encoding]
    ENCODING_F32: _ClassVar[Encoding]
    ENCODING_F16: _ClassVar[Encoding]
    ENCODING_BF16: _ClassVar[Encoding]
    ENCODING_INT8: _ClassVar[Encoding]
    ENCODING_SIGN: _ClassVar[Encoding]
    ENCODING_QSGD: _ClassVar[Encoding]
    ENCODING_SPARSE_F32: _ClassVar[Encoding]
    ENCODING_SPARSE_F16: _ClassVar[Encoding]
    ENCODING_INT4: _ClassVar[Encoding]

class Compression(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    COMPRESSION_NONE: _ClassVar[Compression]
    COMPRESSION_LZ4: _ClassVar[Compression]
NON_FINITE_POLICY_UNSPECIFIED: NonFinitePolicy
NON_FINITE_POLICY_REJECT: NonFinitePolicy
NON_FINITE_POLICY_SKIP: NonFinitePolicy
ENCODING_UNSPECIFIED: Encoding
ENCODING_F32: Encoding
ENCODING_F16: Encoding
ENCODING_BF16: Encoding
ENCODING_INT8: Encoding
ENCODING_SIGN: Encoding
ENCODING_QSGD: Encoding
ENCODING_SPARSE_F32: Encoding
ENCODING_SPARSE_F16: Encoding
ENCODING_INT4: Encoding
COMPRESSION_NONE: Compression
COMPRESSION_LZ4: Compression

class TableSpec(_message.Message):
    __slots__ = ("name", "dense", "sparse", "optimizer", "initializer", "non_finite")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DENSE_FIELD_NUMBER: _ClassVar[int]
    SPARSE_FIELD_NUMBER: _ClassVar[int]
    OPTIMIZER_FIELD_NUMBER: _ClassVar[int]
    INITIALIZER_FIELD_NUMBER: _ClassVar[int]
    NON_FINITE_FIELD_NUMBER: _ClassVar[int]
    name: str
    dense: DenseSpec
    sparse: SparseSpec
    optimizer: Optimizer
    initializer: Initializer
    non_finite: NonFinitePolicy
    def __init__(self, name: _Optional[str] = ..., dense: _Optional[_Union[DenseSpec, _Mapping]] = ..., sparse: _Optional[_Union[SparseSpec, _Mapping]] = ..., optimizer: _Optional[_Union[Optimizer, _Mapping]] = ..., initializer: _Optional[_Union[Initializer, _Mapping]] = ..., non_finite: _Optional[_Union[NonFinitePolicy, str]] = ...) -> None: ...

class DenseSpec(_message.Message):
    __slots__ = ("shape", "chunk_elems")
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    CHUNK_ELEMS_FIELD_NUMBER: _ClassVar[int]
    shape: _containers.RepeatedScalarFieldContainer[int]
    chunk_elems: int
    def __init__(self, shape: _Optional[_Iterable[int]] = ..., chunk_elems: _Optional[int] = ...) -> None: ...

class SparseSpec(_message.Message):
    __slots__ = ("dim", "admit_after", "ttl_seconds", "ttl_clocks", "max_rows", "placed_with")
    DIM_FIELD_NUMBER: _ClassVar[int]
    ADMIT_AFTER_FIELD_NUMBER: _ClassVar[int]
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TTL_CLOCKS_FIELD_NUMBER: _ClassVar[int]
    MAX_ROWS_FIELD_NUMBER: _ClassVar[int]
    PLACED_WITH_FIELD_NUMBER: _ClassVar[int]
    dim: int
    admit_after: int
    ttl_seconds: int
    ttl_clocks: int
    max_rows: int
    placed_with: str
    def __init__(self, dim: _Optional[int] = ..., admit_after: _Optional[int] = ..., ttl_seconds: _Optional[int] = ..., ttl_clocks: _Optional[int] = ..., max_rows: _Optional[int] = ..., placed_with: _Optional[str] = ...) -> None: ...

class Optimizer(_message.Message):
    __slots__ = ("sgd", "momentum", "adagrad", "adam", "ftrl")
    SGD_FIELD_NUMBER: _ClassVar[int]
    MOMENTUM_FIELD_NUMBER: _ClassVar[int]
    ADAGRAD_FIELD_NUMBER: _ClassVar[int]
    ADAM_FIELD_NUMBER: _ClassVar[int]
    FTRL_FIELD_NUMBER: _ClassVar[int]
    sgd: Sgd
    momentum: Momentum
    adagrad: Adagrad
    adam: Adam
    ftrl: Ftrl
    def __init__(self, sgd: _Optional[_Union[Sgd, _Mapping]] = ..., momentum: _Optional[_Union[Momentum, _Mapping]] = ..., adagrad: _Optional[_Union[Adagrad, _Mapping]] = ..., adam: _Optional[_Union[Adam, _Mapping]] = ..., ftrl: _Optional[_Union[Ftrl, _Mapping]] = ...) -> None: ...

class Sgd(_message.Message):
    __slots__ = ("learning_rate",)
    LEARNING_RATE_FIELD_NUMBER: _ClassVar[int]
    learning_rate: float
    def __init__(self, learning_rate: _Optional[float] = ...) -> None: ...

class Momentum(_message.Message):
    __slots__ = ("learning_rate", "momentum", "nesterov")
    LEARNING_RATE_FIELD_NUMBER: _ClassVar[int]
    MOMENTUM_FIELD_NUMBER: _ClassVar[int]
    NESTEROV_FIELD_NUMBER: _ClassVar[int]
    learning_rate: float
    momentum: float
    nesterov: bool
    def __init__(self, learning_rate: _Optional[float] = ..., momentum: _Optional[float] = ..., nesterov: _Optional[bool] = ...) -> None: ...

class Adagrad(_message.Message):
    __slots__ = ("learning_rate", "initial_accumulator", "epsilon")
    LEARNING_RATE_FIELD_NUMBER: _ClassVar[int]
    INITIAL_ACCUMULATOR_FIELD_NUMBER: _ClassVar[int]
    EPSILON_FIELD_NUMBER: _ClassVar[int]
    learning_rate: float
    initial_accumulator: float
    epsilon: float
    def __init__(self, learning_rate: _Optional[float] = ..., initial_accumulator: _Optional[float] = ..., epsilon: _Optional[float] = ...) -> None: ...

class Adam(_message.Message):
    __slots__ = ("learning_rate", "beta1", "beta2", "epsilon")
    LEARNING_RATE_FIELD_NUMBER: _ClassVar[int]
    BETA1_FIELD_NUMBER: _ClassVar[int]
    BETA2_FIELD_NUMBER: _ClassVar[int]
    EPSILON_FIELD_NUMBER: _ClassVar[int]
    learning_rate: float
    beta1: float
    beta2: float
    epsilon: float
    def __init__(self, learning_rate: _Optional[float] = ..., beta1: _Optional[float] = ..., beta2: _Optional[float] = ..., epsilon: _Optional[float] = ...) -> None: ...

class Ftrl(_message.Message):
    __slots__ = ("alpha", "beta", "l1", "l2")
    ALPHA_FIELD_NUMBER: _ClassVar[int]
    BETA_FIELD_NUMBER: _ClassVar[int]
    L1_FIELD_NUMBER: _ClassVar[int]
    L2_FIELD_NUMBER: _ClassVar[int]
    alpha: float
    beta: float
    l1: float
    l2: float
    def __init__(self, alpha: _Optional[float] = ..., beta: _Optional[float] = ..., l1: _Optional[float] = ..., l2: _Optional[float] = ...) -> None: ...

class Initializer(_message.Message):
    __slots__ = ("zeros", "uniform", "normal", "seed")
    ZEROS_FIELD_NUMBER: _ClassVar[int]
    UNIFORM_FIELD_NUMBER: _ClassVar[int]
    NORMAL_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    zeros: Zeros
    uniform: Uniform
    normal: Normal
    seed: int
    def __init__(self, zeros: _Optional[_Union[Zeros, _Mapping]] = ..., uniform: _Optional[_Union[Uniform, _Mapping]] = ..., normal: _Optional[_Union[Normal, _Mapping]] = ..., seed: _Optional[int] = ...) -> None: ...

class Zeros(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Uniform(_message.Message):
    __slots__ = ("low", "high")
    LOW_FIELD_NUMBER: _ClassVar[int]
    HIGH_FIELD_NUMBER: _ClassVar[int]
    low: float
    high: float
    def __init__(self, low: _Optional[float] = ..., high: _Optional[float] = ...) -> None: ...

class Normal(_message.Message):
    __slots__ = ("mean", "stddev")
    MEAN_FIELD_NUMBER: _ClassVar[int]
    STDDEV_FIELD_NUMBER: _ClassVar[int]
    mean: float
    stddev: float
    def __init__(self, mean: _Optional[float] = ..., stddev: _Optional[float] = ...) -> None: ...

class CreateTableRequest(_message.Message):
    __slots__ = ("spec",)
    SPEC_FIELD_NUMBER: _ClassVar[int]
    spec: TableSpec
    def __init__(self, spec: _Optional[_Union[TableSpec, _Mapping]] = ...) -> None: ...

class CreateTableResponse(_message.Message):
    __slots__ = ("spec", "created")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    spec: TableSpec
    created: bool
    def __init__(self, spec: _Optional[_Union[TableSpec, _Mapping]] = ..., created: _Optional[bool] = ...) -> None: ...

class DescribeTableRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DescribeTableResponse(_message.Message):
    __slots__ = ("spec", "stats")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    spec: TableSpec
    stats: TableStats
    def __init__(self, spec: _Optional[_Union[TableSpec, _Mapping]] = ..., stats: _Optional[_Union[TableStats, _Mapping]] = ...) -> None: ...

class ListTablesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListTablesResponse(_message.Message):
    __slots__ = ("tables",)
    TABLES_FIELD_NUMBER: _ClassVar[int]
    tables: _containers.RepeatedCompositeFieldContainer[TableSpec]
    def __init__(self, tables: _Optional[_Iterable[_Union[TableSpec, _Mapping]]] = ...) -> None: ...

class DropTableRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DropTableResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Payload(_message.Message):
    __slots__ = ("encoding", "num_values", "data", "block_size", "levels", "num_entries", "compression", "raw_len")
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    NUM_VALUES_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    LEVELS_FIELD_NUMBER: _ClassVar[int]
    NUM_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    COMPRESSION_FIELD_NUMBER: _ClassVar[int]
    RAW_LEN_FIELD_NUMBER: _ClassVar[int]
    encoding: Encoding
    num_values: int
    data: bytes
    block_size: int
    levels: int
    num_entries: int
    compression: Compression
    raw_len: int
    def __init__(self, encoding: _Optional[_Union[Encoding, str]] = ..., num_values: _Optional[int] = ..., data: _Optional[bytes] = ..., block_size: _Optional[int] = ..., levels: _Optional[int] = ..., num_entries: _Optional[int] = ..., compression: _Optional[_Union[Compression, str]] = ..., raw_len: _Optional[int] = ...) -> None: ...

class PushId(_message.Message):
    __slots__ = ("client_id", "seq", "min_unacked_seq")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    MIN_UNACKED_SEQ_FIELD_NUMBER: _ClassVar[int]
    client_id: int
    seq: int
    min_unacked_seq: int
    def __init__(self, client_id: _Optional[int] = ..., seq: _Optional[int] = ..., min_unacked_seq: _Optional[int] = ...) -> None: ...

class DenseSlice(_message.Message):
    __slots__ = ("chunk", "values")
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    chunk: int
    values: Payload
    def __init__(self, chunk: _Optional[int] = ..., values: _Optional[_Union[Payload, _Mapping]] = ...) -> None: ...

class PushDenseRequest(_message.Message):
    __slots__ = ("table", "push_id", "map_epoch", "slices", "trace_context", "authorization")
    class TraceContextEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TABLE_FIELD_NUMBER: _ClassVar[int]
    PUSH_ID_FIELD_NUMBER: _ClassVar[int]
    MAP_EPOCH_FIELD_NUMBER: _ClassVar[int]
    SLICES_FIELD_NUMBER: _ClassVar[int]
    TRACE_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    AUTHORIZATION_FIELD_NUMBER: _ClassVar[int]
    table: str
    push_id: PushId
    map_epoch: int
    slices: _containers.RepeatedCompositeFieldContainer[DenseSlice]
    trace_context: _containers.ScalarMap[str, str]
    authorization: str
    def __init__(self, table: _Optional[str] = ..., push_id: _Optional[_Union[PushId, _Mapping]] = ..., map_epoch: _Optional[int] = ..., slices: _Optional[_Iterable[_Union[DenseSlice, _Mapping]]] = ..., trace_context: _Optional[_Mapping[str, str]] = ..., authorization: _Optional[str] = ...) -> None: ...

class PullDenseRequest(_message.Message):
    __slots__ = ("table", "chunks", "accept", "map_epoch", "delta", "trace_context", "authorization")
    class TraceContextEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TABLE_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    ACCEPT_FIELD_NUMBER: _ClassVar[int]
    MAP_EPOCH_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    TRACE_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    AUTHORIZATION_FIELD_NUMBER: _ClassVar[int]
    table: str
    chunks: _containers.RepeatedScalarFieldContainer[int]
    accept: Encoding
    map_epoch: int
    delta: DeltaPull
    trace_context: _containers.ScalarMap[str, str]
    authorization: str
    def __init__(self, table: _Optional[str] = ..., chunks: _Optional[_Iterable[int]] = ..., accept: _Optional[_Union[Encoding, str]] = ..., map_epoch: _Optional[int] = ..., delta: _Optional[_Union[DeltaPull, _Mapping]] = ..., trace_context: _Optional[_Mapping[str, str]] = ..., authorization: _Optional[str] = ...) -> None: ...

class DeltaPull(_message.Message):
    __slots__ = ("client_id", "ratio", "versions")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    RATIO_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    client_id: int
    ratio: float
    versions: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, client_id: _Optional[int] = ..., ratio: _Optional[float] = ..., versions: _Optional[_Iterable[int]] = ...) -> None: ...

class PullDenseResponse(_message.Message):
    __slots__ = ("slices", "is_delta", "versions")
    SLICES_FIELD_NUMBER: _ClassVar[int]
    IS_DELTA_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    slices: _containers.RepeatedCompositeFieldContainer[DenseSlice]
    is_delta: _containers.RepeatedScalarFieldContainer[bool]
    versions: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, slices: _Optional[_Iterable[_Union[DenseSlice, _Mapping]]] = ..., is_delta: _Optional[_Iterable[bool]] = ..., versions: _Optional[_Iterable[int]] = ...) -> None: ...

class PushSparseRequest(_message.Message):
    __slots__ = ("table", "push_id", "map_epoch", "ids", "values", "clock", "trace_context", "authorization", "fixed_ids")
    class TraceContextEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TABLE_FIELD_NUMBER: _ClassVar[int]
    PUSH_ID_FIELD_NUMBER: _ClassVar[int]
    MAP_EPOCH_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    CLOCK_FIELD_NUMBER: _ClassVar[int]
    TRACE_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    AUTHORIZATION_FIELD_NUMBER: _ClassVar[int]
    FIXED_IDS_FIELD_NUMBER: _ClassVar[int]
    table: str
    push_id: PushId
    map_epoch: int
    ids: _containers.RepeatedScalarFieldContainer[int]
    values: Payload
    clock: int
    trace_context: _containers.ScalarMap[str, str]
    authorization: str
    fixed_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, table: _Optional[str] = ..., push_id: _Optional[_Union[PushId, _Mapping]] = ..., map_epoch: _Optional[int] = ..., ids: _Optional[_Iterable[int]] = ..., values: _Optional[_Union[Payload, _Mapping]] = ..., clock: _Optional[int] = ..., trace_context: _Optional[_Mapping[str, str]] = ..., authorization: _Optional[str] = ..., fixed_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class PullSparseRequest(_message.Message):
    __slots__ = ("table", "ids", "accept", "map_epoch", "held", "held_digests", "also", "fixed_ids", "trace_context", "authorization")
    class TraceContextEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TABLE_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    ACCEPT_FIELD_NUMBER: _ClassVar[int]
    MAP_EPOCH_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    HELD_DIGESTS_FIELD_NUMBER: _ClassVar[int]
    ALSO_FIELD_NUMBER: _ClassVar[int]
    FIXED_IDS_FIELD_NUMBER: _ClassVar[int]
    TRACE_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    AUTHORIZATION_FIELD_NUMBER: _ClassVar[int]
    table: str
    ids: _containers.RepeatedScalarFieldContainer[int]
    accept: Encoding
    map_epoch: int
    held: bytes
    held_digests: _containers.RepeatedScalarFieldContainer[int]
    also: _containers.RepeatedCompositeFieldContainer[PullSparseAlso]
    fixed_ids: _containers.RepeatedScalarFieldContainer[int]
    trace_context: _containers.ScalarMap[str, str]
    authorization: str
    def __init__(self, table: _Optional[str] = ..., ids: _Optional[_Iterable[int]] = ..., accept: _Optional[_Union[Encoding, str]] = ..., map_epoch: _Optional[int] = ..., held: _Optional[bytes] = ..., held_digests: _Optional[_Iterable[int]] = ..., also: _Optional[_Iterable[_Union[PullSparseAlso, _Mapping]]] = ..., fixed_ids: _Optional[_Iterable[int]] = ..., trace_context: _Optional[_Mapping[str, str]] = ..., authorization: _Optional[str] = ...) -> None: ...

class PullSparseAlso(_message.Message):
    __slots__ = ("table", "accept", "held", "held_digests")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    ACCEPT_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    HELD_DIGESTS_FIELD_NUMBER: _ClassVar[int]
    table: str
    accept: Encoding
    held: bytes
    held_digests: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, table: _Optional[str] = ..., accept: _Optional[_Union[Encoding, str]] = ..., held: _Optional[bytes] = ..., held_digests: _Optional[_Iterable[int]] = ...) -> None: ...

class PullSparseResponse(_message.Message):
    __slots__ = ("values", "unchanged", "also")
    VALUES_FIELD_NUMBER: _ClassVar[int]
    UNCHANGED_FIELD_NUMBER: _ClassVar[int]
    ALSO_FIELD_NUMBER: _ClassVar[int]
    values: Payload
    unchanged: bytes
    also: _containers.RepeatedCompositeFieldContainer[PullSparseAnswer]
    def __init__(self, values: _Optional[_Union[Payload, _Mapping]] = ..., unchanged: _Optional[bytes] = ..., also: _Optional[_Iterable[_Union[PullSparseAnswer, _Mapping]]] = ...) -> None: ...

class PullSparseAnswer(_message.Message):
    __slots__ = ("values", "unchanged")
    VALUES_FIELD_NUMBER: _ClassVar[int]
    UNCHANGED_FIELD_NUMBER: _ClassVar[int]
    values: Payload
    unchanged: bytes
    def __init__(self, values: _Optional[_Union[Payload, _Mapping]] = ..., unchanged: _Optional[bytes] = ...) -> None: ...

class PushResponse(_message.Message):
    __slots__ = ("duplicate", "applied_values", "skipped_non_finite")
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    APPLIED_VALUES_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_NON_FINITE_FIELD_NUMBER: _ClassVar[int]
    duplicate: bool
    applied_values: int
    skipped_non_finite: int
    def __init__(self, duplicate: _Optional[bool] = ..., applied_values: _Optional[int] = ..., skipped_non_finite: _Optional[int] = ...) -> None: ...

class PushPullDenseResponse(_message.Message):
    __slots__ = ("push", "pull")
    PUSH_FIELD_NUMBER: _ClassVar[int]
    PULL_FIELD_NUMBER: _ClassVar[int]
    push: PushResponse
    pull: PullDenseResponse
    def __init__(self, push: _Optional[_Union[PushResponse, _Mapping]] = ..., pull: _Optional[_Union[PullDenseResponse, _Mapping]] = ...) -> None: ...

class ShardInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ShardInfoResponse(_message.Message):
    __slots__ = ("shard_index", "num_shards", "virtual_nodes", "map_epoch", "server_version", "max_request_bytes", "durable", "bulk_port", "cache_budget_bytes")
    SHARD_INDEX_FIELD_NUMBER: _ClassVar[int]
    NUM_SHARDS_FIELD_NUMBER: _ClassVar[int]
    VIRTUAL_NODES_FIELD_NUMBER: _ClassVar[int]
    MAP_EPOCH_FIELD_NUMBER: _ClassVar[int]
    SERVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    MAX_REQUEST_BYTES_FIELD_NUMBER: _ClassVar[int]
    DURABLE_FIELD_NUMBER: _ClassVar[int]
    BULK_PORT_FIELD_NUMBER: _ClassVar[int]
    CACHE_BUDGET_BYTES_FIELD_NUMBER: _ClassVar[int]
    shard_index: int
    num_shards: int
    virtual_nodes: int
    map_epoch: int
    server_version: str
    max_request_bytes: int
    durable: bool
    bulk_port: int
    cache_budget_bytes: int
    def __init__(self, shard_index: _Optional[int] = ..., num_shards: _Optional[int] = ..., virtual_nodes: _Optional[int] = ..., map_epoch: _Optional[int] = ..., server_version: _Optional[str] = ..., max_request_bytes: _Optional[int] = ..., durable: _Optional[bool] = ..., bulk_port: _Optional[int] = ..., cache_budget_bytes: _Optional[int] = ...) -> None: ...

class CheckpointRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class CheckpointResponse(_message.Message):
    __slots__ = ("name", "path", "files", "bytes", "sequence")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    name: str
    path: str
    files: int
    bytes: int
    sequence: int
    def __init__(self, name: _Optional[str] = ..., path: _Optional[str] = ..., files: _Optional[int] = ..., bytes: _Optional[int] = ..., sequence: _Optional[int] = ...) -> None: ...

class RestoreCheckpointRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class RestoreCheckpointResponse(_message.Message):
    __slots__ = ("files", "bytes", "sequence")
    FILES_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    files: int
    bytes: int
    sequence: int
    def __init__(self, files: _Optional[int] = ..., bytes: _Optional[int] = ..., sequence: _Optional[int] = ...) -> None: ...

class DeleteCheckpointRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DeleteCheckpointResponse(_message.Message):
    __slots__ = ("deleted", "freed_bytes")
    DELETED_FIELD_NUMBER: _ClassVar[int]
    FREED_BYTES_FIELD_NUMBER: _ClassVar[int]
    deleted: bool
    freed_bytes: int
    def __init__(self, deleted: _Optional[bool] = ..., freed_bytes: _Optional[int] = ...) -> None: ...

class ExportCheckpointRequest(_message.Message):
    __slots__ = ("checkpoint", "since", "tables")
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    TABLES_FIELD_NUMBER: _ClassVar[int]
    checkpoint: str
    since: str
    tables: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, checkpoint: _Optional[str] = ..., since: _Optional[str] = ..., tables: _Optional[_Iterable[str]] = ...) -> None: ...

class ExportPart(_message.Message):
    __slots__ = ("table", "dense", "rows", "deleted")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    DENSE_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    DELETED_FIELD_NUMBER: _ClassVar[int]
    table: TableSpec
    dense: ExportDense
    rows: ExportRows
    deleted: ExportDeleted
    def __init__(self, table: _Optional[_Union[TableSpec, _Mapping]] = ..., dense: _Optional[_Union[ExportDense, _Mapping]] = ..., rows: _Optional[_Union[ExportRows, _Mapping]] = ..., deleted: _Optional[_Union[ExportDeleted, _Mapping]] = ...) -> None: ...

class ExportDense(_message.Message):
    __slots__ = ("offset", "values")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    offset: int
    values: bytes
    def __init__(self, offset: _Optional[int] = ..., values: _Optional[bytes] = ...) -> None: ...

class ExportRows(_message.Message):
    __slots__ = ("keys", "values")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[int]
    values: bytes
    def __init__(self, keys: _Optional[_Iterable[int]] = ..., values: _Optional[bytes] = ...) -> None: ...

class ExportDeleted(_message.Message):
    __slots__ = ("keys",)
    KEYS_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, keys: _Optional[_Iterable[int]] = ...) -> None: ...

class GetStatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TableStats(_message.Message):
    __slots__ = ("name", "rows", "pushes", "pulls", "values_pushed", "values_pulled", "load_error", "memory_bytes", "cpu_seconds", "bytes_received", "bytes_sent", "cached_rows", "rows_admitted", "rows_held_back", "rows_expired", "rows_capped")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    PUSHES_FIELD_NUMBER: _ClassVar[int]
    PULLS_FIELD_NUMBER: _ClassVar[int]
    VALUES_PUSHED_FIELD_NUMBER: _ClassVar[int]
    VALUES_PULLED_FIELD_NUMBER: _ClassVar[int]
    LOAD_ERROR_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    CPU_SECONDS_FIELD_NUMBER: _ClassVar[int]
    BYTES_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    BYTES_SENT_FIELD_NUMBER: _ClassVar[int]
    CACHED_ROWS_FIELD_NUMBER: _ClassVar[int]
    ROWS_ADMITTED_FIELD_NUMBER: _ClassVar[int]
    ROWS_HELD_BACK_FIELD_NUMBER: _ClassVar[int]
    ROWS_EXPIRED_FIELD_NUMBER: _ClassVar[int]
    ROWS_CAPPED_FIELD_NUMBER: _ClassVar[int]
    name: str
    rows: int
    pushes: int
    pulls: int
    values_pushed: int
    values_pulled: int
    load_error: str
    memory_bytes: int
    cpu_seconds: float
    bytes_received: int
    bytes_sent: int
    cached_rows: int
    rows_admitted: int
    rows_held_back: int
    rows_expired: int
    rows_capped: int
    def __init__(self, name: _Optional[str] = ..., rows: _Optional[int] = ..., pushes: _Optional[int] = ..., pulls: _Optional[int] = ..., values_pushed: _Optional[int] = ..., values_pulled: _Optional[int] = ..., load_error: _Optional[str] = ..., memory_bytes: _Optional[int] = ..., cpu_seconds: _Optional[float] = ..., bytes_received: _Optional[int] = ..., bytes_sent: _Optional[int] = ..., cached_rows: _Optional[int] = ..., rows_admitted: _Optional[int] = ..., rows_held_back: _Optional[int] = ..., rows_expired: _Optional[int] = ..., rows_capped: _Optional[int] = ...) -> None: ...

class GetStatsResponse(_message.Message):
    __slots__ = ("shard_index", "num_shards", "uptime_ms", "pushes_applied", "pushes_duplicate", "write_batches", "bytes_written", "live_data_bytes", "tables", "bulk_calls", "memory_bytes", "memory_budget_bytes", "cache_bytes", "cache_budget_bytes", "cache_hits", "cache_misses", "cache_evictions")
    SHARD_INDEX_FIELD_NUMBER: _ClassVar[int]
    NUM_SHARDS_FIELD_NUMBER: _ClassVar[int]
    UPTIME_MS_FIELD_NUMBER: _ClassVar[int]
    PUSHES_APPLIED_FIELD_NUMBER: _ClassVar[int]
    PUSHES_DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    WRITE_BATCHES_FIELD_NUMBER: _ClassVar[int]
    BYTES_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    LIVE_DATA_BYTES_FIELD_NUMBER: _ClassVar[int]
    TABLES_FIELD_NUMBER: _ClassVar[int]
    BULK_CALLS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BUDGET_BYTES_FIELD_NUMBER: _ClassVar[int]
    CACHE_BYTES_FIELD_NUMBER: _ClassVar[int]
    CACHE_BUDGET_BYTES_FIELD_NUMBER: _ClassVar[int]
    CACHE_HITS_FIELD_NUMBER: _ClassVar[int]
    CACHE_MISSES_FIELD_NUMBER: _ClassVar[int]
    CACHE_EVICTIONS_FIELD_NUMBER: _ClassVar[int]
    shard_index: int
    num_shards: int
    uptime_ms: int
    pushes_applied: int
    pushes_duplicate: int
    write_batches: int
    bytes_written: int
    live_data_bytes: int
    tables: _containers.RepeatedCompositeFieldContainer[TableStats]
    bulk_calls: int
    memory_bytes: int
    memory_budget_bytes: int
    cache_bytes: int
    cache_budget_bytes: int
    cache_hits: int
    cache_misses: int
    cache_evictions: int
    def __init__(self, shard_index: _Optional[int] = ..., num_shards: _Optional[int] = ..., uptime_ms: _Optional[int] = ..., pushes_applied: _Optional[int] = ..., pushes_duplicate: _Optional[int] = ..., write_batches: _Optional[int] = ..., bytes_written: _Optional[int] = ..., live_data_bytes: _Optional[int] = ..., tables: _Optional[_Iterable[_Union[TableStats, _Mapping]]] = ..., bulk_calls: _Optional[int] = ..., memory_bytes: _Optional[int] = ..., memory_budget_bytes: _Optional[int] = ..., cache_bytes: _Optional[int] = ..., cache_budget_bytes: _Optional[int] = ..., cache_hits: _Optional[int] = ..., cache_misses: _Optional[int] = ..., cache_evictions: _Optional[int] = ...) -> None: ...
