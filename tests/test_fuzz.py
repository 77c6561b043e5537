"""`pgspec fuzz`: a wrong implementation of each family is found and shrunk, a declared deviation is
reported as its rule (not as new), ``--save`` writes a case the generator accepts, bad input exits 2,
and a short seeded fuzz of the built-in backend finds nothing."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from pgspec.adapters.base import Adapter
from pgspec.adapters.torch import is_ as good_is
from pgspec.adapters.torch import logprob as good_logprob
from pgspec.adapters.torch import loss as good_loss
from pgspec.conformance.run import runner
from pgspec.conformance.cli import main
from pgspec.conformance.verdicts.declarations import parse
from pgspec.conformance.fuzz import engine
from pgspec.conformance.corpus.golden import generate_case

sys.path.insert(0, str(Path(__file__).parent / "fixtures"))
import wrong_adapters  # noqa: E402


# wrong implementations of the three families wrong_adapters.py has none of: each a regime bug, right
# at the parameters' defaults and wrong only where a parameter takes another value
def _is_ignores_c_min(inputs, params):
    return good_is.IMPLEMENTATIONS["is.token.truncate"](inputs, {**params, "c_min": None})   # BUG: no lower cap


def _logprob_ignores_temperature(inputs, params):
    return good_logprob.IMPLEMENTATIONS["logprob.token"](inputs, {**params, "temperature": 1})   # BUG


def _grpo_ignores_is_weight(inputs, params):
    p = {**params, "is_level": "none"}                   # BUG: the sampler correction dropped
    for k in ("is_mode", "is_c_min", "is_c_max", "is_log_ratio_clamp"):
        p.pop(k, None)
    return good_loss.IMPLEMENTATIONS["loss.grpo"](inputs, p)


OWN = {"is.token.truncate": _is_ignores_c_min, "logprob.token": _logprob_ignores_temperature,
       "loss.grpo": _grpo_ignores_is_weight}
# one wrong implementation per family: (name, formula, adapter factory)
WRONG = [(w.name, w.catch_cases or w.formula, w.adapter) for w in wrong_adapters.WRONG_ADAPTERS]
WRONG += [(f"own-{fid}", fid, lambda fid=fid: Adapter(f"wrong-{fid}", "test", "0", implementations={fid: OWN[fid]}))
          for fid in OWN]


def _size(example_inputs) -> int:
    """Positions of the example: B x T, or B without a mask."""
    mask = example_inputs.get("mask")
    if mask is not None:
        return sum(len(row) for row in mask)
    return len(next(iter(example_inputs.values())))


def test_every_family_has_a_wrong_implementation_here():
    families = {fid.split(".")[0] for _, fid, _ in WRONG}
    assert families == {"mask", "dist", "ratio", "agg", "adv", "kl", "is", "logprob", "loss", "surrogate"}


@pytest.mark.parametrize("name,fid,make", WRONG, ids=[w[0] for w in WRONG])
def test_a_wrong_implementation_is_found_and_shrunk(name, fid, make):
    adapter = make()
    report = engine.fuzz_formula(adapter, fid, "float64", budget=15, seed=0, max_examples=400, database=False)
    assert report.findings, f"{name}: nothing found in {report.examples} examples ({report.invalid} invalid)"
    f = report.findings[0]
    assert f.outcome in ("fail", "error") and f.formula == fid
    # shrunk: a handful of tokens, not the up to 4 x 8 the search draws
    assert _size(f.inputs) <= 8, (name, f.inputs)
    # the reported example reproduces through the runner itself
    from pgspec.conformance.fuzz import judge

    assert judge.confirm(adapter, fid, {"params": f.params, "inputs": f.inputs}, "float64").outcome in ("fail", "error")
    assert judge.confirm(runner.load_adapter("torch"), fid, {"params": f.params, "inputs": f.inputs},
                         "float64").outcome == "pass"


def test_a_declared_deviation_is_reported_as_its_rule_not_as_new():
    w = wrong_adapters.BY_NAME["bessel-std"]
    adapter = w.adapter()
    adapter.deviations = parse({"rule": [{
        "ids": ["adv.group_normalized"], "kind": "bug", "cause": "wrong-formula",
        "reason": "the test's adapter always takes the Bessel std", "link": "https://example.org/bessel#L1"}]},
        "test-deviations.toml")
    report = engine.fuzz_formula(adapter, "adv.group_normalized", "float64", budget=15, seed=0, max_examples=200,
                                 database=False)
    assert not report.findings, report.findings[0].message
    assert report.explained and all("rule 1 of test-deviations.toml (bug)" in k for k in report.explained)
    # and without the rule the same search reports it as new
    plain = engine.fuzz_formula(w.adapter(), "adv.group_normalized", "float64", budget=15, seed=0, max_examples=200,
                                database=False)
    assert plain.findings and not plain.explained


def test_a_rule_declared_for_corpus_cases_only_is_named_but_does_not_declare_the_finding():
    """A rule scoped to corpus case IDs never matches a fuzz example: the finding stays new, and says
    which rule would explain it were it declared for the formula."""
    w = wrong_adapters.BY_NAME["bessel-std"]
    adapter = w.adapter()
    adapter.deviations = parse({"rule": [{
        "ids": ["adv.group_normalized/some-corpus-case"], "kind": "bug", "cause": "wrong-formula",
        "reason": "the test's adapter always takes the Bessel std", "link": "https://example.org/bessel#L1"}]},
        "test-deviations.toml")
    report = engine.fuzz_formula(adapter, "adv.group_normalized", "float64", budget=15, seed=0, max_examples=200,
                                 database=False)
    assert report.findings and not report.explained
    assert report.findings[0].fits["declaration"] == "rule 1" and report.findings[0].fits["source"] == \
        "test-deviations.toml"


def test_a_rerun_replays_the_counterexample_from_the_example_database(tmp_path, monkeypatch):
    monkeypatch.setenv("PGSPEC_CACHE", str(tmp_path))
    w = wrong_adapters.BY_NAME["bessel-std"]
    first = engine.fuzz_formula(w.adapter(), "adv.group_normalized", "float64", budget=15, seed=0, max_examples=200)
    assert first.findings and list((tmp_path / "fuzz").iterdir())
    # one new example allowed, another seed: only the database's replay can find it
    again = engine.fuzz_formula(w.adapter(), "adv.group_normalized", "float64", budget=15, seed=7, max_examples=1)
    assert again.findings and again.findings[0].inputs == first.findings[0].inputs
    fresh = engine.fuzz_formula(w.adapter(), "adv.group_normalized", "float64", budget=15, seed=7, max_examples=1,
                                database=False)
    assert not fresh.findings


def test_save_writes_a_case_the_generator_accepts(tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent / "fixtures"))
    code = main(["fuzz", "--adapter", "wrong_adapters:exp_of_sum", "--formulas", "ratio.sequence_geometric",
                 "--dtype", "fp64", "--examples", "200", "--budget", "60s", "--no-database", "--save", str(tmp_path),
                 "--json", str(tmp_path / "report.json")])
    out = capsys.readouterr().out
    assert code == 1, out
    assert "NEW fail: ratio.sequence_geometric (float64)" in out and "replay:   pgspec fuzz" in out
    (path,) = tmp_path.glob("fuzz_*.py")
    spec = importlib.util.spec_from_file_location("saved_cases", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    cases = module.cases()
    doc = json.loads((tmp_path / "report.json").read_text())
    assert [c.id for c in cases] == [f["case_id"] for f in doc["reports"][0]["findings"]]
    for case in cases:
        case.check()
        record = generate_case(case)        # the generator computes its golden values
        loaded = {**record, "family": "ratio"}
        assert runner.run_case(wrong_adapters.BY_NAME["exp-of-sum"].adapter(), loaded, "float64",
                               "cpu").outcome == "fail"
        assert runner.run_case(runner.load_adapter("torch"), loaded, "float64", "cpu").outcome == "pass"


def test_the_built_in_backend_passes_a_short_seeded_fuzz(capsys):
    code = main(["fuzz", "--formulas", "kl.*,adv.*,agg.token_mean,surrogate.ppo_clip,loss.grpo", "--dtype", "fp64",
                 "--examples", "25", "--seed", "0", "--no-database"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.strip().splitlines()[-1].startswith("pgspec fuzz torch: 12 formulas x 1 dtypes, ")


@pytest.mark.parametrize("argv,message", [
    (["--adapter", "nosuch"], "unknown adapter 'nosuch'"),
    (["--formulas", "kll.*"], "'kll.*' matches no formula ID"),
    (["--dtype", "fp8"], "fp8"),
    (["--budget", "ten"], "--budget: must be a duration"),
    (["--budget", "0s"], "--budget: must be a positive duration"),
    (["-n", "0"], "must be a positive integer"),
    (["--case-timeout", "0"], "--case-timeout: must be a positive number of seconds"),
    (["--case-timeout", "soon"], "--case-timeout: must be a number of seconds"),
])
def test_bad_input_exits_2_with_one_clear_line(argv, message, capsys):
    code = main(["fuzz", *argv])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err, err


def test_save_into_a_file_is_a_usage_error(tmp_path, capsys):
    target = tmp_path / "file"
    target.write_text("")
    assert main(["fuzz", "--formulas", "kl.k1", "--save", str(target)]) == 2
    assert "--save: " in capsys.readouterr().err


def _draws(fid: str, n: int = 300) -> list:
    from pgspec.conformance.corpus import strategies as pst
    from pgspec.conformance.fuzz import examples as ex

    plan = ex.Plan(fid)
    return [ex.draw(pst.SeededSource(k), plan, "float64") for k in range(n)]


@pytest.mark.parametrize("fid,name", [("agg.prompt_mean", "group_token_counts"),
                                      ("agg.document_mean", "document_token_counts")])
def test_the_fuzzer_draws_the_global_counts_of_groups_and_documents(fid, name):
    """A check of these counts inverted (agg.py's 'the same for every member of a group') rejects every
    example that gives them: the fuzzer must draw them, consistent and at or above the batch's own."""
    from pgspec.conformance.fuzz import examples as ex
    from pgspec.reference import SpecError, evaluate

    given = [e for e in _draws(fid) if e["params"].get(name) is not None]
    valid = 0
    for e in given[:60]:
        for _ in range(3):      # a parameter conflict is repaired, as the engine repairs it
            try:
                evaluate(fid, e["inputs"], e["params"], dps=15)
                valid += 1
                break
            except SpecError as err:
                if name in str(err):
                    raise AssertionError(f"{name} = {e['params'][name]} drawn outside the spec: {err}") from None
                e = ex.repaired(fid, e, str(err))     # another parameter's conflict (discarded when None)
                if e is None:
                    break
    assert valid >= 15
    assert any(e["params"][name] != _local_counts(fid, e["inputs"]) for e in given)   # above the local count too


def _local_counts(fid, inputs):
    mask = inputs["mask"]
    if fid == "agg.prompt_mean":
        per = {}
        for g, row in zip(inputs["group_ids"], mask):
            per[g] = per.get(g, 0) + sum(row)
        return [per[g] for g in inputs["group_ids"]]
    per = {}
    for ids, row in zip(inputs["document_ids"], mask):
        for d, m in zip(ids, row):
            if m:
                per[d] = per.get(d, 0) + 1
    return [[per[d] if m else None for d, m in zip(ids, row)] for ids, row in zip(inputs["document_ids"], mask)]


def test_the_fuzzer_draws_the_entropy_quantiles_tie_window_edge():
    """h = (1 - rho)(n - 1) within 2^-44 (n - 1) of an integer is that integer (spec/mask.md): some levels
    must put h exactly on that window's (closed) edge, where an open window decides otherwise, and some
    just outside it, where a window one token wider (2^-44 (n + 1)) decides otherwise."""
    from fractions import Fraction

    on, outside = 0, 0
    for e in _draws("mask.entropy_quantile"):
        rho = e["params"].get("top_entropy_quantile")
        n = sum(bool(m) for row in e["inputs"]["mask"] for m in row)
        if rho is None or n < 3:
            continue
        h = (1 - Fraction(rho)) * (n - 1)
        off = abs(h - round(h))
        on += off == Fraction(n - 1, 2 ** 44)
        outside += Fraction(n - 1, 2 ** 44) < off < Fraction(n + 1, 2 ** 44)
    assert on >= 3 and outside >= 10


def test_the_fuzzer_draws_the_entropy_quantiles_tie_window_for_two_tokens():
    """With n = 2 the window is 2^-44 max(n - 1, 1) = 2^-44: levels just outside it (h = k +- 2^-43, k = 0
    or 1) are where a window of 2^-44 max(n - 1, 2) would decide otherwise."""
    from fractions import Fraction

    edge = 0
    for e in _draws("mask.entropy_quantile", 600):
        rho = e["params"].get("top_entropy_quantile")
        if rho is None or sum(bool(m) for row in e["inputs"]["mask"] for m in row) != 2:
            continue
        assert 0 <= rho <= 1
        h = 1 - Fraction(rho)
        edge += abs(h - round(h)) == Fraction(2, 2 ** 44)
    assert edge >= 3


def _tokens(e):
    inputs = e["inputs"]
    return [(b, t) for b, row in enumerate(inputs["mask"]) for t, m in enumerate(row) if m]


def test_the_fuzzer_draws_log_ratios_of_exactly_one_and_past_floats_exp_overflow():
    """x = l_ref - l = 1 exactly (a comparison with the constant 1 instead of 0), and w = e^(l - l_old)
    past float64's overflow (709.78) at an on-reference token, where w k3 = w * 0 must be selected as
    0, never formed as inf * 0: the 1/64 grid of the strategies reaches neither in a search's time."""
    one = overflow = 0
    for e in _draws("kl.k3_unbiased", 400):
        i = e["inputs"]
        for b, t in _tokens(e):
            x = i["ref_logprobs"][b][t] - i["logprobs"][b][t]
            one += x == 1
            overflow += x == 0 and i["logprobs"][b][t] - i["old_logprobs"][b][t] > 709.78
            assert max(i[n][b][t] for n in ("logprobs", "old_logprobs", "ref_logprobs")) <= 0
    assert one >= 3 and overflow >= 1


def test_the_fuzzer_draws_more_documents_than_the_longest_has_tokens():
    """Per-document slots numbered by (document, rank) collide when numbered wrongly only where there are
    more documents than the longest has tokens (3 or more: ranks 0 and 1 share a first slot)."""
    from collections import Counter

    many = 0
    for e in _draws("agg.document_mean", 300):
        ids = [d for row in e["inputs"]["document_ids"] for d in row]
        assert ids == sorted(ids)       # contiguous documents, increasing and global across rows
        n = Counter(ids)
        many += len(n) > max(n.values()) >= 3
    assert many >= 20


def _swallows_bad_input(fid):
    """An implementation that returns zeros wherever the built-in one rejects its input."""
    import torch

    from pgspec.adapters.torch import agg as good_agg
    from pgspec.reference import SpecError

    def impl(inputs, params):
        try:
            return good_agg.IMPLEMENTATIONS[fid](inputs, params)
        except SpecError:
            return {"value": torch.zeros((), dtype=torch.float64, requires_grad=True)}
    return Adapter("swallows-bad-input", "test", "0", implementations={fid: impl})


def test_invalid_examples_are_judged_as_expected_errors_not_as_findings():
    """One example in BAD_INPUT is broken in one of the corpus's expected-error classes (applied to the
    drawn example): the built-in backend rejects every one; an implementation that returns on them is
    counted `not-rejected` (validation, its own axis), with examples the built-in backend rejects, and
    no finding."""
    from pgspec.conformance.fuzz import judge

    fid = "agg.sample_mean"
    good = engine.fuzz_formula(runner.load_adapter("torch"), fid, "float64", budget=30, seed=0, max_examples=200,
                               database=False)
    assert good.rejected >= 5 and good.not_rejected == 0 and not good.findings
    bad = engine.fuzz_formula(_swallows_bad_input(fid), fid, "float64", budget=30, seed=0, max_examples=200,
                              database=False)
    assert bad.not_rejected >= 5 and not bad.findings, bad.findings[:1]
    for e in bad.not_rejected_examples:
        example = {"params": e["params"], "inputs": e["inputs"],
                   "expect_error": {"argument": e["argument"], "rule": e["rule"]}}
        assert judge.confirm(runner.load_adapter("torch"), fid, example, "float64").outcome == "rejected"
    without = engine.fuzz_formula(_swallows_bad_input(fid), fid, "float64", budget=30, seed=0, max_examples=200,
                                  database=False, bad_input=False)
    assert without.rejected == without.not_rejected == 0


def test_an_implementation_that_hangs_on_one_regime_is_reported_not_waited_for():
    """A call past --case-timeout is the example's error (a counterexample, left unshrunk), and the search
    goes on; without the limit this search would never end."""
    import time

    from pgspec.adapters.torch import kl as good_kl
    from pgspec.conformance.run.untrusted import TIMED_OUT, case_timeout

    def hangs_on_two_rows(inputs, params):
        while inputs["mask"].shape[0] >= 2:      # BUG: an endless loop in one regime
            time.sleep(0.01)
        return good_kl.IMPLEMENTATIONS["kl.k1"](inputs, params)

    adapter = Adapter("hangs", "test", "0", implementations={"kl.k1": hangs_on_two_rows})
    with case_timeout(0.5, "--case-timeout"):
        report = engine.fuzz_formula(adapter, "kl.k1", "float64", budget=5, seed=0, max_examples=60,
                                     database=False, bad_input=False)
    assert report.findings and report.findings[0].outcome == "error"
    assert TIMED_OUT in report.findings[0].message and "--case-timeout" in report.findings[0].message
