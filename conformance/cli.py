"""The ``pgspec`` command line."""

from __future__ import annotations

import argparse
import fnmatch
import json
import sys


def _formulas(args) -> int:
    from pgspec.reference import REGISTRY

    selected = [f for fid, f in sorted(REGISTRY.items()) if fnmatch.fnmatchcase(fid, args.formulas)]
    if not selected:
        print(f"pgspec: no formula matches {args.formulas!r}; known IDs: {', '.join(sorted(REGISTRY))}",
              file=sys.stderr)
        return 2
    if args.json:
        json.dump([f.to_json() for f in selected], sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=f"pgspec formulas ({len(selected)})")
    for col in ("id", "title", "inputs", "params", "grad", "spec"):
        table.add_column(col, overflow="fold")
    for f in selected:
        table.add_row(
            escape(f.id),
            escape(f.title),
            ", ".join(i.name + ("?" if i.optional else "") for i in f.inputs),
            ", ".join(f"{p.name}={p.default!r}" for p in f.params),
            ", ".join(f.differentiable) or "-",
            f.spec,
        )
    Console().print(table)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pgspec", description="The policy-gradient loss specification.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("formulas", help="list the formula registry")
    p.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    p.add_argument("--formulas", default="*", metavar="GLOB", help="only IDs matching this glob")
    p.set_defaults(func=_formulas)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
