"""The Python partitioner and codecs against the Rust code's own output (`ps-interop
vectors`, computed at test time), and the checked-in stubs against `proto/`."""
from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from psclient import codec as cd
from psclient.partition import Partitioner, combine, fnv1a, mix64, table_hash

from conftest import interop


@pytest.fixture(scope="module")
def vectors() -> dict:
    return json.loads(interop("vectors").stdout)


def test_hashes_match_rust(vectors: dict) -> None:
    for h in vectors["hashes"]:
        assert fnv1a(h["name"].encode()) == int(h["fnv1a"]), h
        assert table_hash(h["name"]) == int(h["fnv1a"])
    for m in vectors["mixes"]:
        x = int(m["x"])
        assert mix64(x) == int(m["mix64"])
        assert int(mix64(np.array([x], dtype=np.uint64))[0]) == int(m["mix64"])
        assert combine(x, 7) == int(m["combine_x_7"])


def test_partitioner_matches_rust(vectors: dict) -> None:
    assert len(vectors["partitions"]) == 10
    for p in vectors["partitions"]:
        part = Partitioner(p["num_shards"], p["virtual_nodes"])
        h = table_hash(p["table"])
        ids = np.array([int(i) for i in p["ids"]], dtype=np.uint64)
        assert part.shards_for_ids(h, ids).tolist() == p["id_owners"], (p["num_shards"], p["virtual_nodes"], p["table"])
        assert [part.shard_for_chunk(h, c) for c in range(40)] == p["chunk_owners"]


def test_payloads_are_byte_identical_to_rust(vectors: dict) -> None:
    seen = set()
    for v in vectors["payloads"]:
        values = np.frombuffer(bytes.fromhex(v["input"]), dtype="<f4")
        p = cd.encode(values, cd.Codec.parse(v["codec"]), min_values=0, lz4=False)
        what = f"{v['codec']} over {len(values)} values"
        assert p.encoding == v["encoding"], what
        assert (p.num_values, p.block_size, p.num_entries) == (v["num_values"], v["block_size"], v["num_entries"]), what
        assert p.data.hex() == v["data"], what
        assert cd.decode(p).tobytes().hex() == v["decoded"], what
        seen.add(v["codec"])
    assert {"fp16", "bf16", "int8", "int8:64", "int4", "int4:63", "sign", "topk:0.01", "topk:0.05:f32"} <= seen


def test_codec_text_form_is_checked() -> None:
    assert str(cd.Codec.parse("topk:0.01")) == "topk:0.01"
    assert cd.Codec.parse("f16") == cd.Codec.parse("fp16")
    for bad in ["topk", "topk:0", "topk:1.5", "topk:x", "int8:0", "int8:1:2", "int4:0", "int4:1:2", "zip", "topk:0.1:f8"]:
        with pytest.raises(ValueError):
            cd.Codec.parse(bad)


def test_bounded_row_residuals_conserve_what_they_keep_and_drop() -> None:
    """With room for 2 rows, a third takes the slot of the row pushed least recently; what
    each row was sent, still owes and had dropped adds up to what it was given."""
    rng = np.random.default_rng(3)
    codec = cd.Codec.parse("topk:0.25")
    res = cd.RowResiduals(4, max_rows=2)
    given: dict = {}
    sent: dict = {}
    dropped: dict = {}
    for ids in [[1], [2], [1], [3], [4, 5, 6], [1, 1]]:
        arr = np.array(ids, dtype=np.uint64)
        grads = rng.normal(size=4 * len(ids)).astype(np.float32)
        before = {k: v.copy() for k, v in res.rows.items()}
        p = res.compress(arr, grads, codec, min_values=0, lz4=False)
        assert len(res.rows) <= 2
        for k, v in before.items():
            if k not in res.rows and k not in ids:
                dropped[k] = dropped.get(k, 0) + v
        for i, row in zip(ids, cd.decode(p).reshape(-1, 4)):
            sent[i] = sent.get(i, 0) + row.astype(np.float64)
        for i, g in zip(ids, grads.reshape(-1, 4)):
            given[i] = given.get(i, 0) + g.astype(np.float64)
    assert res.evicted >= 2
    assert 2 not in res.rows  # pushed once, then least recent when 3 came
    for i in given:
        if i in (4, 5, 6):
            continue  # one push that overflowed: what its rows found no room for is lost
        owed = res.rows.get(i, np.zeros(4))
        assert np.allclose(sent[i] + owed + dropped.get(i, 0), given[i], atol=1e-5), i


def test_lz4_payloads_round_trip() -> None:
    values = np.zeros(10_000, dtype=np.float32)
    values[::100] = 1.5
    p = cd.encode(values, cd.Codec.parse("f32"))
    assert p.compression == 1 and len(p.data) < 4 * len(values) // 4
    assert np.array_equal(cd.decode(p), values)


def test_checked_in_stubs_match_the_protocol() -> None:
    tool = pathlib.Path(__file__).resolve().parents[1] / "tools" / "gen_stubs.py"
    out = subprocess.run([sys.executable, str(tool), "--check"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_the_package_type_checks() -> None:
    """The type hints the package ships (`py.typed`) hold: mypy over the installed package."""
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--ignore-missing-imports", "--no-error-summary", "-p", "psclient"],
        capture_output=True,
        text=True,
        cwd=pathlib.Path(__file__).resolve().parent,
    )
    errors = [line for line in out.stdout.splitlines() if "/_proto/" not in line and "error" in line]
    assert not errors, "\n".join(errors)
