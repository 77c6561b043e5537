"""The prepared references of the golden corpus, kept on disk per family (under
``$PGSPEC_CACHE/prepared/<version>``, cache.version_dir) and read back as arrays: ``prepare_output``
gives a golden output's ``Prepared`` without parsing its 40-digit strings again."""

from __future__ import annotations

import os

import numpy as np
from mpmath import libmp

from ..base.gcpause import gc_paused
from .prepared import Prepared, _ARRAYS, _ARRAY_DTYPES, prepare


def _prepared_dir():
    from ..base.cache import version_dir

    return version_dir("prepared", _code_digest())


_CODE_DIGEST: list = []


def _code_digest() -> str:
    if not _CODE_DIGEST:
        import hashlib
        from pathlib import Path

        h = hashlib.sha256(f"{np.__version__}|{libmp.BACKEND}".encode())
        for name in ("compare.py", "prepared.py", "prepared_cache.py", "tolerance.py"):
            h.update(b"\0" + (Path(__file__).resolve().parent / name).read_bytes())
        _CODE_DIGEST.append(h.hexdigest()[:16])
    return _CODE_DIGEST[0]


def _stored_at_positions(case: dict, key: str, ref) -> bool:
    """Whether output ``key`` of ``case`` is prepared as a per-token output stored at positions
    (when the adapter's result has at least two dimensions, see ``compare_output``)."""
    positions = case.get("positions")
    return positions is not None and isinstance(ref, list) and len(ref) == len(positions)


def _family_entries(family: str, sha: str, cases: dict) -> dict:
    """{(case id, key, token): Prepared} for every output of every case of a loaded family file,
    read from the on-disk cache or prepared now (and stored)."""
    d = _prepared_dir()
    path = d / f"{sha}.npz" if d is not None else None
    from ..base.files import cache_entry_ok

    if path is not None and cache_entry_ok(path):   # a directory or a FIFO there: a miss, never a hang
        try:
            return _read_family(path, cases)
        except Exception:  # noqa: BLE001 - a damaged or unreadable entry only costs its preparation
            pass
    entries = {}
    for cid, case in cases.items():
        if case.get("expect_error"):
            continue
        for key, ref in list(case["outputs"].items()) + [(f"grad.{k}", v) for k, v in case["grad"].items()]:
            token = _stored_at_positions(case, key, ref)
            entries[(cid, key, token)] = prepare(ref, case["scale"].get(key), case["positions"] if token else None)
    if path is not None:
        _write_family(path, entries)
    return entries


def _write_family(path, entries: dict) -> None:
    """One .npz: the element arrays of every output concatenated, the index arrays concatenated,
    and a JSON table of the outputs (case, key, token, element start and count, index arrays' start
    and count, scalar, shape)."""
    import json

    rows, arrays, index = [], {n: [] for n in _ARRAYS}, []
    start = istart = 0
    for (cid, key, token), p in entries.items():
        if p.index is None and not p.scalar:
            continue            # a ragged reference: prepared again when needed
        n = len(p)
        for name in _ARRAYS:
            arrays[name].append(getattr(p, name))
        idx = [] if p.index is None else list(p.index)
        index.extend(idx)
        rows.append([cid, key, token, start, n, istart, len(idx), p.scalar,
                     None if p.shape is None else list(p.shape)])
        start += n
        istart += len(idx)
    if not rows:
        return
    data = {"table": np.array(json.dumps(rows)),
            "index": np.concatenate(index).astype(np.int64) if index else np.zeros(0, dtype=np.int64),
            "lengths": np.array([len(i) for i in index], dtype=np.int64),
            **{n: np.concatenate(a).astype(_ARRAY_DTYPES[n], copy=False) for n, a in arrays.items()}}
    data["digest"] = np.array(_arrays_digest(data))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.stem}.{os.getpid()}.tmp.npz")
        np.savez(tmp, **data)
        tmp.replace(path)
    except OSError:
        pass        # a read-only cache only costs time


