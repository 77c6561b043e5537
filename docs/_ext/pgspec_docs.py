"""pgspec's own Sphinx directives: everything on the site that comes from code is made by the build.

- ``pgspec-plot NAME``: a figure computed from the mpmath reference (``pgspec.reference.evaluate``)
  with matplotlib (Agg), written into the build's ``_static/pgspec-plots/``.
- ``pgspec-formula-conformance FAMILY``: one section per formula of a family: the defining
  equation (taken from the spec page) beside its conformance row across frameworks, read from
  ``docs/conformance/verdicts.json`` (config ``pgspec_verdicts``).  Each section is a label
  ``conformance-<formula id>`` (``{ref}`` target; the HTML anchor is ``conformance-<id, dots as dashes>``).
- ``pgspec-name-map``: the framework name map from ``conformance/presets/*.toml`` (config
  ``pgspec_presets``).
- ``pgspec-example-module FILE``: a Python module shown as code and written into the build's
  example folder; ``pgspec-command``: a ``pgspec``/``pytest`` command run in that folder, its real
  output shown, and its exit status checked (``:returncode:``).  The adapter guide's example is
  therefore executed by every build: a change that breaks it fails the build.

When the verdicts or presets files are absent the pages say so plainly; the build does not fail.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from docutils import nodes
from docutils.parsers.rst import directives
from sphinx.addnodes import pending_xref
from sphinx.errors import ExtensionError
from sphinx.util.docutils import SphinxDirective

ROOT = Path(__file__).resolve().parents[2]
PLOT_DIR = "_static/pgspec-plots"
PLOT_DPS = 20  # the reference at low precision: plenty for a picture, and fast


# ------------------------------------------------------------------------------------------------
# plots


def _mp_float(x):
    return float(x) if x is not None else float("nan")


def plot_is_weight(plt):
    """Sequence IS weight: exp(sum of per-token log mismatches) vs exp(mean), against length."""
    from pgspec.reference import evaluate

    lengths = [2 ** k for k in range(0, 13)]  # 1 .. 4096 tokens
    T = max(lengths)
    mask = [[t < L for t in range(T)] for L in lengths]
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    for delta, color in ((0.01, "tab:red"), (-0.01, "tab:blue")):
        inputs = {"old_logprobs": [[delta] * T for _ in lengths], "sampler_logprobs": [[0.0] * T for _ in lengths],
                  "mask": mask}
        prod = evaluate("is.sequence.truncate", inputs, dps=PLOT_DPS)["seq_ratio"]
        geo = evaluate("is.geometric.truncate", inputs, dps=PLOT_DPS)["seq_ratio"]
        sign = "+" if delta > 0 else "-"
        ax.plot(lengths, [_mp_float(x) for x in prod], "o-", color=color,
                label=f"exp(sum)  (is.sequence.*), per-token log mismatch {sign}0.01")
        ax.plot(lengths, [_mp_float(x) for x in geo], "s--", color=color, alpha=0.7,
                label=f"exp(mean) (is.geometric.*), per-token log mismatch {sign}0.01")
    ax.axhline(2.0, color="gray", linestyle=":", linewidth=1)
    ax.text(1.1, 2.3, "c_max = 2 (default truncation)", color="gray", fontsize=8)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length (tokens)")
    ax.set_ylabel("sequence importance weight")
    ax.set_title("Sequence IS weight at a fixed per-token mismatch log pi_old - log mu")
    ax.legend(fontsize=7.5, loc="upper left")
    ax.grid(alpha=0.3)
    return fig


SURROGATES = [
    ("surrogate.ppo_clip", "PPO clip (eps 0.2)", "tab:blue", "-"),
    ("surrogate.dual_clip", "dual clip (c = 3)", "tab:orange", "--"),
    ("surrogate.cispo", "CISPO (eps_high 0.2)", "tab:green", "-."),
    ("surrogate.sapo", "SAPO (tau 1 / 1.05)", "tab:red", "-"),
    ("surrogate.gmpo", "GMPO (eps 0.4)", "tab:purple", ":"),
]


def plot_surrogates(plt):
    """Per-token loss and its gradient d loss / d logprob against the ratio, for A = +1 and A = -1."""
    from pgspec.reference import evaluate

    ratios = [0.25 + 0.0625 * k for k in range(61)]  # 0.25 .. 4.0 (past the dual clip at 3)
    logr = [math.log(r) for r in ratios]
    B = len(ratios)
    fig, axes = plt.subplots(2, 2, figsize=(10, 7), sharex=True)
    for col, adv in enumerate((1.0, -1.0)):
        inputs = {"logprobs": [[x] for x in logr], "old_logprobs": [[0.0]] * B, "mask": [[True]] * B,
                  "advantages": [adv] * B}
        for fid, label, color, style in SURROGATES:
            out = evaluate(fid, inputs, dps=PLOT_DPS)
            # token-level losses are [B, 1]; GMPO's is one per sequence, [B]
            loss = [_mp_float(row[0] if isinstance(row, list) else row) for row in out["loss"]]
            grad = [_mp_float(row[0]) for row in out["grad"]["logprobs"]]
            axes[0][col].plot(ratios, loss, style, color=color, label=label, linewidth=1.6)
            axes[1][col].plot(ratios, grad, style, color=color, label=label, linewidth=1.6)
        axes[0][col].set_title(f"A = {adv:+g}")
        axes[1][col].set_xlabel("ratio r = pi_theta / pi_old (one token)")
        for ax in axes[:, col] if hasattr(axes, "shape") else (axes[0][col], axes[1][col]):
            ax.axvline(1.0, color="gray", linewidth=0.8)
            ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("per-token loss")
    axes[1][0].set_ylabel("d loss / d log pi_theta")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=5, fontsize=8, frameon=False)
    fig.suptitle("Clipped surrogates against the ratio (spec defaults; CISPO's loss is -sg(w) A log pi)")
    fig.tight_layout(rect=(0, 0.05, 1, 0.97))
    return fig


def plot_kl(plt):
    """k1, k2, k3 and clamped k3 against the log-ratio x = log pi_theta - log pi_ref."""
    from pgspec.reference import evaluate

    xs = [-4 + 0.2 * k for k in range(41)]
    n = len(xs)
    inputs = {"logprobs": [xs], "ref_logprobs": [[0.0] * n], "mask": [[True] * n]}
    curves = [
        ("kl.k1", {}, "k1", "tab:blue", "-"),
        ("kl.k2", {}, "k2", "tab:orange", "-"),
        ("kl.k3", {}, "k3", "tab:green", "-"),
        ("kl.k3", {"output_max": 10}, "k3, output clamped at 10", "tab:red", "--"),
        ("kl.k3", {"log_ratio_min": -2, "log_ratio_max": 2}, "k3, log-ratio clamped to [-2, 2]", "tab:purple", ":"),
    ]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
    for fid, params, label, color, style in curves:
        out = evaluate(fid, inputs, params, dps=PLOT_DPS)
        axes[0].plot(xs, [_mp_float(v) for v in out["kl"][0]], style, color=color, label=label, linewidth=1.6)
        axes[1].plot(xs, [_mp_float(v) for v in out["grad"]["logprobs"][0]], style, color=color, label=label,
                     linewidth=1.6)
    axes[0].set_ylim(-4.5, 15)
    axes[1].set_ylim(-8, 8)
    axes[0].set_ylabel("estimator value")
    axes[1].set_ylabel("d value / d log pi_theta")
    for ax in axes:
        ax.set_xlabel("log pi_theta - log pi_ref")
        ax.axvline(0, color="gray", linewidth=0.8)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("KL estimators and their clamps (the spec's x in k3 is log pi_ref - log pi_theta)")
    fig.tight_layout()
    return fig


def plot_aggregation(plt):
    """The weight one token gets in the loss (d loss / d value) against its sequence's length."""
    from pgspec.reference import evaluate

    lengths = [16, 32, 64, 128, 256, 512, 1024, 2048]
    T = max(lengths)
    mask = [[t < L for t in range(T)] for L in lengths]
    values = [[0.0] * T for _ in lengths]
    groups = [0, 0, 0, 0, 1, 1, 1, 1]
    modes = [
        ("agg.token_mean", {}, {}, "token_mean", "tab:blue", "o-"),
        ("agg.sample_mean", {}, {}, "sample_mean", "tab:orange", "s-"),
        ("agg.constant", {"divisor": T}, {}, f"constant (K = {T})", "tab:green", "^-"),
        ("agg.prompt_mean", {}, {"group_ids": groups}, "prompt_mean (2 prompts x 4 samples)", "tab:red", "d-"),
    ]
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    for fid, params, extra, label, color, style in modes:
        out = evaluate(fid, {"values": values, "mask": mask, **extra}, params, dps=PLOT_DPS)
        weights = [_mp_float(out["grad"]["values"][i][0]) for i in range(len(lengths))]
        ax.plot(lengths, weights, style, color=color, label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("length of the token's sequence (one batch of 8 sequences, 16 .. 2048 tokens)")
    ax.set_ylabel("weight of one token (d loss / d value)")
    ax.set_title("Per-token weight of each aggregation: sample_mean down-weights long sequences")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return fig


PLOTS = {
    "is-weight": (plot_is_weight, "Sequence importance weight against length at a fixed per-token mismatch"),
    "surrogates": (plot_surrogates, "Clipped surrogates and their gradients against the ratio"),
    "kl": (plot_kl, "KL estimators k1, k2, k3 and clamped k3 against the log-ratio"),
    "aggregation": (plot_aggregation, "Per-token aggregation weights against sequence length"),
}


def write_plots(outdir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dest = outdir / PLOT_DIR
    dest.mkdir(parents=True, exist_ok=True)
    written = []
    for name, (make, _) in PLOTS.items():
        fig = make(plt)
        path = dest / f"{name}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


class PlotDirective(SphinxDirective):
    required_arguments = 1
    has_content = True

    def run(self):
        name = self.arguments[0]
        if name not in PLOTS:
            raise self.error(f"unknown pgspec plot {name!r}; known: {', '.join(PLOTS)}")
        depth = self.env.docname.count("/")
        src = "../" * depth + f"{PLOT_DIR}/{name}.png"
        alt = PLOTS[name][1]
        self.env.app._pgspec_plots_used = True
        figure = nodes.raw("", f'<figure class="pgspec-plot"><img src="{src}" alt="{alt}" loading="lazy">'
                               "</figure>", format="html")
        out = [figure]
        if self.content:
            caption = nodes.container(classes=["pgspec-plot-caption"])
            self.state.nested_parse(self.content, self.content_offset, caption)
            out.append(caption)
        return out


def _build_finished(app, exc):
    if exc is None and app.builder.format == "html":
        write_plots(Path(app.outdir))


# ------------------------------------------------------------------------------------------------
# per-formula conformance


def load_verdicts(app) -> tuple[dict | None, Path]:
    path = Path(app.config.pgspec_verdicts)
    if not path.is_absolute():
        path = Path(app.confdir) / path
    if not path.is_file():
        return None, path
    try:
        return json.loads(path.read_text()), path
    except json.JSONDecodeError as e:
        raise ExtensionError(f"{path}: not valid JSON: {e}") from None


def spec_equation(family: str, fid: str) -> str | None:
    """The first display equation ($$ ... $$) of a formula's section in spec/<family>.md."""
    path = ROOT / "spec" / f"{family}.md"
    if not path.is_file():
        return None
    text = path.read_text()
    start = text.find(f"({fid})=")
    if start < 0:
        return None
    following = re.search(r"^\(([\w.]+)\)=\s*$", text[start + 1:], re.M)
    section = text[start: start + 1 + following.start()] if following else text[start:]
    m = re.search(r"^\$\$\s*\n(.*?)\n\$\$\s*$", section, re.M | re.S)
    return m.group(1).strip() if m else None


def _ratio_text(x) -> str:
    if x is None:
        return ""
    try:
        x = float(x)
    except (TypeError, ValueError):
        return str(x)
    return "inf" if not math.isfinite(x) else f"{x:.2g}"


VERDICT_CLASS = {"pass": "pass", "fail": "fail", "error": "error", "stale": "stale", "bug": "bug",
                 "convention": "convention"}


def _para(*children):
    p = nodes.paragraph()
    p.extend(children)
    return p


def _link(text, uri):
    return nodes.reference(text, text, refuri=uri)


def _table(headers, rows, widths=None, classes=()):
    table = nodes.table(classes=list(classes))
    group = nodes.tgroup(cols=len(headers))
    table += group
    for w in widths or [1] * len(headers):
        group += nodes.colspec(colwidth=w)
    head = nodes.thead()
    group += head
    row = nodes.row()
    for h in headers:
        row += nodes.entry("", _para(nodes.Text(h)))
    head += row
    body = nodes.tbody()
    group += body
    for cells in rows:
        row = nodes.row()
        for cell in cells:
            entry = nodes.entry()
            if isinstance(cell, nodes.Node):
                entry += cell if isinstance(cell, nodes.Element) and not isinstance(cell, nodes.Inline) else _para(cell)
            elif isinstance(cell, list):
                entry += _para(*cell)
            else:
                entry += _para(nodes.Text(str(cell)))
            row += entry
        body += row
    return table


def _verdict_cell(v: dict):
    from pgspec.conformance.verdicts.cells import cell_text

    try:
        text = cell_text(v)
    except (KeyError, TypeError):
        text = str(v.get("verdict", "?"))
    cls = VERDICT_CLASS.get(v.get("verdict", ""), "other")
    return nodes.inline(text, text, classes=[f"pgspec-verdict-{cls}"])


def _counts_text(counts: dict) -> str:
    return ", ".join(f"{n} {k}" for k, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])) if n) or "-"


