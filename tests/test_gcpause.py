"""gc_paused(): the collector is paused inside the block and resumed whatever happens; the bulk
readers (golden files, prepared references, property references) use it."""

from __future__ import annotations

import gc

import pytest
from mpmath import mp, mpf

from pgspec.conformance.judge import compare
from pgspec.conformance.judge import prepared_cache
from pgspec.conformance.corpus import golden
from pgspec.conformance.base.gcpause import gc_paused
from pgspec.conformance.run.properties import _common as C


def test_paused_inside_and_resumed_after_an_exception():
    assert gc.isenabled()
    with pytest.raises(RuntimeError, match="boom"):
        with gc_paused():
            assert not gc.isenabled()
            raise RuntimeError("boom")
    assert gc.isenabled()


def test_a_nested_pause_leaves_the_outer_one_in_charge():
    with gc_paused():
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()      # the inner block does not resume what the outer paused
    assert gc.isenabled()


def test_a_caller_that_disabled_the_collector_keeps_it_disabled():
    gc.disable()
    try:
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


def _record_gc_state(monkeypatch, module, name, seen):
    real = getattr(module, name)

    def spy(*a, **k):
        seen.append(gc.isenabled())
        return real(*a, **k)

    monkeypatch.setattr(module, name, spy)


def test_property_references_are_read_back_with_the_collector_paused(tmp_path, monkeypatch):
    monkeypatch.setenv("PGSPEC_CACHE", str(tmp_path))
    with mp.workdps(60):
        result = {"value": mpf(1) / 3, "grad": {"values": [[mpf(2) / 7]]}, "scale": {"value": mpf(1)}}
    key = C._key("agg.token_mean", {"values": [[1.0]], "mask": [[True]]}, {})
    C._disk_put(key, result)
    seen: list = []
    _record_gc_state(monkeypatch, C, "_unpack", seen)
    back = C._disk_get(key)
    assert back["value"]._mpf_ == result["value"]._mpf_
    assert seen and not any(seen) and gc.isenabled()     # _unpack recurses: every call paused


def test_golden_files_are_parsed_with_the_collector_paused(monkeypatch):
    seen: list = []
    real = golden.json.loads

    def spy(*a, **k):
        doc = real(*a, **k)
        if isinstance(doc, dict) and "cases" in doc:        # a family file (not the MANIFEST)
            seen.append(gc.isenabled())
        return doc

    monkeypatch.setattr(golden.json, "loads", spy)
    monkeypatch.setattr(golden, "_PARSED", {})         # parse again, not from this process's memo
    doc = golden.load_family("agg")
    assert doc["cases"] and seen == [False] and gc.isenabled()


def test_prepared_references_are_read_back_with_the_collector_paused(monkeypatch):
    seen: list = []
    real = prepared_cache._read_family_arrays

    def spy(*a, **k):
        seen.append(gc.isenabled())
        return real(*a, **k)

    monkeypatch.setattr(prepared_cache, "_read_family_arrays", spy)
    try:
        prepared_cache._read_family("/nonexistent/prepared.npz", {})
    except OSError:
        pass
    assert seen == [False] and gc.isenabled()