def _arrays_digest(data: dict) -> str:
    """sha256 of a family entry's table and arrays (their dtypes, shapes and bytes): a damaged file
    is prepared again, never read."""
    import hashlib

    h = hashlib.sha256()
    for name in ("table", "index", "lengths", *_ARRAYS):
        a = data[name]
        h.update(f"{name}|{a.dtype.str}|{a.shape}|".encode())
        h.update(str(a).encode() if name == "table" else np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def _read_family(path, cases: dict) -> dict:
    with gc_paused():       # many small objects, no reference cycles
        return _read_family_arrays(path, cases)


def _read_family_arrays(path, cases: dict) -> dict:
    import json

    with np.load(path, allow_pickle=False) as z:
        data = {n: z[n] for n in ("table", "index", "lengths", *_ARRAYS)}
        if str(z["digest"]) != _arrays_digest(data):
            raise ValueError(f"{path}: damaged (its digest does not match its arrays)")
    rows = json.loads(str(data["table"]))
    arr = {n: data[n] for n in _ARRAYS}
    index, lengths = data["index"], data["lengths"]
    if any(arr[n].dtype != _ARRAY_DTYPES[n] for n in _ARRAYS) or index.dtype != np.int64:
        raise ValueError(f"{path}: arrays of the wrong type")
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    entries = {}
    for cid, key, token, start, n, istart, nidx, scalar, shape in rows:
        case = cases[cid]
        ref = case["outputs"][key] if not key.startswith("grad.") else case["grad"][key[5:]]
        sl = slice(start, start + n)
        idx = tuple(index[offsets[i]:offsets[i + 1]] for i in range(istart, istart + nidx)) if nidx else None
        entries[(cid, key, token)] = Prepared(
            ([()] if n else []) if scalar else None, None, None, *(arr[name][sl] for name in _ARRAYS), idx, scalar,
            None if shape is None else tuple(shape), token,
            source=(ref, case["scale"].get(key), _NonNull(ref) if token else None))
    return entries


class _NonNull:
    """The positions k of a per-token output (stored at positions) whose value is not null: the
    element numbers of its Prepared, listed when first asked."""

    __slots__ = ("ref", "ks")

    def __init__(self, ref):
        self.ref, self.ks = ref, None

    def __getitem__(self, k):
        if self.ks is None:
            self.ks = [j for j, r in enumerate(self.ref) if r is not None]
        return self.ks[k]


_FAMILIES: dict = {}


def _loaded_entry(case: dict, key: str, token: bool):
    """The Prepared of output ``key`` of ``case`` from its family file's cache, when ``case`` is a
    case loaded from that file (its outputs, gradients and scales the very objects parsed from it)."""
    from ..corpus import golden

    family = case.get("family")
    loaded = golden.LOADED.get(family)
    if loaded is None:
        return None
    sha, cases = loaded
    parsed = cases.get(case.get("id"))
    if parsed is None or parsed["outputs"] is not case["outputs"] or parsed["grad"] is not case["grad"] or \
            parsed["scale"] is not case["scale"] or parsed.get("positions") is not case.get("positions"):
        return None
    hit = _FAMILIES.get(family)
    if hit is None or hit[0] != sha:
        hit = _FAMILIES[family] = (sha, _family_entries(family, sha, cases))
    return hit[1].get((case["id"], key, token))


def prepare_output(case: dict, key: str, ref, got) -> Prepared:
    """The Prepared of one output of a case (per-token outputs of a scale case are stored at
    ``positions`` when the result has at least two dimensions, see ``compare_output``)."""
    token = _stored_at_positions(case, key, ref) and hasattr(got, "dim") and got.dim() >= 2
    hit = _loaded_entry(case, key, token)
    if hit is not None:
        return hit
    return prepare(ref, case["scale"].get(key), case.get("positions") if token else None)