def _details(v: dict):
    parts = []
    if v.get("reason"):
        parts.append(nodes.Text(v["reason"]))
    for rule in v.get("rules") or []:
        if parts:
            parts.append(nodes.Text("; "))
        parts.append(nodes.strong(rule.get("kind", ""), rule.get("kind", "")))
        n = rule.get("cases", "?")
        parts.append(nodes.Text(f" ({n} case{'' if n == 1 else 's'}): {rule.get('reason', '')} "))
        link = rule.get("link", "")
        if link.startswith(("http://", "https://")):
            parts.append(_link("source", link))
        elif link:
            parts.append(nodes.literal(link, link))
    return parts or [nodes.Text("")]


def conformance_label(fid: str) -> str:
    return f"conformance-{fid}"


class FormulaConformanceDirective(SphinxDirective):
    """One section per formula of a family: definition beside the conformance row."""

    required_arguments = 1

    def run(self):
        from pgspec.conformance import check
        from pgspec.reference import REGISTRY

        family = self.arguments[0]
        formulas = [f for fid, f in sorted(REGISTRY.items()) if f.family == family]
        if not formulas:
            raise self.error(f"no formulas in family {family!r}")
        data, path = load_verdicts(self.env.app)
        self.env.note_dependency(str(path))
        out = []
        shown = os.path.relpath(path, ROOT)
        if data is None:
            out.append(nodes.admonition("", nodes.title("", "No conformance results yet"), _para(
                nodes.Text(f"The verdicts file {shown} is absent, so this page shows the definitions only. "
                           "It is written by "), nodes.literal("", "python -m pgspec.conformance.matrix"),
                nodes.Text(" from the committed conformance reports (docs/running.md, \"Framework conformance\")."))))
        frameworks = (data or {}).get("frameworks", {})
        for f in formulas:
            section_id = nodes.make_id(conformance_label(f.id))
            section = nodes.section(ids=[section_id], names=[conformance_label(f.id)])
            self.state.document.note_explicit_target(section)
            section += nodes.title("", "", nodes.literal(f.id, f.id), nodes.Text(f": {f.title}"))
            eq = spec_equation(family, f.id)
            if eq:
                section += nodes.math_block(eq, eq, nowrap=False, number=None, docname=self.env.docname)
            ref = pending_xref("", refdomain="std", reftype="ref", reftarget=f.id, refexplicit=True, refwarn=True)
            ref += nodes.inline("", "the full definition in the spec")
            section += _para(nodes.Text("Gradient, parameters, edge cases and worked example: "), ref,
                             nodes.Text("."))
            if f.id in check.ORACLE_FORMULAS:
                # the needs as a literal: they are command-line arguments (plain text would turn -- into a dash)
                section += _para(nodes.Text("At production size, against the float64 oracle: "),
                                 nodes.literal("", f"pgspec check --formula {f.id}"), nodes.Text(" (it needs "),
                                 nodes.literal("", check.oracle_needs(f.id)),
                                 nodes.Text("; "), pending_xref("", nodes.inline("", "production-size checks"), refdomain="std",
                                                                reftype="ref", reftarget="production-checks", refexplicit=True,
                                                                refwarn=True), nodes.Text(")."))
            if data is not None:
                row = data.get("formulas", {}).get(f.id, {})
                from pgspec.conformance.verdicts.cells import validation_text

                rows, lacking = [], []
                for name in sorted(frameworks):
                    fw = frameworks[name]
                    v = row.get(name)
                    version = str(fw.get("version", ""))
                    if v is None:
                        lacking.append([name, version, "not run", "", "", "", "", ""])
                        continue
                    # validation (bad input the spec rejects) is its own axis: "rejects R of E"
                    out_row = [name, version, _verdict_cell(v), _counts_text(v.get("counts", {})),
                               _ratio_text(v.get("worst_ratio")), _ratio_text(v.get("declared_worst_ratio")),
                               validation_text(v), _details(v)]
                    # the frameworks that implement the formula first, those that lack it after them
                    (lacking if v.get("verdict") == "unsupported" else rows).append(out_row)
                rows += lacking
                if rows:
                    # worst: of the results judged as they are; declared worst: of those a rule explains
                    section += _table(["framework", "version", "verdict", "cases (case, dtype)", "worst error ratio",
                                       "declared worst", "validation", "reason / declared root causes"], rows,
                                      widths=[10, 9, 11, 15, 7, 7, 9, 32], classes=["pgspec-conformance-row"])
                else:
                    section += _para(nodes.Text("No framework has results for this formula."))
            out.append(section)
        return out


