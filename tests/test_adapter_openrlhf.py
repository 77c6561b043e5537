"""The openrlhf adapter against the golden corpus (skipped unless OpenRLHF is installed here).

Install: bash ci/install-openrlhf.sh VENV, then VENV/bin/python -m pytest tests/test_adapter_openrlhf.py.
"""

import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("openrlhf")  # openrlhf/__init__.py is empty: importing it pulls in nothing

from pgspec.conformance.corpus import golden  # noqa: E402
from pgspec.conformance.run.runner import BAD_OUTCOMES, load_adapter, load_case, run_case  # noqa: E402


@pytest.fixture(scope="module")
def adapter():
    a = load_adapter("openrlhf")
    ok, why = a.available()
    assert ok, why
    return a


def test_declares_framework(adapter):
    from importlib import metadata

    assert adapter.framework == "OpenRLHF"
    assert adapter.version == metadata.version("openrlhf") == "0.11.2"
    assert {"surrogate.ppo_clip", "surrogate.dual_clip", "surrogate.gspo", "kl.k3", "agg.token_mean"} <= adapter.capabilities()


def test_loading_leaves_no_stub_behind(adapter):
    from pgspec.adapters import openrlhf as mod

    mod._load()
    assert not [n for n in sys.modules if n.startswith("_pgspec_openrlhf")]
    ds = sys.modules.get("deepspeed")
    assert ds is None or ds.__spec__ is not None, "a spec-less deepspeed stub was left in sys.modules"


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_corpus(adapter, dtype):
    cases = [c for c in golden.load_all() if c["formula"] in adapter.capabilities()]
    assert cases
    bad = [(r.case_id, r.outcome, r.message.splitlines()[-1] if r.message else "")
           for r in (run_case(adapter, c, dtype, "cpu") for c in cases) if r.outcome in BAD_OUTCOMES]
    assert not bad, bad


def test_declared_bug_reproduces(adapter):
    # OpenRLHF PR #1293: GSPO exponentiates the unclamped mean log-ratio -> NaN gradient in float32
    r = run_case(adapter, load_case("surrogate.gspo/log-ratio-200-clipped-side"), "float32", "cpu")
    assert r.outcome == "bug", r.message
    assert r.declaration["kind"] == "bug"
    assert "nan" in r.message.lower()
