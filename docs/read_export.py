#!/usr/bin/env python3
"""Reads what `psctl export` wrote, with the standard library only (docs/EXPORT.md).

    read_export.py DIR                 prints the export as JSON: every dense table's values,
                                       every sparse table's rows by key
    read_export.py DIR --apply INC     the same for DIR with incremental export INC applied

Every file is checked against the manifest's size and CRC-32 first.
"""
import array
import json
import struct
import sys
import zlib
from pathlib import Path


def checked(root, ref):
    data = (Path(root) / ref["file"]).read_bytes()
    if len(data) != ref["bytes"] or zlib.crc32(data) != ref["crc32"]:
        raise ValueError(f"{ref['file']} does not match the manifest")
    return data


def floats(data):
    a = array.array("f")
    a.frombytes(data)
    if sys.byteorder != "little":
        a.byteswap()
    return a


def read_safetensors(data):
    (n,) = struct.unpack_from("<Q", data, 0)
    header = json.loads(data[8 : 8 + n])
    body = data[8 + n :]
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        assert t["dtype"] == "F32", t["dtype"]
        start, end = t["data_offsets"]
        out[name] = {"shape": t["shape"], "values": list(floats(body[start:end]))}
    return out


def read(root):
    """The export in DIR: its manifest, dense tables and sparse rows ({key: [values]})."""
    m = json.loads((Path(root) / "manifest.json").read_text())
    assert m["format"] == 1 and m["byte_order"] == "little"
    dense = read_safetensors(checked(root, m["dense"])) if m["dense"] else {}
    sparse, deleted = {}, {}
    for t in m["sparse"]:
        dim, rows, gone = t["dim"], {}, []
        record = 8 + 4 * dim
        for f in t["files"]:
            data = checked(root, f["rows_file"])
            assert len(data) == f["rows"] * record
            for i in range(f["rows"]):
                (key,) = struct.unpack_from("<Q", data, i * record)
                rows[key] = list(floats(data[i * record + 8 : (i + 1) * record]))
            if f["deleted_file"]:
                data = checked(root, f["deleted_file"])
                gone += struct.unpack(f"<{f['deleted']}Q", data)
        sparse[t["name"]] = rows
        deleted[t["name"]] = gone
    return m, dense, sparse, deleted


def apply(full, inc):
    """A full export with an incremental one applied to it (the incremental's `since` must be
    the full export's checkpoint)."""
    m, dense, sparse, _ = full
    mi, dense_i, sparse_i, deleted_i = inc
    assert mi["since"]["name"] == m["checkpoint"]["name"], "not an increment of this export"
    dense = {**dense, **dense_i}
    out = {}
    for name in sparse_i:
        rows = dict(sparse.get(name, {}))
        for k in deleted_i[name]:
            rows.pop(k, None)
        rows.update(sparse_i[name])
        out[name] = rows
    return mi, dense, out, {}


def main():
    args = sys.argv[1:]
    e = read(args[0])
    if len(args) == 3 and args[1] == "--apply":
        e = apply(e, read(args[2]))
    m, dense, sparse, _ = e
    print(json.dumps({
        "checkpoint": m["checkpoint"]["name"],
        "dense": dense,
        "sparse": {n: {str(k): v for k, v in sorted(r.items())} for n, r in sparse.items()},
    }, sort_keys=True))


if __name__ == "__main__":
    main()