# ------------------------------------------------------------------------------------------------
# the framework name map


class NameMapDirective(SphinxDirective):
    def run(self):
        from pgspec.conformance.corpus import namemap
        from pgspec.reference import REGISTRY

        directory = Path(self.config.pgspec_presets)
        if not directory.is_absolute():
            directory = Path(self.env.app.confdir) / directory
        self.env.note_dependency(str(directory))
        files = sorted(directory.glob("*.toml")) if directory.is_dir() else []
        shown = os.path.relpath(directory, ROOT)
        if not files:
            return [nodes.admonition("", nodes.title("", "No presets yet"), _para(nodes.Text(
                f"There are no framework preset files in {shown}/ yet, so the name map is empty. Each "
                "framework's configurations are declared in conformance/presets/<framework>.toml "
                "(format: pgspec.conformance.corpus.namemap).")))]
        out = []
        for path in files:
            presets = namemap.load_file(path)
            if not presets:
                continue
            head = presets[0]
            section = nodes.section(ids=[nodes.make_id(f"name-map-{head.framework}")])
            section += nodes.title("", f"{head.framework} {head.version}")
            rows = []
            for p in presets:
                recipe = [nodes.literal(p.recipe, p.recipe)]
                if p.recipe in REGISTRY:
                    ref = pending_xref("", refdomain="std", reftype="ref", reftarget=conformance_label(p.recipe),
                                       refexplicit=True, refwarn=True)
                    ref += nodes.literal(p.recipe, p.recipe)
                    recipe = [ref]
                params = []  # one literal per parameter: the cell wraps between them, never inside one
                for k, v in p.params:
                    text = f"{k}={'null' if v is None else v}"
                    params += ([nodes.Text(", ")] if params else []) + [nodes.literal(text, text)]
                link = [_link("source", p.link)] if p.link.startswith(("http://", "https://")) else \
                    [nodes.literal(p.link, p.link)]
                # the configuration wraps between its words only (an option never breaks at a hyphen)
                config = []
                for word in p.config.split(" "):
                    config += ([nodes.Text(" ")] if config else []) + [nodes.literal(word, word)]
                rows.append([config, recipe, params or "(recipe defaults)", link,
                             p.note or ""])
            section += _table(["configuration", "spec recipe", "spec parameters", "source", "note"], rows,
                              widths=[28, 14, 30, 8, 30], classes=["pgspec-name-map"])
            out.append(section)
        return out


