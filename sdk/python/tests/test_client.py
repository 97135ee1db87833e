"""The client against real shards: values, routing, the bulk stream, codecs, exactly-once
pushes across a shard's crash, typed errors, the scheduler's map, TLS and tokens."""
from __future__ import annotations

import pathlib
import signal
import subprocess
import threading

import grpc
import numpy as np
import pytest

import psclient
from psclient import codec as cd
from psclient.client import _wire_ids
from psclient.partition import table_hash

from conftest import REPO, LocalCluster, Service, binary

LR = np.float32(0.5)


def grads(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32)


def test_dense_push_pull_exact_over_both_transports(cluster: LocalCluster) -> None:
    with psclient.Client(cluster.endpoints) as ps, psclient.Client(cluster.endpoints, bulk=False) as grpc_only:
        assert [s.shard_index for s in ps.shards] == [0, 1]
        assert all(s.bulk_port for s in ps.shards)
        # 10 chunks of 1,000 (the last one short) spread over both shards.
        spec = psclient.dense_table("w", [97, 100], optimizer=psclient.sgd(float(LR)), chunk_elems=1000)
        stored = ps.create_table(spec)
        assert stored.dense.chunk_elems == 1000
        assert ps.create_table(spec).name == "w"  # idempotent
        g1, g2 = grads(9700, 1), grads(9700, 2)
        s = ps.push_dense("w", g1.reshape(97, 100))
        assert s.applied_values == 9700 and s.duplicates == 0
        grpc_only.push_dense("w", g2)
        want = (np.float32(0) - LR * g1) - LR * g2
        assert ps.pull_dense("w").tobytes() == want.tobytes()
        assert grpc_only.pull_dense("w").tobytes() == want.tobytes()
        buf = np.full(9700, 7, dtype=np.float32)
        ps.pull_dense_into("w", buf)
        assert buf.tobytes() == want.tobytes()
        with pytest.raises(psclient.InvalidInput):
            ps.pull_dense_into("w", np.zeros(9699, dtype=np.float32))
        with pytest.raises(psclient.InvalidInput):
            ps.pull_dense_into("w", np.zeros(9700, dtype=np.float64))
        bulk_calls = sum(st.bulk_calls for st in ps.stats())
        assert bulk_calls >= 4, "the plain-f32 calls went over the bulk stream"


