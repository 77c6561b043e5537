"""Framework presets (the name map): the file format, and golden cases at every preset."""

from __future__ import annotations

import pytest

from pgspec.conformance.corpus import golden, namemap

LINK = "https://example.invalid/x#L1"


def write(tmp_path, text, name="fw.toml"):
    (tmp_path / name).write_text(text)
    return tmp_path


@pytest.mark.parametrize("body, message", [
    ('[[preset]]\nconfig = "a"\nrecipe = "loss.nope"\nlink = "l"', "not a loss.* recipe ID"),
    ('[[preset]]\nconfig = "a"\nrecipe = "kl.k3"\nlink = "l"', "not a loss.* recipe ID"),
    ('[[preset]]\nconfig = "a"\nrecipe = "loss.dapo"\nlink = "l"\nparams = { nope = 1 }', "has no parameter 'nope'"),
    ('[[preset]]\nconfig = "a"\nrecipe = "loss.dapo"\nlink = "l"\nparams = { eps_low = 7.0 }', "eps_low"),
    ('[[preset]]\nconfig = "a"\nrecipe = "loss.dapo"', "'link' must be a non-empty string"),
    ('[[preset]]\nconfig = "a"\nrecipe = "loss.dapo"\nlink = "l"\nextra = 1', "unknown key(s) extra"),
])
def test_a_malformed_preset_names_the_file_and_the_preset(tmp_path, body, message):
    write(tmp_path, 'framework = "fw"\nversion = "1"\n' + body)
    with pytest.raises(namemap.PresetError) as e:
        namemap.load_all(tmp_path)
    assert message in str(e.value) and "fw.toml" in str(e.value)


def test_identical_presets_share_their_cases(tmp_path):
    write(tmp_path, f'''framework = "fw"
version = "1"
[[preset]]
config = "mode=a"
recipe = "loss.dapo"
params = {{ aggregation = "token_mean" }}
link = "{LINK}"
[[preset]]
config = "alias=a"
recipe = "loss.dapo"
params = {{ aggregation = "token_mean" }}
link = "{LINK}"
[[preset]]
config = "mode=b"
recipe = "loss.grpo"
params = {{ opsm_delta = "null" }}
link = "{LINK}"
''')
    groups = namemap.distinct(namemap.load_all(tmp_path))
    assert [len(same) for _, same in groups] == [2, 1]
    assert groups[1][0].params_dict() == {"opsm_delta": None}


def test_every_committed_preset_has_golden_cases():
    ids = {c["id"] for c in golden.load_all()}
    for first, same in namemap.distinct(namemap.load_all()):
        for suffix in ("batch", "random"):
            cid = f"{first.recipe}/preset-{first.framework}-{first.slug}-{suffix}"
            assert cid in ids, f"{cid} is missing from the corpus: run `pgspec golden generate`"