# ------------------------------------------------------------------------------------------------
# executed examples (the adapter guide)


def example_dir(app) -> Path:
    d = getattr(app, "_pgspec_example_dir", None)
    if d is None:
        d = Path(tempfile.mkdtemp(prefix="pgspec-docs-example-"))
        app._pgspec_example_dir = d
    return d


class ExampleModuleDirective(SphinxDirective):
    """Show a Python file and write it into the example folder, where pgspec-command runs."""

    required_arguments = 1
    has_content = True

    def run(self):
        name = self.arguments[0]
        code = "\n".join(self.content) + "\n"
        (example_dir(self.env.app) / name).write_text(code)
        block = nodes.literal_block(code, code, language="toml" if name.endswith(".toml") else "python")
        caption = nodes.caption(name, "", nodes.literal(name, name))
        container = nodes.container("", caption, block, classes=["literal-block-wrapper"], literal_block=True)
        return [container]


class CommandDirective(SphinxDirective):
    """Run a ``pgspec`` or ``pytest`` command in the example folder and show its real output."""

    has_content = True
    option_spec = {"returncode": directives.nonnegative_int, "tail": directives.nonnegative_int,
                   "grep": directives.unchanged}

    def run(self):
        command = " ".join(line.strip() for line in self.content).strip()
        argv = shlex.split(command)
        if not argv or argv[0] not in ("pgspec", "pytest", "python"):
            raise self.error(f"pgspec-command runs pgspec, pytest or python commands, got {command!r}")
        cwd = example_dir(self.env.app)
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_ADDOPTS")}
        env.update(COLUMNS="92", NO_COLOR="1", TERM="dumb")
        # the console scripts as a user runs them (they do not put the current folder on sys.path);
        # the module forms only when the scripts are not beside this interpreter
        scripts = Path(sys.executable).parent
        exe = {
            "pgspec": [str(scripts / "pgspec")] if (scripts / "pgspec").exists()
            else [sys.executable, "-m", "pgspec.conformance.cli"],
            "pytest": ([str(scripts / "pytest")] if (scripts / "pytest").exists() else [sys.executable, "-m", "pytest"])
            + ["-p", "no:cacheprovider"],
            "python": [sys.executable],
        }[argv[0]]
        proc = subprocess.run(exe + argv[1:], cwd=cwd, capture_output=True, text=True, env=env, timeout=600)
        output = (proc.stdout + proc.stderr).rstrip()
        expected = self.options.get("returncode", 0)
        if proc.returncode != expected:
            raise self.error(f"the documented command {command!r} exited {proc.returncode}, the page says "
                             f"{expected}:\n{output[-3000:]}")
        lines = output.splitlines()
        if "grep" in self.options:
            keep = re.compile(self.options["grep"])
            lines = [line for line in lines if keep.search(line)]
        if "tail" in self.options:
            n = self.options["tail"]
            lines = (["..."] if len(lines) > n else []) + lines[-n:]
        text = f"$ {command}\n" + "\n".join(lines)
        return [nodes.literal_block(text, text, language="text", classes=["pgspec-command-output"])]


