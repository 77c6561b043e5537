"""The torch backend's parameter check remembers the sets that passed (adapters/torch/_validate.py):
a remembered set is one with the very same values (types included, floats by their bits), and a
set that fails is rejected every time it is given."""

from __future__ import annotations

import pytest
from mpmath import mpf

from pgspec.adapters.torch import _validate
from pgspec.reference import SpecError


@pytest.fixture(autouse=True)
def _fresh():
    _validate._PASSED.clear()
    yield
    _validate._PASSED.clear()


def test_a_set_that_passed_is_checked_once():
    _validate.check_parameters("ratio.token", {"log_ratio_clamp": 20.0})
    assert ("ratio.token", (("log_ratio_clamp", float, (20.0).hex()),)) in _validate._PASSED
    _validate.check_parameters("ratio.token", {"log_ratio_clamp": 20.0})
    assert len(_validate._PASSED) == 1


@pytest.mark.parametrize("fid, good, bad", [
    # the open lower bound 0: 0.0 is refused, also after a positive value passed
    ("ratio.token", {"log_ratio_clamp": 1.0}, {"log_ratio_clamp": 0.0}),
    ("ratio.token", {"log_ratio_clamp": 1.0}, {"log_ratio_clamp": -0.0}),
    ("ratio.token", {"log_ratio_clamp": 1.0}, {"log_ratio_clamp": float("nan")}),
    # True equals 1 and hashes like it, but a count must be an int, not a boolean
    ("agg.sample_mean", {"num_sequences": 1}, {"num_sequences": True}),
    # an unknown name next to a known one
    ("ratio.token", {"log_ratio_clamp": 1.0}, {"log_ratio_clamp": 1.0, "clamp": 1.0}),
    # the ordered bounds of a KL clamp
    ("kl.k3", {"log_ratio_min": -1.0, "log_ratio_max": 1.0}, {"log_ratio_min": 1.0, "log_ratio_max": 1.0}),
])
def test_a_failing_set_is_rejected_every_time(fid, good, bad):
    _validate.check_parameters(fid, good)
    for _ in range(2):
        with pytest.raises(SpecError):
            _validate.check_parameters(fid, bad)
    assert _validate._params_key(fid, bad) not in _validate._PASSED


def test_values_that_are_not_plain_are_checked_each_time():
    """An mpf (or any other type) is not remembered: it is checked on every call."""
    params = {"log_ratio_clamp": mpf(1)}
    assert _validate._params_key("ratio.token", params) is None
    _validate.check_parameters("ratio.token", params)
    assert not _validate._PASSED
    with pytest.raises(SpecError):
        _validate.check_parameters("ratio.token", {"log_ratio_clamp": mpf(-1)})
