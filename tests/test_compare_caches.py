"""The caches that let repeated runs skip mpmath work return exactly what the evaluation returns:
the property checks' reference results (exact mpf round trip) and golden verify's case records
(keyed by the case and the code that generates it)."""

from __future__ import annotations

import dataclasses
import json

from mpmath import mp, mpf

from pgspec.conformance.corpus import golden
from pgspec.conformance.corpus.cases import all_cases
from pgspec.conformance.run.properties import _common as C


def test_reference_results_round_trip_exactly(tmp_path, monkeypatch):
    monkeypatch.setenv("PGSPEC_CACHE", str(tmp_path))
    with mp.workdps(60):
        result = {"value": mpf(1) / 3, "grad": {"values": [[mpf(2) / 7, mpf(0), None], [mpf("-1e-400"), True, 3]]},
                  "scale": {"value": mpf("inf"), "grad.values": [[mpf("nan"), mpf(-0.0), mpf(10) ** 300]]}}
    key = C._key("agg.token_mean", {"values": [[1.0]], "mask": [[True]]}, {})
    C._disk_put(key, result)
    back = C._disk_get(key)
    flat = lambda x: [v for _, v in C._flat(x)]  # noqa: E731
    assert back["value"]._mpf_ == result["value"]._mpf_
    a = flat(back["grad"]["values"]) + flat(back["scale"]["grad.values"])
    b = flat(result["grad"]["values"]) + flat(result["scale"]["grad.values"])
    assert [x._mpf_ if isinstance(x, mpf) else x for x in a] == [x._mpf_ if isinstance(x, mpf) else x for x in b]
    assert C._disk_get(C._key("agg.token_mean", {"values": [[2.0]], "mask": [[True]]}, {})) is None
    monkeypatch.setenv("PGSPEC_CACHE", "off")
    assert C._disk_get(key) is None


def test_record_keys_follow_the_case_and_the_code(tmp_path, monkeypatch):
    monkeypatch.setenv("PGSPEC_CACHE", str(tmp_path))
    case = next(c for c in all_cases() if c.id == "ratio.token/two-tokens")
    key = golden._record_key(case)
    assert key == golden._record_key(case)
    for change in ({"description": case.description + "."}, {"params": {**case.params, "log_ratio_clamp": 20.0}},
                   {"category": "edge" if case.category != "edge" else "example"}):
        assert golden._record_key(dataclasses.replace(case, **change)) != key
    golden._code_digest.cache_clear()
    monkeypatch.setattr(golden, "_code_digest", lambda: "another reference")
    assert golden._record_key(case) != key


def test_records_from_the_cache_are_the_generated_ones(tmp_path, monkeypatch):
    monkeypatch.setenv("PGSPEC_CACHE", str(tmp_path))
    cases = [c for c in all_cases() if c.id.startswith("ratio.token/")][:3]
    fresh = golden._generate_records(cases, cache=True, reuse=False)        # evaluated, stored
    assert golden._STATS == {"cached": 0, "evaluated": len(cases)}
    again = golden._generate_records(cases)                                 # all from the cache
    assert golden._STATS == {"cached": len(cases), "evaluated": 0}
    assert json.dumps(again, indent=1) == json.dumps(fresh, indent=1)
    seen = []
    golden._generate_records(cases, progress=lambda done, total: seen.append((done, total)))
    assert seen[-1] == (len(cases), len(cases))


def test_a_damaged_reference_entry_is_evaluated_again(tmp_path, monkeypatch):
    monkeypatch.setenv("PGSPEC_CACHE", str(tmp_path))
    with mp.workdps(60):
        result = {"value": mpf(1) / 3, "grad": {}, "scale": {"value": mpf(1) / 3}}
    key = C._key("agg.token_mean", {"values": [[1.0]], "mask": [[True]]}, {})
    C._disk_put(key, result)
    path = C._disk_path(key)
    raw = bytearray(path.read_bytes())
    assert C._disk_get(key)["value"] == result["value"]
    raw[-3] ^= 1                      # one bit of the payload
    path.write_bytes(bytes(raw))
    assert C._disk_get(key) is None


def test_a_damaged_prepared_golden_file_is_prepared_again(tmp_path, monkeypatch):
    from pgspec.conformance.judge import compare
    from pgspec.conformance.judge import prepared_cache

    monkeypatch.setenv("PGSPEC_CACHE", str(tmp_path))
    monkeypatch.setattr(prepared_cache, "_FAMILIES", {})
    case = next(c for c in golden.load_all() if c["formula"] == "kl.k3" and not c.get("expect_error"))
    key = next(iter(case["outputs"]))
    prepared_cache._loaded_entry(case, key, False)                  # writes the family's file
    (path,) = prepared_cache._prepared_dir().glob("*.npz")
    sha, cases = golden.LOADED[case["family"]]
    assert prepared_cache._read_family(path, cases)                  # intact: read back
    import numpy as np
    with np.load(path) as z:
        data = {k: z[k] for k in z.files}
    data["r_hi"] = data["r_hi"].copy()
    data["r_hi"][0] += 1.0                                    # a wrong reference value
    np.savez(path, **data)
    import pytest
    with pytest.raises(ValueError, match="damaged"):
        prepared_cache._read_family(path, cases)
    prepared_cache._FAMILIES.clear()
    got = prepared_cache._loaded_entry(case, key, False)            # prepared afresh, not read
    want = compare.prepare(case["outputs"][key], case["scale"].get(key))
    assert np.array_equal(got.r_hi, want.r_hi)


def test_reference_keys_are_equal_exactly_for_equal_values():
    import json
    import math

    row = [-0.5, -1.25]
    a = C._key("agg.token_mean", {"values": [row, row], "mask": [[True, False]] * 2}, {"b": 1, "a": 2.0})
    # the same values: other objects, another insertion order
    b = C._key("agg.token_mean", {"mask": [[True, False], [True, False]], "values": [[-0.5, -1.25], [-0.5, -1.25]]},
               {"a": 2.0, "b": 1})
    assert a == b
    for other in ({"a": 2, "b": 1}, {"a": 2.0, "b": True}, {"a": -0.0, "b": 1}, {"a": 2.0, "b": 1, "c": None}):
        assert C._key("agg.token_mean", {"values": [row, row], "mask": [[True, False]] * 2}, other) != a
    assert C._key("agg.token_mean", {"values": [row, [-0.5, -1.5]], "mask": [[True, False]] * 2},
                  {"b": 1, "a": 2.0}) != a
    # the parts come back as JSON gives them (what the evaluation used to decode), NaN included
    parts = ("kl.k3", {"logprobs": [[math.nan, math.inf, -0.0, 1.5]], "mask": [[True, False, True, True]]},
             {"clamp": (1.0, 2.0)})
    back = C._parts(C._key(*parts))
    want = C.decode(json.loads(C._json_key(*parts)))
    assert json.dumps(back, sort_keys=True) == json.dumps(want, sort_keys=True)
    assert back[2]["clamp"] == [1.0, 2.0] and math.isnan(back[1]["logprobs"][0][0])
