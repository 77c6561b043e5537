"""Bad input to the reference API (``evaluate``): a SpecError naming the argument and what was
expected, never a traceback from inside the reference and never a silent result (issue 11)."""

from __future__ import annotations

import pytest

from pgspec.conformance.corpus import golden
from pgspec.reference import REGISTRY, SpecError, evaluate

CASES = golden.load_all()
FIRST = {}  # the first hand-written golden case of every formula: valid inputs to spoil
for _c in CASES:
    if "$generate" not in _c["inputs"] and not _c.get("expect_error") and _c["formula"] not in FIRST:
        FIRST[_c["formula"]] = _c


def valid(fid):
    c = FIRST[fid]
    return golden.case_inputs(c), dict(c["params"])


def spec_error(fid, inputs, params=None, **kw) -> str:
    with pytest.raises(SpecError) as e:
        evaluate(fid, inputs, params, **kw)
    return str(e.value)


# An empty list where a per-sequence input is due, while the batch has sequences: it used to pass
# the shape check and give zeros with a zero gradient.
PER_SEQUENCE = [(fid, i.name) for fid, c in sorted(FIRST.items()) for i in REGISTRY[fid].inputs
                if i.shapes[0] == ("B",) and isinstance(c["inputs"].get(i.name), list) and c["inputs"][i.name]]


@pytest.mark.parametrize("fid,name", PER_SEQUENCE, ids=[f"{f}-{n}" for f, n in PER_SEQUENCE])
def test_empty_per_sequence_input_is_a_shape_error(fid, name):
    inputs, params = valid(fid)
    B = len(inputs[name])
    inputs[name] = []
    msg = spec_error(fid, inputs, params)
    assert msg.startswith(f"{fid}: input ")
    assert "got shape [0]" in msg or f"B=0 (from {name!r})" in msg
    assert f"B={B}" in msg or f"B=0 (from {name!r})" in msg
    assert name in msg and "must have shape [B" in msg


@pytest.mark.parametrize("fid", ["agg.prompt_mean", "adv.group_normalized"])
def test_the_issue_examples(fid):
    inputs, params = valid(fid)
    inputs["group_ids"] = []
    msg = spec_error(fid, inputs, params)
    assert msg.startswith(f"{fid}: input 'group_ids' must have shape [B] with B=")
    assert msg.endswith("got shape [0]")


@pytest.mark.parametrize("fid", sorted(FIRST))
def test_an_empty_batch_is_valid_and_gives_empty_outputs(fid):
    """B = 0 everywhere is an empty batch (spec/conventions.md): empty per-sequence and per-token
    outputs, no exception."""
    f = REGISTRY[fid]
    inputs = {i.name: [] for i in f.inputs if not i.optional}
    try:
        result = evaluate(fid, inputs, FIRST[fid]["params"])
    except SpecError as e:  # a formula whose parameters need a non-empty batch says so by name
        assert str(e).startswith(f"{fid}: ")
        return
    for o in f.outputs:
        if o.shape[:1] == ("B",):
            assert result[o.name] == [], o.name
    for name, g in result["grad"].items():
        assert g == [], name


@pytest.mark.parametrize("fid", ["kl.k1", "ratio.token", "loss.grpo"])
def test_one_empty_token_input_among_full_ones(fid):
    inputs, params = valid(fid)
    name = REGISTRY[fid].inputs[1].name
    inputs[name] = []
    msg = spec_error(fid, inputs, params)
    assert f"input {name!r} must have shape" in msg and "got shape [0]" in msg


@pytest.mark.parametrize("params", ["abc", "", ["eps", 0.2], ("a", 1), 3, 0.2, True],
                         ids=["str", "empty-str", "list", "tuple", "int", "float", "bool"])
@pytest.mark.parametrize("fid", ["kl.k1", "loss.grpo", "adv.group_normalized"])
def test_params_must_be_a_dict(fid, params):
    inputs, _ = valid(fid)
    msg = spec_error(fid, inputs, params)
    assert msg.startswith(f"{fid}: params must be a dict of parameter name -> value (or None), "
                          f"got {type(params).__name__}")


