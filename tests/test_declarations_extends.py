"""A declarations file that extends another (spec/verdicts.md, "Extending a file"): the merge, the
relinking of inherited links, and the errors, each naming the file, the line and the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from pgspec.conformance.verdicts.declarations import MAX_DECLARATIONS, DeclarationError, load

ADAPTERS = Path(__file__).resolve().parent.parent / "adapters"
BASE_COMMIT = "https://example.invalid/org/repo/blob/aaaa/"
HEAD_COMMIT = "https://example.invalid/org/repo/blob/bbbb/"

BASE = f"""
[[unsupported]]
name = "no-logprob"
formulas = ["logprob.*"]
reason = "no log-probs"
link = "{BASE_COMMIT}loss.py#L10"

[[capability]]
name = "no-clamp"
formulas = ["surrogate.ppo_clip"]
params = {{ log_ratio_clamp = ["null"] }}
reason = "never clamps"
link = "{BASE_COMMIT}loss.py#L20-L22"

[[rule]]
name = "k3-eps"
ids = ["kl.k3"]
kind = "convention"
cause = "formula-variant"
reason = "an epsilon"
link = "{BASE_COMMIT}kl.py#L5"

[[rule]]
ids = ["kl.k1"]
kind = "bug"
cause = "wrong-formula"
reason = "a bug"
link = "{BASE_COMMIT}kl.py#L9"
"""

RELINK = f'\n[relink]\n"{BASE_COMMIT}" = "{HEAD_COMMIT}"\n'


def files(tmp_path, child: str, base: str = BASE) -> Path:
    (tmp_path / "deviations.toml").write_text(base)
    path = tmp_path / "deviations-pr1.toml"
    path.write_text(child)
    return path


def test_an_extending_file_inherits_everything_in_order_with_relinked_links(tmp_path):
    d = load(files(tmp_path, 'extends = "deviations.toml"\n' + RELINK))
    base = load(tmp_path / "deviations.toml")
    assert [x.ids for x in d.all()] == [x.ids for x in base.all()]
    assert [x.reason for x in d.all()] == [x.reason for x in base.all()]
    # the prefix moves to the extending file's revision; the base revision's line anchor is dropped
    assert [x.link for x in d.all()] == [f"{HEAD_COMMIT}loss.py", f"{HEAD_COMMIT}loss.py", f"{HEAD_COMMIT}kl.py",
                                         f"{HEAD_COMMIT}kl.py"]
    assert {x.source for x in d.all()} == {str(tmp_path / "deviations-pr1.toml")}
    assert [x.position for x in d.rules] == [1, 2]


def test_without_relink_the_inherited_links_are_kept(tmp_path):
    d = load(files(tmp_path, 'extends = "deviations.toml"\n'))
    assert [x.link for x in d.all()] == [x.link for x in load(tmp_path / "deviations.toml").all()]


def test_the_longest_relink_prefix_wins(tmp_path):
    child = (f'extends = "deviations.toml"\n[relink]\n"{BASE_COMMIT}" = "{HEAD_COMMIT}"\n'
             f'"{BASE_COMMIT}kl.py" = "{HEAD_COMMIT}new/kl2.py"\n')
    d = load(files(tmp_path, child))
    assert [x.link for x in d.rules] == [f"{HEAD_COMMIT}new/kl2.py"] * 2
    assert d.unsupported[0].link == f"{HEAD_COMMIT}loss.py"


def test_drop_replace_and_insert(tmp_path):
    child = f"""extends = "deviations.toml"
drop = ["no-clamp"]
{RELINK}
[[unsupported]]
before = "no-logprob"
formulas = ["surrogate.cispo"]
reason = "no CISPO yet"
link = "{HEAD_COMMIT}loss.py#L1"

[[rule]]
replaces = "k3-eps"
ids = ["kl.k3"]
kind = "bug"
cause = "wrong-formula"
reason = "the epsilon is now wrong"
link = "{HEAD_COMMIT}kl.py#L7"

[[rule]]
after = "k3-eps"
ids = ["kl.k2"]
kind = "convention"
cause = "formula-variant"
reason = "new at the head"
link = "{HEAD_COMMIT}kl.py#L8"