# The matrix page (docs/conformance/matrix.md, written by conformance/verdicts/matrix.py) is plain Markdown;
# its cells are coloured by verdict here, by a class on each cell, leaving its text as written.
MATRIX_DOCS = ("conformance/matrix",)
_MATRIX_CELL = re.compile(r"(pass|FAIL|ERROR|STALE|bug|convention|unsupported|not applicable)\b")


def _colour_matrix_cells(app, doctree, docname):
    if docname not in MATRIX_DOCS:
        return
    for entry in doctree.findall(nodes.entry):
        m = _MATRIX_CELL.match(entry.astext().strip())
        if m:
            entry["classes"].append("pgspec-cell-" + m.group(1).lower().replace(" ", "-"))


def setup(app):
    app.add_config_value("pgspec_verdicts", "conformance/verdicts.json", "env")
    app.add_config_value("pgspec_presets", str(ROOT / "conformance" / "presets"), "env")
    app.add_directive("pgspec-plot", PlotDirective)
    app.add_directive("pgspec-formula-conformance", FormulaConformanceDirective)
    app.add_directive("pgspec-name-map", NameMapDirective)
    app.add_directive("pgspec-example-module", ExampleModuleDirective)
    app.add_directive("pgspec-command", CommandDirective)
    app.connect("build-finished", _build_finished)
    app.connect("doctree-resolved", _colour_matrix_cells)
    return {"parallel_read_safe": False, "parallel_write_safe": True}
