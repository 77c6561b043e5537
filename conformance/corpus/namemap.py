"""Framework presets, the name map: each framework configuration -> a spec recipe and parameter values.

One TOML file per framework in ``conformance/presets/`` (format below).  The golden generator adds
cases at every preset (``loss.<recipe>/preset-<framework>-<slug>``), so every framework has
applicable cases at its own configurations; the docs render the files as the "Framework name map"
page.

    framework = "trl"
    version = "1.16.0"                  # the tested version (or commit)
    [[preset]]
    config = 'loss_type="dapo"'         # the configuration as the framework's users write it
    recipe = "loss.dapo"                # the spec recipe ID it maps to
    params = { aggregation = "token_mean", eps_high = 0.28 }   # spec parameter values; "null" = null
    link = "https://github.com/<org>/<repo>/blob/<tag>/<path>#L<line>"
    note = "one optional line"

Parameter values are read as the framework's configuration holds them: a TOML float is its binary64
value (spec/conventions.md), ``"null"`` is the spec's null.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

PRESETS_DIR = Path(__file__).resolve().parent.parent / "presets"   # conformance/presets
_FILE_KEYS = {"framework", "version", "preset"}
_KEYS = {"config", "recipe", "params", "link", "note"}


class PresetError(ValueError):
    """A presets file is malformed (the message names the file, the preset and the key)."""


@dataclass(frozen=True)
class Preset:
    framework: str
    version: str
    config: str
    recipe: str
    params: tuple          # ((name, value), ...) sorted by name; None is null
    link: str
    note: str = ""
    source: str = ""

    @property
    def slug(self) -> str:
        """The configuration as a case-ID slug; a long one is cut and given a short digest of the whole
        configuration, so that two configurations never share a slug."""
        import hashlib

        s = re.sub(r"[^a-z0-9]+", "-", self.config.lower()).strip("-") or "default"
        if len(s) <= 56:
            return s
        return s[:47].rstrip("-") + "-" + hashlib.sha1(self.config.encode()).hexdigest()[:8]

    def params_dict(self) -> dict:
        return dict(self.params)


def _value(v):
    return None if v == "null" else v


MAX_PRESETS_BYTES = 4 << 20


def load_file(path: Path) -> list[Preset]:
    from pgspec.reference import REGISTRY, SpecError
    from pgspec.reference._evaluate import check_params

    shown = f"conformance/presets/{path.name}"
    from ..base.files import FileProblem, decode_text, read_bytes

    try:
        data = tomllib.loads(decode_text(shown, read_bytes(path, MAX_PRESETS_BYTES)))
    except FileProblem as e:        # not a regular file, too large, not UTF-8 (naming the line)
        raise PresetError(str(e).replace(str(path), shown)) from None
    except tomllib.TOMLDecodeError as e:
        raise PresetError(f"{shown}: not valid TOML: {e}") from None
    unknown = set(data) - _FILE_KEYS
    if unknown:
        raise PresetError(f"{shown}: unknown key(s) {', '.join(sorted(unknown))}; allowed: framework, version, [[preset]]")
    for key in ("framework", "version"):
        if not isinstance(data.get(key), str) or not data[key]:
            raise PresetError(f"{shown}: {key!r} must be a non-empty string")
    out = []
    for k, entry in enumerate(data.get("preset", []), 1):
        where = f"{shown}: [[preset]] #{k}"
        unknown = set(entry) - _KEYS
        if unknown:
            raise PresetError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}; allowed: {', '.join(sorted(_KEYS))}")
        for key in ("config", "recipe", "link"):
            if not isinstance(entry.get(key), str) or not entry[key]:
                raise PresetError(f"{where}: {key!r} must be a non-empty string")
        recipe = entry["recipe"]
        if recipe not in REGISTRY or not recipe.startswith("loss."):
            raise PresetError(f"{where}: recipe {recipe!r} is not a loss.* recipe ID of the registry")
        names = {p.name: p for p in REGISTRY[recipe].params}
        params = entry.get("params", {})
        if not isinstance(params, dict):
            raise PresetError(f"{where}: 'params' must be a table")
        for name in params:
            if name not in names:
                raise PresetError(f"{where}: {recipe} has no parameter {name!r}; its parameters: {', '.join(sorted(names))}")
        values = {n: _value(v) for n, v in params.items()}
        try:
            check_params(REGISTRY[recipe], values)
        except SpecError as e:  # the registry's own range error, with the preset named
            raise PresetError(f"{where}: {e}") from None
        out.append(Preset(data["framework"], data["version"], entry["config"], recipe,
                          tuple(sorted(values.items())), entry["link"], entry.get("note", ""), shown))
    return out


def load_all(directory: Path | None = None) -> list[Preset]:
    """Every preset of every framework, in a stable order (framework, then file order)."""
    out = []
    for path in sorted((directory or PRESETS_DIR).glob("*.toml")):
        out.extend(load_file(path))
    return out


def distinct(presets: list[Preset]) -> list[tuple[Preset, list[Preset]]]:
    """The presets grouped by (recipe, parameter values): the first of each group names the golden
    cases; the others map to the same cases."""
    groups: dict = {}
    for p in presets:
        groups.setdefault((p.recipe, p.params), []).append(p)
    return [(ps[0], ps) for ps in groups.values()]
