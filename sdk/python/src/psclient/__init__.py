"""psclient: the Python client of the parameter-server cluster.

>>> import numpy as np, psclient
>>> ps = psclient.Client(["http://127.0.0.1:7070"])                     # doctest: +SKIP
>>> ps.create_table(psclient.dense_table("w", [784, 10], optimizer=psclient.sgd(0.1)))  # doctest: +SKIP
>>> ps.push_dense("w", np.full(7840, 0.01, dtype=np.float32))           # doctest: +SKIP
>>> ps.pull_dense("w").shape                                            # doctest: +SKIP
(7840,)
"""
from .client import Client, PushSummary, ShardInfo, Tls
from .codec import Codec
from .errors import (
    AlreadyExists,
    AuthError,
    FailedPrecondition,
    InvalidArgument,
    InvalidInput,
    NotFound,
    ProtocolError,
    PsError,
    ResourceLimit,
    ServiceError,
    StaleMap,
    TableNotFound,
    TopologyError,
    Unavailable,
)
from .partition import Partitioner, table_hash
from .session import Session
from .tables import adagrad, adam, dense_table, ftrl, momentum, normal, sgd, sparse_table, uniform, zeros

__version__ = "0.1.0"

__all__ = [
    "Client", "Session", "PushSummary", "ShardInfo", "Tls", "Codec", "Partitioner", "table_hash",
    "dense_table", "sparse_table", "sgd", "momentum", "adagrad", "adam", "ftrl", "zeros",
    "uniform", "normal", "PsError", "InvalidInput", "ProtocolError", "TopologyError",
    "ServiceError", "InvalidArgument", "TableNotFound", "AlreadyExists", "StaleMap",
    "Unavailable", "ResourceLimit", "AuthError", "NotFound", "FailedPrecondition",
]