def test_push_pull_dense_pulls_each_request_in_its_push(cluster: LocalCluster) -> None:
    # Requests of at most 8 chunks of 1,000 values: the 50 chunks (the last one short) make
    # several requests per shard, counted from the partitioner below.
    with psclient.Client(cluster.endpoints, max_request_bytes=32_000) as ps, psclient.Client(
        cluster.endpoints, bulk=False
    ) as grpc_only:
        n = 49_500
        ps.create_table(psclient.dense_table("pp", [n], optimizer=psclient.sgd(1.0), chunk_elems=1000))
        g1, g2, g3 = grads(n, 3), grads(n, 4), grads(n, 5)
        ps.push_dense("pp", g1)
        owners = [ps.partitioner.shard_for_chunk(table_hash("pp"), c) for c in range(50)]
        requests = sum(-(-owners.count(s) // 8) for s in (0, 1))
        calls = sum(st.bulk_calls for st in ps.stats())
        out = np.full(n, 9, dtype=np.float32)
        summary = ps.push_pull_dense("pp", g2, out)
        assert summary.applied_values == n and summary.duplicates == 0 and summary.requests == requests
        # SGD with lr 1 from zeros, bit for bit.
        want = (np.float32(0) - g1) - g2
        assert out.tobytes() == want.tobytes()
        # One bulk exchange per request (a push then a pull would make twice as many); the
        # stats calls themselves go by gRPC.
        assert sum(st.bulk_calls for st in ps.stats()) - calls == requests
        # Over gRPC alone: a push, then a pull.
        grpc_only.push_pull_dense("pp", g3, out)
        want = want - g3
        assert out.tobytes() == want.tobytes()
        # Refused before anything is sent: a buffer of another length or type, a gradient of
        # another length. Nothing pushed, the buffer untouched.
        short = np.full(n - 1, 7, dtype=np.float32)
        with pytest.raises(psclient.InvalidInput):
            ps.push_pull_dense("pp", g2, short)
        with pytest.raises(psclient.InvalidInput):
            ps.push_pull_dense("pp", g2, np.zeros(n, dtype=np.float64))
        with pytest.raises(psclient.InvalidInput):
            ps.push_pull_dense("pp", g2[1:], out)
        assert np.all(short == 7) and out.tobytes() == want.tobytes()
        assert ps.pull_dense("pp").tobytes() == want.tobytes()
        # Another pull codec: the push, then a pull under it.
        ps.set_table_codec("pp", pull_codec="fp16")
        calls = sum(st.bulk_calls for st in ps.stats())
        ps.push_pull_dense("pp", g1, out)
        want = want - g1
        assert np.array_equal(out, want.astype(np.float16).astype(np.float32))
        assert sum(st.bulk_calls for st in ps.stats()) - calls == requests  # the pushes alone

        # Two clients stepping at once, pushing 1 and 2 everywhere (exact in f32): after a
        # client's k-th step every value it pulled holds its own k pushes.
        ps.create_table(psclient.dense_table("pp2", [n], optimizer=psclient.sgd(1.0), chunk_elems=1000))
        failures: list = []

        def stepper(v: float) -> None:
            try:
                with psclient.Client(cluster.endpoints, max_request_bytes=32_000) as c:
                    grad, mine = np.full(n, v, dtype=np.float32), np.zeros(n, dtype=np.float32)
                    for k in range(1, 16):
                        c.push_pull_dense("pp2", grad, mine)
                        assert mine.max() <= -k * v, f"step {k} of client {v}: a value lacks its own push"
            except BaseException as e:  # noqa: BLE001 (reported below)
                failures.append(e)

        threads = [threading.Thread(target=stepper, args=(v,)) for v in (1.0, 2.0)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not failures, failures
        assert np.all(ps.pull_dense("pp2") == -45.0)


def test_sparse_rows_sum_duplicates_and_read_the_initializer(cluster: LocalCluster) -> None:
    with psclient.Client(cluster.endpoints) as ps:
        ps.create_table(psclient.sparse_table("emb", 8, optimizer=psclient.sgd(float(LR)), initializer=psclient.uniform(-0.1, 0.1, seed=7)))
        ids = np.array([5, 1 << 40, 5, 77, 2**64 - 1], dtype=np.uint64)
        before = ps.pull_sparse("emb", ids)
        assert before.shape == (5, 8)
        assert np.array_equal(before[0], before[2]) and np.all(np.abs(before) <= 0.1)
        g = grads(40, 3).reshape(5, 8)
        ps.push_sparse("emb", ids, g)
        after = ps.pull_sparse("emb", ids)
        want5 = before[0] - LR * g[0] - LR * g[2]
        assert np.allclose(after[0], want5, atol=1e-6) and np.array_equal(after[0], after[2])
        assert np.array_equal(after[3], before[3] - LR * g[3])
        # Thousands of ids: both shards, several requests each.
        many = np.arange(20_000, dtype=np.uint64) * np.uint64(2654435761)
        ps.push_sparse("emb", many, np.ones((20_000, 8), dtype=np.float32))
        rows = ps.pull_sparse("emb", many[:100])
        assert rows.shape == (100, 8)
        stats = {st.shard_index: {t.name: t for t in st.tables} for st in ps.stats()}
        assert all(stats[i]["emb"].rows > 5000 for i in (0, 1))
        # A table placed with `emb` keeps each id on `emb`'s shard: this client routes its
        # pushes there (a shard that does not own an id refuses it), and each shard holds the
        # same number of rows of both.
        ps.create_table(psclient.sparse_table("near", 1, optimizer=psclient.sgd(1.0), placed_with="emb"))
        both = np.concatenate([many, ids])
        ps.push_sparse("near", both, np.ones((len(both), 1), dtype=np.float32))
        assert np.array_equal(ps.pull_sparse("near", many[:100]), -np.ones((100, 1), dtype=np.float32))
        stats = {st.shard_index: {t.name: t for t in st.tables} for st in ps.stats()}
        assert all(stats[i]["near"].rows == stats[i]["emb"].rows for i in (0, 1))
        # Hashed ids (64-bit, most of them 2^56 or more) go as 8-byte words (`fixed_ids`),
        # small ones as varints; the shards read both alike.
        hashed = np.arange(1, 501, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        assert _wire_ids(hashed) == ([], hashed.tolist()) and _wire_ids(many) == (many.tolist(), [])
        first = ps.pull_sparse("emb", hashed)
        ps.push_sparse("emb", hashed, np.ones((500, 8), dtype=np.float32))
        assert np.allclose(ps.pull_sparse("emb", hashed), first - LR, atol=1e-6)


def test_bad_input_is_refused_and_changes_nothing(cluster: LocalCluster) -> None:
    with psclient.Client(cluster.endpoints, max_attempts=2) as ps:
        ps.create_table(psclient.dense_table("d", [3000], optimizer=psclient.sgd(1.0), chunk_elems=1000))
        ps.create_table(psclient.sparse_table("s", 4))
        with pytest.raises(psclient.InvalidInput):
            ps.push_dense("d", np.ones(2999, dtype=np.float32))
        with pytest.raises(psclient.InvalidInput):
            ps.push_sparse("s", [1, 2], np.ones(7, dtype=np.float32))
        with pytest.raises(psclient.InvalidInput):
            ps.push_sparse("s", [-1], np.ones(4, dtype=np.float32))
        with pytest.raises(psclient.InvalidInput):
            ps.pull_dense("s")
        with pytest.raises(psclient.TableNotFound) as nf:
            ps.pull_dense("nope")
        assert nf.value.reason == "TABLE_NOT_FOUND" and nf.value.code == grpc.StatusCode.NOT_FOUND
        with pytest.raises(psclient.AlreadyExists):
            ps.create_table(psclient.dense_table("d", [3001]))
        nan = np.ones(3000, dtype=np.float32)
        nan[2500] = np.nan
        with pytest.raises(psclient.InvalidArgument) as e:
            ps.push_dense("d", nan)
        assert e.value.reason == "NON_FINITE"
        # The chunk holding the NaN was refused; the other chunks' requests went to the
        # shards that own them and were applied (each request stands alone).
        w = ps.pull_dense("d")
        assert np.all(w[2000:] == 0)
        with pytest.raises(ValueError):
            psclient.Client(cluster.endpoints, codec="zip")
        with pytest.raises(psclient.TopologyError):
            psclient.Client(list(reversed(cluster.endpoints)))


def test_lossy_codecs_keep_what_they_drop(cluster: LocalCluster) -> None:
    n = 50_000
    with psclient.Client(cluster.endpoints, codec="topk:0.01") as ps:
        ps.create_table(psclient.dense_table("t", [n], optimizer=psclient.sgd(1.0), chunk_elems=10_000))
        g = grads(n, 4)
        s = ps.push_dense("t", g)
        assert s.applied_values <= n and s.wire_bytes < 4 * n * 0.02
        # Pushing zeros sends what the residual still owes: after enough pushes all of it.
        for _ in range(120):
            ps.push_dense("t", np.zeros(n, dtype=np.float32))
        w = ps.pull_dense("t")
        assert np.allclose(-w, g, atol=2e-3), np.max(np.abs(-w - g))
        for codec in ("fp16", "bf16", "int8"):
            ps.set_table_codec("t", codec=codec)
            before = ps.pull_dense("t")
            s = ps.push_dense("t", g)
            assert s.wire_bytes <= 2 * n + 4096, codec
            assert np.allclose(ps.pull_dense("t"), before - g, atol=0.05), codec


def test_a_top_k_row_push_sends_only_the_rows_it_has_entries_for(cluster: LocalCluster) -> None:
    """Under momentum a row sent with a zero gradient would still move: the rows a top-k push
    has no entry for are left out (their gradient waits in the residual) and do not move."""
    dim = 8
    with psclient.Client(cluster.endpoints) as ps:
        ps.create_table(psclient.sparse_table("m", dim, optimizer=psclient.momentum(1.0, 0.9)))
        ids = np.arange(400, dtype=np.uint64) * np.uint64(7919) + np.uint64(3)
        s = ps.push_sparse("m", ids, np.full((400, dim), 0.01, dtype=np.float32))
        assert s.rows == 400
        before = ps.pull_sparse("m", ids)
        ps.set_table_codec("m", codec="topk:0.05")
        big = np.arange(20) * 19
        g = np.full((400, dim), 1e-4, dtype=np.float32)
        g[big] = 1.0 + np.arange(dim, dtype=np.float32)
        s = ps.push_sparse("m", ids, g)
        after = ps.pull_sparse("m", ids)
        held = ps._state("m").rows
        assert held is not None
        sent = 0
        for r, i in enumerate(ids.tolist()):
            owed = held.rows.get(i, np.zeros(dim, dtype=np.float32))
            if np.array_equal(owed, g[r]):
                assert np.array_equal(after[r], before[r]) and r not in big, r
                continue
            sent += 1
            assert np.allclose(after[r], before[r] - (0.9 * 0.01 + g[r] - owed), atol=1e-5), r
        assert s.rows == sent and 20 <= sent <= 30, (s.rows, sent)
        assert s.applied_values == sent * dim and s.raw_bytes == 400 * dim * 4
        # 1,500 rows of one value: over the codec's 1,024 values, though each shard's part is
        # under it: every part is compressed as the whole push would be, none sent in f32.
        ps.create_table(psclient.sparse_table("w1", 1, optimizer=psclient.sgd(1.0)))
        ps.set_table_codec("w1", codec="topk:0.01")
        wide = np.arange(1500, dtype=np.uint64) * np.uint64(7919) + np.uint64(5)
        s = ps.push_sparse("w1", wide, grads(1500, 11).reshape(1500, 1))
        assert 2 <= s.rows <= 30, s.rows


def test_compressed_pulls(cluster: LocalCluster) -> None:
    with psclient.Client(cluster.endpoints) as ps:
        ps.create_table(psclient.dense_table("p", [5000], optimizer=psclient.sgd(1.0), chunk_elems=1000))
        ps.create_table(psclient.sparse_table("r", 16, initializer=psclient.normal(0, 1, seed=3)))
        g = grads(5000, 5)
        ps.push_dense("p", g)
        exact = ps.pull_dense("p")
        ps.set_table_codec("p", pull_codec="fp16")
        assert np.array_equal(ps.pull_dense("p"), exact.astype(np.float16).astype(np.float32))
        assert np.array_equal(ps.pull_dense("p", exact=True), exact)
        ps.set_table_codec("p", pull_codec="bf16")
        assert np.array_equal(ps.pull_dense("p"), cd.decode(cd.encode(exact, cd.Codec.parse("bf16"), min_values=0, lz4=False)))
        rows = ps.pull_sparse("r", np.arange(100))
        ps.set_table_codec("r", pull_codec="fp16")
        ps.create_table(psclient.sparse_table("r", 16, initializer=psclient.normal(0, 1, seed=3)))  # the same again
        assert np.array_equal(ps.pull_sparse("r", np.arange(100)), rows.astype(np.float16).astype(np.float32))
        with pytest.raises(ValueError):
            ps.set_table_codec("p", pull_codec="delta-topk:0.5:x")
        with pytest.raises(ValueError):
            ps.set_table_codec("p", pull_codec="delta-topk:0")
        # Delta pulls: the first comes whole; after a push, the top 30% of each chunk's change,
        # the rest owed and brought by the next pulls.
        ps.create_table(psclient.dense_table("q", [5000], optimizer=psclient.sgd(1.0), chunk_elems=2500))
        ps.push_dense("q", g)
        ps.set_table_codec("q", pull_codec="delta-topk:0.3")
        q = ps.pull_dense("q", exact=True)
        assert np.array_equal(ps.pull_dense("q"), q)
        ps.push_dense("q", g)
        q = ps.pull_dense("q", exact=True)
        first = ps.pull_dense("q")
        assert not np.allclose(first, q, atol=1e-3)
        for _ in range(6):
            last = ps.pull_dense("q")
        assert np.allclose(last, q, atol=2e-3), np.max(np.abs(last - q))
        # A chunk of at most 2,048 values comes as all of its change in fp16, the rounding owed
        # and brought by the next pull.
        ps.set_table_codec("p", pull_codec="delta-topk:0.3")
        assert np.array_equal(ps.pull_dense("p"), exact)
        ps.push_dense("p", g)
        now = ps.pull_dense("p", exact=True)
        first = ps.pull_dense("p")
        assert np.all(np.abs(first - now) <= np.abs(now - exact) / 1000 + 1e-6), np.max(np.abs(first - now))
        assert np.allclose(ps.pull_dense("p"), now, rtol=0, atol=1e-6)
        # Rows have no delta form: they come in fp16.
        ps.set_table_codec("r", pull_codec="delta-topk:0.3")
        assert np.array_equal(ps.pull_sparse("r", np.arange(100)), rows.astype(np.float16).astype(np.float32))
        # int8: a scale per block of whole rows (32 values: two rows of 16 of one shard's
        # request here), each value within half a step of the shard's; dense tables take a
        # scale per 256 values of a chunk.
        ps.set_table_codec("r", pull_codec="int8")
        got = ps.pull_sparse("r", np.arange(100))
        step = np.abs(rows).max() / 127.0
        assert np.max(np.abs(got - rows)) <= step / 2 * 1.0001
        assert not np.array_equal(got, rows)
        ps.set_table_codec("p", pull_codec="int8")
        got = ps.pull_dense("p")
        step = np.abs(now.reshape(-1, 250)).max() / 127.0
        assert np.max(np.abs(got - now)) <= step / 2 * 1.0001
        assert np.array_equal(ps.pull_dense("p", exact=True), now)
        # int4: the same blocks, half a byte a value, within half a step of max / 7.
        for table, exact_values in (("r", rows), ("p", now)):
            ps.set_table_codec(table, pull_codec="int4")
            got = ps.pull_sparse("r", np.arange(100)) if table == "r" else ps.pull_dense("p")
            step = np.abs(exact_values).max() / 7.0
            assert np.max(np.abs(got - exact_values)) <= step / 2 * 1.0001
            assert not np.array_equal(got, exact_values)


def test_pushes_apply_exactly_once_across_a_shard_crash(tmp_path: pathlib.Path) -> None:
    """A shard killed (SIGKILL) and restarted on its port while a client pushes: the pushes
    in flight are retried under their sequence numbers, and every one is applied once."""
    c = LocalCluster(tmp_path, 2)
    try:
        with psclient.Client(c.endpoints, initial_backoff=0.05, max_attempts=200) as ps:
            ps.create_table(psclient.dense_table("x", [4000], optimizer=psclient.sgd(1.0), chunk_elems=1000))
            ps.create_table(psclient.sparse_table("y", 4, optimizer=psclient.sgd(1.0)))
            pushes = 150
            done = threading.Event()
            errors: list = []

            def pusher() -> None:
                try:
                    for _ in range(pushes):
                        ps.push_dense("x", np.ones(4000, dtype=np.float32))
                        ps.push_sparse("y", np.arange(64), np.ones((64, 4), dtype=np.float32))
                except Exception as e:  # reported below
                    errors.append(e)
                done.set()

            t = threading.Thread(target=pusher)
            t.start()
            victim = c.shards[1]
            while not done.is_set() and sum(s.pushes_applied for s in ps.stats()) < 60:
                pass
            victim.stop(signal.SIGKILL)
            c.shards[1] = c.start_shard(1, 2, listen=victim.grpc)
            t.join(timeout=300)
            assert not errors, errors
            assert np.all(ps.pull_dense("x") == -pushes)
            assert np.all(ps.pull_sparse("y", np.arange(64)) == -pushes)
    finally:
        c.stop()


def test_routes_by_the_schedulers_map(tmp_path: pathlib.Path) -> None:
    c = LocalCluster(tmp_path, 3, scheduler=True)
    try:
        with psclient.Client(scheduler=c.scheduler_url) as ps:
            assert ps.map_epoch > 0
            assert [s.endpoint for s in ps.shards] == c.endpoints
            ps.create_table(psclient.dense_table("m", [10_000], optimizer=psclient.sgd(1.0), chunk_elems=1000))
            ps.push_dense("m", np.ones(10_000, dtype=np.float32))
            assert np.all(ps.pull_dense("m") == -1)
            names = [cp.name for cp in ps.checkpoint("py-1")]
            assert names == ["py-1"] * 3
    finally:
        c.stop()


def test_follows_a_shard_the_scheduler_maps_elsewhere(tmp_path: pathlib.Path) -> None:
    """A shard killed and restarted on another port while a client routed by the scheduler's
    map pushes: the client fetches the new map, reconnects, and every push is applied once."""
    c = LocalCluster(tmp_path, 2, scheduler=True)
    try:
        with psclient.Client(scheduler=c.scheduler_url, max_attempts=400, max_backoff=0.5) as ps:
            epoch = ps.map_epoch
            ps.create_table(psclient.dense_table("f", [4000], optimizer=psclient.sgd(1.0), chunk_elems=1000))
            pushes, errors = 80, []

            def pusher() -> None:
                try:
                    for _ in range(pushes):
                        ps.push_dense("f", np.ones(4000, dtype=np.float32))
                except Exception as e:  # reported below
                    errors.append(e)

            t = threading.Thread(target=pusher)
            t.start()
            while t.is_alive() and sum(s.pushes_applied for s in ps.stats()) < 30:
                pass
            old = c.shards[1].grpc
            c.shards[1].stop(signal.SIGKILL)
            c.shards[1] = c.start_shard(1, 2)
            t.join(timeout=300)
            assert not errors, errors
            assert c.shards[1].grpc != old
            assert ps.map_epoch > epoch and ps.shards[1].endpoint == c.shards[1].url
            assert np.all(ps.pull_dense("f") == -pushes)
    finally:
        c.stop()


def test_tls_and_tokens(tmp_path: pathlib.Path) -> None:
    certs = tmp_path / "certs"
    subprocess.run([str(REPO / "scripts" / "dev-certs.sh"), str(certs)], check=True, capture_output=True)
    tokens = tmp_path / "tokens.toml"
    entries = []
    secrets = {}
    for name, role in (("admin", "operator"), ("trainer", "worker"), ("viewer", "reader")):
        out = subprocess.run(
            [binary("psctl"), "token", "--name", name, "--role", role, "--out", str(tmp_path / f"{name}.token")],
            check=True, capture_output=True, text=True,
        )
        entries.append(out.stdout)
        secrets[name] = (tmp_path / f"{name}.token").read_text().strip()
    tokens.write_text("\n".join(entries))
    shard = Service(
        "shard-0",
        "ps-server",
        ["--in-memory", "--listen", "127.0.0.1:0", "--tls-cert", str(certs / "server.pem"), "--tls-key", str(certs / "server.key"), "--auth-tokens", str(tokens)],
        tmp_path / "logs",
    )
    try:
        ep = [f"https://{shard.grpc}"]
        tls = psclient.Tls(ca=str(certs / "ca.pem"))
        with psclient.Client(ep, tls=tls, token=secrets["admin"]) as admin:
            admin.create_table(psclient.dense_table("z", [300_000], optimizer=psclient.sgd(1.0)))
        with psclient.Client(ep, tls=tls, token=secrets["trainer"]) as trainer:
            trainer.push_dense("z", np.ones(300_000, dtype=np.float32))  # over TLS on the bulk stream
            assert np.all(trainer.pull_dense("z") == -1)
            with pytest.raises(psclient.AuthError):
                trainer.create_table(psclient.dense_table("z2", [3]))
        with psclient.Client(ep, tls=tls, token=secrets["viewer"], max_attempts=1) as viewer:
            assert viewer.pull_dense("z")[0] == -1
            with pytest.raises(psclient.AuthError) as e:
                viewer.push_dense("z", np.ones(300_000, dtype=np.float32))
            assert e.value.code == grpc.StatusCode.PERMISSION_DENIED
        with psclient.Client(ep, tls=tls, token=secrets["admin"]) as admin:
            assert admin.stats()[0].bulk_calls >= 3, "the dense calls went over the bulk stream, in TLS"
        with pytest.raises(psclient.AuthError):
            psclient.Client(ep, tls=tls, token="not-a-token", max_attempts=1)
        with pytest.raises(psclient.PsError):
            psclient.Client([f"http://{shard.grpc}"], max_attempts=1, connect_timeout=2, timeout=5)
    finally:
        shard.stop()


def test_mutual_tls_names_the_client_by_its_certificate(tmp_path: pathlib.Path) -> None:
    certs = tmp_path / "certs"
    subprocess.run([str(REPO / "scripts" / "dev-certs.sh"), str(certs), "--client", "trainer", "--client", "admin"], check=True, capture_output=True)
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(
        '[[token]]\nname = "admin"\nrole = "operator"\njobs = ["*"]\ncert_name = "admin"\n'
        '[[token]]\nname = "trainer"\nrole = "worker"\njobs = ["*"]\ncert_name = "trainer"\n'
    )
    shard = Service(
        "shard-0",
        "ps-server",
        [
            "--in-memory", "--listen", "127.0.0.1:0",
            "--tls-cert", str(certs / "server.pem"), "--tls-key", str(certs / "server.key"),
            "--tls-client-ca", str(certs / "ca.pem"), "--auth-tokens", str(tokens),
        ],
        tmp_path / "logs",
    )
    try:
        ep = [f"https://{shard.grpc}"]
        def as_(name: str) -> psclient.Tls:
            return psclient.Tls(ca=str(certs / "ca.pem"), cert=str(certs / f"{name}.pem"), key=str(certs / f"{name}.key"))

        with psclient.Client(ep, tls=as_("admin")) as admin, psclient.Client(ep, tls=as_("trainer")) as trainer:
            admin.create_table(psclient.dense_table("m", [300_000], optimizer=psclient.sgd(1.0)))
            trainer.push_dense("m", np.ones(300_000, dtype=np.float32))  # the bulk stream, mutual TLS
            assert np.all(trainer.pull_dense("m") == -1)
            assert admin.stats()[0].bulk_calls >= 2
            with pytest.raises(psclient.AuthError):
                admin.push_dense("m", np.ones(300_000, dtype=np.float32))
        # Without a client certificate the handshake (or the call) is refused.
        with pytest.raises(psclient.PsError):
            psclient.Client(ep, tls=psclient.Tls(ca=str(certs / "ca.pem")), max_attempts=1, timeout=5)
    finally:
        shard.stop()