@pytest.mark.parametrize("fid", [12, 1.5, None, ["kl.k1"], ("kl.k1",), {"id": "kl.k1"}, b"kl.k1", True],
                         ids=["int", "float", "None", "list", "tuple", "dict", "bytes", "bool"])
def test_formula_id_must_be_a_string(fid):
    msg = spec_error(fid, {})
    assert msg.startswith(f"formula_id must be a formula ID string such as 'kl.k3', got {type(fid).__name__}")


@pytest.mark.parametrize("fid", ["", "kl", "kl.k4", "KL.K1", " kl.k1", "kl.k1 ", "kl.*"])
def test_unknown_formula_id(fid):
    msg = spec_error(fid, {})
    assert msg.startswith(f"unknown formula ID {fid!r}; known IDs: ") and "kl.k1" in msg


@pytest.mark.parametrize("inputs", [None, [], "logprobs", 3, [("logprobs", [[0.0]])]],
                         ids=["None", "list", "str", "int", "pairs"])
def test_inputs_must_be_a_dict(inputs):
    msg = spec_error("kl.k1", inputs)
    assert msg.startswith("kl.k1: inputs must be a dict of input name -> nested list, got")


@pytest.mark.parametrize("key", [3, None, ("logprobs",), "Logprobs", "log_probs"], ids=repr)
def test_unknown_input_names_are_listed(key):
    inputs, params = valid("kl.k1")
    inputs[key] = [[0.0]]
    msg = spec_error("kl.k1", inputs, params)
    assert msg.startswith(f"kl.k1: unknown input(s) [{key!r}]; inputs are: logprobs, ref_logprobs, mask")


@pytest.mark.parametrize("name", ["logprobs", "ref_logprobs", "mask"])
def test_missing_input_names_it_and_its_shape(name):
    inputs, params = valid("kl.k1")
    del inputs[name]
    assert spec_error("kl.k1", inputs, params) == f"kl.k1: missing input {name!r} (expected shape [B,T])"


LEAVES = [
    ("string", "abc", "must be a real number"),
    ("bool", True, "must be a real number (int, float or decimal string), got True"),
    ("none", None, "must be a real number (int, float or decimal string), got None"),
    ("nan", float("nan"), "must be finite (NaN and +-inf are allowed only where the mask is false), got nan"),
    ("inf", float("inf"), "must be finite (NaN and +-inf are allowed only where the mask is false), got inf"),
    ("dict", {}, "must be a real number (int, float or decimal string), got {}"),
    ("complex", 1j, "must be a real number (int, float or decimal string), got 1j"),
]


@pytest.mark.parametrize("label,leaf,expected", LEAVES, ids=[x[0] for x in LEAVES])
def test_bad_real_leaf_names_the_element(label, leaf, expected):
    inputs, params = valid("kl.k1")
    inputs["logprobs"] = [list(row) for row in inputs["logprobs"]]
    t = next(k for k, m in enumerate(inputs["mask"][0]) if m)
    inputs["logprobs"][0][t] = leaf
    msg = spec_error("kl.k1", inputs, params)
    assert msg.startswith(f"kl.k1: input logprobs[0][{t}] ") and expected in msg


@pytest.mark.parametrize("leaf,expected", [(1, "a bool (true/false), got 1"), ("true", "a bool (true/false), got 'true'"),
                                            (None, "a bool (true/false), got None")], ids=["int", "str", "None"])
def test_bad_mask_leaf(leaf, expected):
    inputs, params = valid("kl.k1")
    inputs["mask"] = [list(row) for row in inputs["mask"]]
    inputs["mask"][0][0] = leaf
    assert spec_error("kl.k1", inputs, params) == f"kl.k1: input mask[0][0] must be {expected}"


@pytest.mark.parametrize("leaf", [1.5, "1", True, None], ids=repr)
def test_bad_group_id_leaf(leaf):
    inputs, params = valid("adv.group_normalized")
    inputs["group_ids"] = list(inputs["group_ids"])
    inputs["group_ids"][1] = leaf
    assert spec_error("adv.group_normalized", inputs, params) == \
        f"adv.group_normalized: input group_ids[1] must be an integer, got {leaf!r}"


