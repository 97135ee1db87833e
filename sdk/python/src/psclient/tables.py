"""Table specs, optimizers and initializers, as the protocol's messages (``ps.v1.TableSpec``),
with keyword arguments and the server's defaults spelt out."""
from __future__ import annotations

from typing import Optional, Sequence

from ._proto.ps.v1 import ps_pb2 as pb

TableSpec = pb.TableSpec
Optimizer = pb.Optimizer
Initializer = pb.Initializer


def sgd(learning_rate: float) -> pb.Optimizer:
    """w -= lr * g"""
    return pb.Optimizer(sgd=pb.Sgd(learning_rate=learning_rate))


def momentum(learning_rate: float, momentum: float = 0.9, nesterov: bool = False) -> pb.Optimizer:
    """v = mu * v + g; w -= lr * v"""
    return pb.Optimizer(momentum=pb.Momentum(learning_rate=learning_rate, momentum=momentum, nesterov=nesterov))


def adagrad(learning_rate: float, initial_accumulator: float = 0.1, epsilon: float = 1e-8) -> pb.Optimizer:
    """a += g^2; w -= lr * g / (sqrt(a) + epsilon)"""
    return pb.Optimizer(
        adagrad=pb.Adagrad(learning_rate=learning_rate, initial_accumulator=initial_accumulator, epsilon=epsilon)
    )


def adam(learning_rate: float, beta1: float = 0.9, beta2: float = 0.999, epsilon: float = 1e-8) -> pb.Optimizer:
    """Adam with bias correction."""
    return pb.Optimizer(adam=pb.Adam(learning_rate=learning_rate, beta1=beta1, beta2=beta2, epsilon=epsilon))


def ftrl(alpha: float, beta: float = 1.0, l1: float = 0.0, l2: float = 0.0) -> pb.Optimizer:
    """FTRL-proximal (sparse tables only)."""
    return pb.Optimizer(ftrl=pb.Ftrl(alpha=alpha, beta=beta, l1=l1, l2=l2))


def zeros(seed: int = 0) -> pb.Initializer:
    return pb.Initializer(zeros=pb.Zeros(), seed=seed)


def uniform(low: float, high: float, seed: int = 0) -> pb.Initializer:
    return pb.Initializer(uniform=pb.Uniform(low=low, high=high), seed=seed)


def normal(mean: float, stddev: float, seed: int = 0) -> pb.Initializer:
    return pb.Initializer(normal=pb.Normal(mean=mean, stddev=stddev), seed=seed)


def dense_table(
    name: str,
    shape: Sequence[int],
    *,
    optimizer: Optional[pb.Optimizer] = None,
    initializer: Optional[pb.Initializer] = None,
    chunk_elems: int = 0,
    skip_non_finite: bool = False,
) -> pb.TableSpec:
    """A dense f32 tensor of ``shape``, stored in chunks of ``chunk_elems`` values (0: the
    server's default, 262,144). Without an optimizer, plain SGD at 0.01."""
    return pb.TableSpec(
        name=name,
        dense=pb.DenseSpec(shape=list(shape), chunk_elems=chunk_elems),
        optimizer=optimizer or sgd(0.01),
        initializer=initializer or zeros(),
        non_finite=pb.NON_FINITE_POLICY_SKIP if skip_non_finite else pb.NON_FINITE_POLICY_REJECT,
    )


def sparse_table(
    name: str,
    dim: int,
    *,
    optimizer: Optional[pb.Optimizer] = None,
    initializer: Optional[pb.Initializer] = None,
    admit_after: int = 0,
    ttl_seconds: int = 0,
    ttl_clocks: int = 0,
    max_rows: int = 0,
    skip_non_finite: bool = False,
    placed_with: str = "",
) -> pb.TableSpec:
    """Rows of ``dim`` f32 values keyed by u64 ids, created on first push by the initializer.
    ``placed_with`` places the ids as that table's are (``SparseSpec.placed_with``)."""
    return pb.TableSpec(
        name=name,
        sparse=pb.SparseSpec(
            dim=dim,
            admit_after=admit_after,
            ttl_seconds=ttl_seconds,
            ttl_clocks=ttl_clocks,
            max_rows=max_rows,
            placed_with=placed_with,
        ),
        optimizer=optimizer or sgd(0.01),
        initializer=initializer or zeros(),
        non_finite=pb.NON_FINITE_POLICY_SKIP if skip_non_finite else pb.NON_FINITE_POLICY_REJECT,
    )