[[rule]]
ids = ["kl.k3_unbiased"]
kind = "convention"
cause = "formula-variant"
reason = "appended"
link = "{HEAD_COMMIT}kl.py#L9"
"""
    d = load(files(tmp_path, child))
    assert [x.ids for x in d.unsupported] == [("surrogate.cispo",), ("logprob.*",)]
    assert d.unsupported[0].link == f"{HEAD_COMMIT}loss.py#L1"      # its own link is kept as written
    assert d.capabilities == []
    assert [(x.ids, x.kind, x.reason) for x in d.rules] == [
        (("kl.k3",), "bug", "the epsilon is now wrong"), (("kl.k2",), "convention", "new at the head"),
        (("kl.k1",), "bug", "a bug"), (("kl.k3_unbiased",), "convention", "appended")]
    assert [x.position for x in d.rules] == [1, 2, 3, 4]


def test_a_chain_of_extensions_resolves_in_order(tmp_path):
    files(tmp_path, f'extends = "deviations.toml"\ndrop = ["k3-eps"]\n{RELINK}')
    (tmp_path / "deviations-pr2.toml").write_text(
        f'extends = "deviations-pr1.toml"\n[relink]\n"{HEAD_COMMIT}" = "https://example.invalid/org/repo/blob/cccc/"\n')
    d = load(tmp_path / "deviations-pr2.toml")
    assert [x.ids for x in d.rules] == [("kl.k1",)]
    assert d.rules[0].link == "https://example.invalid/org/repo/blob/cccc/kl.py"


@pytest.mark.parametrize("child, message", [
    ('extends = "nope.toml"\n', r"deviations-pr1.toml: extends = 'nope.toml': no such file"),
    ('extends = 3\n', r"deviations-pr1.toml: extends must be the path of one declarations file"),
    ('extends = "deviations.toml"\ndrop = ["ghost"]\n', r"drop: no inherited declaration is named 'ghost'"),
    ('extends = "deviations.toml"\n[[rule]]\nname = "k3-eps"\nids = ["kl.k3"]\nkind = "bug"\ncause = "wrong-formula"\nreason = "r"\n'
     'link = "l"\n', r"deviations-pr1.toml, line 2: \[\[rule\]\] #1: name 'k3-eps' overrides the inherited "
                     r"\[\[rule\]\] at .*deviations.toml, line \d+; write replaces = 'k3-eps'"),
    ('extends = "deviations.toml"\n\n[[rule]]\nreplaces = "no-clamp"\nids = ["kl.k3"]\nkind = "bug"\ncause = "wrong-formula"\nreason = "r"\n'
     'link = "l"\n', r"deviations-pr1.toml, line 3: \[\[rule\]\] #1: replaces = 'no-clamp': no \[\[rule\]\] of "
                     r"that name \(it is a \[\[capability\]\]\)"),
    ('extends = "deviations.toml"\n[[rule]]\nafter = "k3-eps"\nbefore = "k3-eps"\nids = ["kl.k3"]\nkind = "bug"\ncause = "wrong-formula"\n'
     'reason = "r"\nlink = "l"\n', r"line 2: \[\[rule\]\] #1: give one of replaces, after, before"),
    ('extends = "deviations.toml"\ndrop = ["k3-eps"]\n[[rule]]\nreplaces = "k3-eps"\nids = ["kl.k3"]\n'
     'kind = "bug"\ncause = "wrong-formula"\nreason = "r"\nlink = "l"\n', r"replaces = 'k3-eps', which this file drops"),
    ('extends = "deviations.toml"\n[[rule]]\nreplaces = "k3-eps"\nids = ["kl.k3"]\nkind = "bug"\ncause = "wrong-formula"\nreason = "r"\n'
     'link = "l"\n[[rule]]\nreplaces = "k3-eps"\nids = ["kl.k1"]\nkind = "bug"\ncause = "wrong-formula"\nreason = "r"\nlink = "l"\n',
     r"line 9: \[\[rule\]\] #2: 'k3-eps' is already replaced at .*line 2"),
    (f'extends = "deviations.toml"\n[relink]\n"https://elsewhere.invalid/" = "{HEAD_COMMIT}"\n',
     r"relink: the inherited link of \[\[unsupported\]\] at .*deviations.toml, line 2 \(.*loss.py#L10\) starts "
     r"with none of the relink prefixes"),
    ('extends = "deviations.toml"\nrelink = "x"\n', r"relink must be a table"),
    ('extends = "deviations.toml"\n[[rule]]\nreplaces = "k3-eps"\nids = ["kl.k3"]\nkind = "oops"\nreason = "r"\n'
     'link = "l"\n', r"deviations-pr1.toml, line 2: \[\[rule\]\] #1: kind must be one of"),
])
def test_a_bad_extension_names_the_file_the_line_and_the_key(tmp_path, child, message):
    with pytest.raises(DeclarationError, match=message):
        load(files(tmp_path, child))


def test_an_error_in_an_inherited_declaration_names_both_files(tmp_path):
    base = BASE.replace('kind = "bug"', 'kind = "oops"')
    with pytest.raises(DeclarationError, match=r"deviations-pr1.toml: \[\[rule\]\] #2 \(inherited from "
                                               r".*deviations.toml, line \d+\): kind must be one of"):
        load(files(tmp_path, 'extends = "deviations.toml"\n', base))


def test_a_cycle_is_an_error(tmp_path):
    (tmp_path / "a.toml").write_text('extends = "b.toml"\n')
    (tmp_path / "b.toml").write_text('extends = "a.toml"\n')
    with pytest.raises(DeclarationError, match=r"extends forms a cycle: .*a.toml -> .*b.toml -> .*a.toml"):
        load(tmp_path / "a.toml")
    (tmp_path / "c.toml").write_text('extends = "c.toml"\n')
    with pytest.raises(DeclarationError, match="extends forms a cycle"):
        load(tmp_path / "c.toml")


@pytest.mark.parametrize("text, message", [
    ('drop = ["x"]\n', "'drop' is only meaningful with extends"),
    (f'[relink]\n"{BASE_COMMIT}" = "{HEAD_COMMIT}"\n', "'relink' is only meaningful with extends"),
    ('[[rule]]\nafter = "x"\nids = ["kl.k3"]\nkind = "bug"\ncause = "wrong-formula"\nreason = "r"\nlink = "l"\n',
     r"line 1: \[\[rule\]\] #1: after only in a file with extends"),
    ('[[rule]]\nname = "a"\nids = ["kl.k3"]\nkind = "bug"\ncause = "wrong-formula"\nreason = "r"\nlink = "l"\n'
     '[[rule]]\nname = "a"\nids = ["kl.k1"]\nkind = "bug"\ncause = "wrong-formula"\nreason = "r"\nlink = "l"\n',
     r"line 8: \[\[rule\]\] #2: name 'a' is already used at .*line 1"),
])
def test_extension_keys_outside_an_extending_file_are_errors(tmp_path, text, message):
    path = tmp_path / "deviations.toml"
    path.write_text(text)
    with pytest.raises(DeclarationError, match=message):
        load(path)


def test_the_declaration_limit_counts_the_resolved_file(tmp_path):
    one = '[[unsupported]]\nformulas = ["kl.k3"]\nreason = "r"\nlink = "l"\n'
    half = MAX_DECLARATIONS // 2 + 1
    (tmp_path / "deviations.toml").write_text(one * half)
    path = tmp_path / "deviations-pr1.toml"
    path.write_text('extends = "deviations.toml"\n' + one * half)
    assert len(load(tmp_path / "deviations.toml")) == half
    with pytest.raises(DeclarationError, match=f"deviations-pr1.toml: {2 * half} declarations; at most"):
        load(path)


@pytest.mark.parametrize("path", sorted(str(p.relative_to(ADAPTERS)) for p in ADAPTERS.glob("*/deviations-pr*.toml")))
def test_every_per_revision_file_is_valid_and_links_only_its_revision(path):
    """The per-revision files extend their adapter's deviations.toml; resolved, each is valid against
    the corpus, and every link (inherited ones relinked) names the revision's commit, none main's."""
    import tomllib

    from pgspec.conformance.corpus import golden
    from pgspec.conformance.run.properties import PROPERTIES

    full = ADAPTERS / path
    data = tomllib.loads(full.read_text())
    assert data.get("extends") == "deviations.toml"
    d = load(full)
    assert len(d) <= MAX_DECLARATIONS
    props = [f"{pid}/{fid}" for pid, prop in PROPERTIES.items() for fid in prop.formulas]
    d.check_against_corpus(golden.load_all(), ("float64", "float32", "bfloat16"), props)
    heads = set(data["relink"].values())
    commits = {h.split("/blob/")[1].split("/")[0] for h in heads}
    assert len(commits) == 1
    base_commits = {k.split("/blob/")[1].split("/")[0] for k in data["relink"]}
    for x in d.all():
        assert x.reason and x.link
        assert f"/blob/{next(iter(commits))}/" in x.link, (x.label, x.link)
        assert not any(f"/blob/{c}/" in x.link for c in base_commits), (x.label, x.link)