def test_ragged_input_names_both_rows():
    inputs, params = valid("kl.k1")
    inputs["logprobs"] = [list(inputs["logprobs"][0]), list(inputs["logprobs"][0]) + [0.0]] + inputs["logprobs"][2:]
    msg = spec_error("kl.k1", inputs, params)
    assert msg.startswith("kl.k1: input 'logprobs' is ragged: logprobs[0] has shape") and "pad to a rectangular array" in msg


@pytest.mark.parametrize("value", [[[[0.0]]], 0.0, "0.0"], ids=["3d", "scalar", "string"])
def test_wrong_rank_names_the_expected_shape(value):
    inputs, params = valid("kl.k1")
    inputs["ref_logprobs"] = value
    msg = spec_error("kl.k1", inputs, params)
    assert msg.startswith("kl.k1: input 'ref_logprobs' must have shape [B,T] with B=") and "got shape [" in msg


@pytest.mark.parametrize("dps", [14, 0, -1, 15.0, "60", None, True, 1001, 10 ** 9], ids=repr)
def test_bad_dps(dps):
    assert spec_error("kl.k1", {}, dps=dps) == f"dps must be an integer from 15 to 1000, got {dps!r}"


def _nested(depth):
    x = [-1.0]
    for _ in range(depth):
        x = [x]
    return x


def _cycle():
    a = []
    a.append(a)
    return a


@pytest.mark.parametrize("value", [_nested(3), _nested(5000), _cycle(), [[-1.0, [[-2.0]]]]],
                         ids=["3-deep", "5000-deep", "contains-itself", "ragged-deep"])
def test_an_input_nested_far_beyond_its_rank_is_refused_not_a_recursion_error(value):
    inputs = {"logprobs": value, "ref_logprobs": [[-2.0]], "mask": [[True]]}
    msg = spec_error("kl.k1", inputs)
    assert msg.startswith("kl.k1: input 'logprobs' is nested deeper than its shape allows (its rank is 2)"), msg


def test_one_level_too_deep_is_the_shape_checks_error():
    msg = spec_error("kl.k1", {"logprobs": [[[-1.0]]], "ref_logprobs": [[-2.0]], "mask": [[True]]})
    assert "must have shape" in msg, msg


def test_an_input_beyond_the_size_limit_is_refused_before_any_work():
    big = [[0.0] * 1001] * 1000      # 1,001,000 elements (shared rows: built in no time)
    msg = spec_error("kl.k1", {"logprobs": big, "ref_logprobs": big, "mask": [[True] * 1001] * 1000})
    assert "has 1,001,000 elements (shape [1000, 1001]); the reference evaluates at most 1,000,000" in msg


PARAMS = [
    ("loss.grpo", "eps_low", -0.1), ("loss.grpo", "eps_low", "abc"), ("loss.grpo", "eps_low", float("nan")),
    ("loss.grpo", "eps_low", [0.2]), ("is.reject", "estimator", "k4"), ("kl.k1", "log_ratio_min", True),
    ("adv.group_normalized", "eps", float("inf")),
]


@pytest.mark.parametrize("fid,name,value", PARAMS, ids=[f"{f}-{n}-{v!r}" for f, n, v in PARAMS])
def test_bad_parameter_value_names_it_and_its_range(fid, name, value):
    inputs, params = valid(fid)
    params[name] = value
    msg = spec_error(fid, inputs, params)
    assert msg.startswith(f"{fid}: parameter {name!r} must be ")


@pytest.mark.parametrize("key", ["epsilon", 3, None], ids=repr)
def test_unknown_parameter_lists_the_known_ones(key):
    inputs, _ = valid("kl.k1")
    msg = spec_error("kl.k1", inputs, {key: 1})
    assert msg.startswith(f"kl.k1: unknown parameter(s) [{key!r}]; parameters are: log_ratio_max, log_ratio_min")
