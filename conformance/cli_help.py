"""The ``pgspec`` command line's help: the formatter (each option's default shown once), the
parser ('did you mean ...?' for a mistyped subcommand, option or choice), and each subcommand's
description and examples.  Split from cli.py, which keeps the commands themselves."""

from __future__ import annotations

import argparse
import re

from .base.suggest import did_you_mean


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Appends ``(default: X)`` to an option's help once, and only when its text does not already
    state its default (argparse's ArgumentDefaultsHelpFormatter added ``(default: None)`` after
    texts such as "required, no default").  A flag's default shows as off or on; an option whose
    default is None or an empty list states in its text what happens when it is not given."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "default" in text.lower() or not action.option_strings:
            return text
        default = action.default
        if default is None or default is argparse.SUPPRESS or default == []:
            return text
        if isinstance(default, bool):
            default = "on" if default else "off"
        return f"{text} (default: {str(default).replace('%', '%%')})"


_CHOICE = re.compile(r"argument (?P<arg>[^:]+): invalid choice: '(?P<got>[^']*)' \(choose from (?P<choices>.*)\)$")


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors add 'did you mean ...?' (difflib) for a mistyped subcommand,
    a choice (``--device cdua``) or an option (``--dtpye``)."""

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        self._command = getattr(namespace, "command", None)   # whose options a mistyped one is compared with
        return namespace, extras

    def _options_of(self, command):
        options = [s for a in self._actions for s in a.option_strings]
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction) and command in action.choices:
                options += [s for a in action.choices[command]._actions for s in a.option_strings]
        return options

    def error(self, message):
        m = _CHOICE.match(message)
        if m:
            choices = re.findall(r"'([^']*)'", m["choices"])
            message += did_you_mean(m["got"], choices)
        elif message.startswith("unrecognized arguments: "):
            options = self._options_of(getattr(self, "_command", None))
            for word in message[len("unrecognized arguments: "):].split():
                if word.startswith("-"):
                    hint = did_you_mean(word.split("=")[0], options, n=1)
                    if hint:
                        message += f"; {word.split('=')[0]}:{hint[1:]}"
        super().error(message)


DESCRIPTION = """\
The policy-gradient loss specification: each formula's exact definition, its golden cases, and
a conformance runner for any implementation (an adapter)."""

EPILOG = """\
examples:
  pgspec formulas --formulas 'kl.*'          the KL estimators: inputs, parameters, outputs
  pgspec run --formulas 'kl.*' --dtype fp32  run their golden cases against the built-in torch backend

Each subcommand has its own help: pgspec run --help.  Exit codes: 0 success, 1 conformance
failures, 2 a usage or input error, 3 an internal error of pgspec, 130 interrupted (Ctrl-C)."""

DTYPE_NOTE = "dtypes: float64 (alias fp64, double), float32 (fp32), bfloat16 (bf16), float16 (fp16, half)"

SUBCOMMANDS = {
    "formulas": dict(
        help="list the formula registry",
        description="List the formulas of the specification: each one's ID and title, inputs (* differentiable, "
                    "? optional),\nparameters with their defaults, and outputs (the names an adapter returns).",
        epilog="""\
examples:
  pgspec formulas --formulas 'kl.*,loss.grpo'
  pgspec formulas --json --formulas ratio.token   ranges, outputs and spec anchors as JSON"""),
    "golden": dict(
        help="generate, verify or measure the golden corpus",
        description="The golden corpus (conformance/golden/*.json): write it from the mpmath reference, verify that "
                    "the\nfiles are byte-identical to what the generator gives now, or show which side of each "
                    "bounding\nparameter binds in which cases.  Ctrl-C stops at once (exit 130).",
        epilog="""\
examples:
  pgspec golden verify              unchanged cases come from the record cache: seconds
  pgspec golden verify --no-cache   every case evaluated again (about a minute on 2 cores)"""),
    "run": dict(
        help="run the conformance suite against an adapter",
        description="Run the golden cases of the selected formulas against an adapter in each dtype, then the "
                    "property\nchecks (spec/properties.md); print the table of verdicts and write reports.  Exit 0 "
                    "when every\ncase passes or fails as the adapter declares, 1 otherwise, 2 on a usage error.\n"
                    + DTYPE_NOTE,
        epilog="""\
examples:
  pgspec run --formulas 'kl.*' --dtype fp32,bf16 --no-properties
  pgspec run --adapter my_adapter:adapter --report md:report.md   your adapter, from the current folder"""),
    "adapters": dict(
        help="list adapters with availability, version and install commands",
        description="List the built-in adapters: whether each framework is installed here, its version, how many "
                    "formulas\nand declarations the adapter has, and the install command of each missing one.",
        epilog="""\
examples:
  pgspec adapters
  pgspec run --adapter trl --formulas 'loss.*'   then run one of them"""),
    "check": dict(
        help="check a formula at production size against the float64 oracle",
        description="Check an adapter's formula at the size it runs at: seeded inputs of shape BxT, the adapter in "
                    "its\ndtype against the built-in torch backend in float64 (the oracle), with the same tolerance "
                    "model.\n" + DTYPE_NOTE,
        epilog="""\
examples:
  pgspec check --list
  pgspec check --formula loss.grpo --shape 8x4096 --dtype bf16,fp32 --adapter liger"""),
    "fuzz": dict(
        help="search an adapter for disagreements the golden corpus does not hold",
        description="Draw parameters and inputs for each formula the adapter implements (its capabilities, the "
                    "kinks and\nbounds of every parameter, empty rows, NaN at masked positions), judge the adapter "
                    "against the\nfloat64 oracle, confirm each disagreement with the mpmath reference and the "
                    "adapter's declarations,\nand shrink each new one to a minimal example.  Exit 0 when none is "
                    "found, 1 otherwise, 2 on a\nusage error.  " + DTYPE_NOTE,
        epilog="""\
examples:
  pgspec fuzz --formulas 'kl.*' --budget 1m
  pgspec fuzz --adapter trl --formulas 'loss.*' --budget 10m -n 2 --save found/   keep what it finds"""),
}
