"""Every citation in the spec must be checkable by a reader who has only the repository and the web.

A spec page may cite (a) a public URL, (b) a file of this repository (a relative link or a
backticked path that exists), or (c) a paper by its arXiv identifier and equation. It may not cite
a file outside the repository (the research notes the spec was first written from, cited as
``notes.md §2.3``), and a link into a GitHub repository must pin the code it points at: a full
commit hash or a release tag, never a moving branch such as ``main``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "spec"
PAGES = sorted(SPEC.glob("*.md"))

# Research notes that lived beside the project while the spec was drafted; they are not in the
# repository, so no page may send a reader to them.
OUTSIDE_NOTES = (
    "trl_liger", "verl_openrlhf_areal_skyrl", "nemorl_slime_fastllm_megatron", "paper_verification",
    "anchors_conformance_papers", "gitonly", "seeds-review", "adapters-review", "install_probe",
    "DESIGN",
)

MD_SECTION = re.compile(r"[\w.-]+\.md`?\s*§")                  # `notes.md` §2.3, notes.md §2
RESEARCH_SECTION = re.compile(r"\bresearch\b[^.\n]{0,40}(§|\]\(|`)", re.I)  # "research §9.1", "research [..](..)", "research `x`"
NOTE_NAME = re.compile(r"\b(" + "|".join(re.escape(n) for n in OUTSIDE_NOTES) + r")(\.md)?\b")
MD_LINK = re.compile(r"\]\(([^)\s]+)\)")
BACKTICK_MD = re.compile(r"`([\w./-]+\.md)`")
BACKTICK_PATH = re.compile(r"`([\w.-]+(?:/[\w.-]+)+\.(?:py|sh|yaml|yml|toml|json|cfg|txt|ipynb))`")
LINKED_TEXT = re.compile(r"\[[^\]]*\]\(https?://[^)\s]+\)")
GITHUB_REF = re.compile(
    r"https?://(?:github\.com/[\w.-]+/[\w.-]+/(?:blob|tree|raw)|raw\.githubusercontent\.com/[\w.-]+/[\w.-]+)"
    r"/([^/\s)#]+)"
)
FULL_SHA = re.compile(r"[0-9a-f]{40}")
RELEASE_TAG = re.compile(r"(?:[A-Za-z][\w.]*-)?v?\d+(?:\.\d+)+(?:[.-]?(?:post|rc|a|b)\d*)?")


def problems(text: str, page: Path) -> list[str]:
    """Every citation on one page that a reader could not follow, as 'line N: why: excerpt'."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        def bad(why: str, what: str) -> None:
            found.append(f"{page.name}:{number}: {why}: {what[:120]}")

        for m in MD_SECTION.finditer(line):
            bad("section of a Markdown file cited outside the repository", m.group(0))
        for m in RESEARCH_SECTION.finditer(line):
            bad("section of unpublished research cited", m.group(0))
        for m in NOTE_NAME.finditer(line):
            bad("research note that is not in the repository", m.group(0))
        for m in GITHUB_REF.finditer(line):
            ref = m.group(1)
            if not (FULL_SHA.fullmatch(ref) or RELEASE_TAG.fullmatch(ref)):
                bad(f"GitHub link on a moving or unpinned ref {ref!r} (use a full commit or a release tag)", m.group(0))
        for m in MD_LINK.finditer(line):
            target = m.group(1)
            if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue
            path = (page.parent / target.split("#", 1)[0]).resolve()
            if not path.exists():
                bad("relative link to a file that is not in the repository", target)
        for m in BACKTICK_PATH.finditer(LINKED_TEXT.sub("", line)):
            name = m.group(1)
            if not (ROOT / name).exists():
                bad("file path outside the repository without a link to it", name)
        for m in BACKTICK_MD.finditer(line):
            name = m.group(1)
            if not any((base / name).exists() for base in (page.parent, ROOT, ROOT / "docs")):
                bad("Markdown file named that is not in the repository", name)
    return found


def test_pages_exist():
    assert len(PAGES) >= 10


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_citation_is_checkable(page):
    assert problems(page.read_text(encoding="utf-8"), page) == []


@pytest.mark.parametrize(
    "line",
    [
        "TRL does not clamp (research `trl_liger.md` §2.3).",
        "the invariant (research §9.1)",
        "Research [TRL](https://github.com/huggingface/trl/blob/v1.16.0/trl/trainer/grpo_trainer.py#L1).",
        "see nemorl_slime_fastllm_megatron.md for the layout",
        "[code](https://github.com/volcengine/verl/blob/main/verl/trainer/ppo/core_algos.py#L10)",
        "[code](https://github.com/huggingface/trl/blob/master/trl/trainer/grpo_trainer.py#L3083)",
        "[code](https://github.com/huggingface/trl/blob/f2cd577/trl/trainer/grpo_trainer.py#L3083)",
        "[code](https://raw.githubusercontent.com/THUDM/slime/HEAD/slime/utils/ppo_utils.py)",
        "[notes](../research/notes.md)",
        "as `somewhere-else.md` says",
        "the runs use 3000 (`understand-r1-zero/examples/qwen2.5-math-7b.sh`)",
    ],
)
def test_checker_flags_uncheckable_citations(line):
    assert problems(line, SPEC / "ratio.md"), line


@pytest.mark.parametrize(
    "line",
    [
        "[TRL](https://github.com/huggingface/trl/blob/v1.16.0/trl/trainer/grpo_trainer.py#L3083-L3095)",
        "[SkyRL](https://github.com/NovaSky-AI/SkyRL/blob/ce6def0e8f996eb823de4f10d1c0d1528c9a2f6b/skyrl-train/x.py#L1)",
        "[DAPO Eq. 8](https://arxiv.org/abs/2503.14476), DAPO §4.1, PPO paper §6",
        "see {ref}`agg.token_mean` and [conventions](conventions.md)",
        "[issue](https://github.com/THUDM/slime/issues/2060)",
        "the reference (`reference/kl.py`) and [`trl/trainer/grpo_trainer.py`](https://github.com/huggingface/trl/blob/v1.16.0/trl/trainer/grpo_trainer.py#L1)",
    ],
)
def test_checker_accepts_checkable_citations(line):
    assert problems(line, SPEC / "ratio.md") == []
