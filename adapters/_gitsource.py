"""Loading a framework from a git checkout the user points at (NeMo-RL, slime, Fast-LLM, Megatron-LM).

None of these frameworks ships its loss code as a package, so their adapters execute the files of a
checkout given by ``pgspec run --adapter NAME --source PATH`` or by the adapter's environment
variable (``PGSPEC_<NAME>_SOURCE``).  This module holds what the four adapters share:

- the checkout's commit (``git rev-parse HEAD``, else ``.git/HEAD``), recorded as the adapter
  version;
- the git blob ids of the files the adapter executes, compared with those of the revisions it was
  written for: a different blob still runs, and the version string names the files that differ;
- thin stand-in modules (``package_shell``, ``stand_in``) for imports of the executed files that
  the loss code never uses.  They are registered in ``sys.modules`` of the adapter's own process
  only: these adapters always run in a worker process (``pgspec.conformance.run.isolated``), so no
  stand-in reaches another adapter.

Nothing here contains or copies framework code.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import os
import subprocess
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path

from .base import Adapter


def blob_id(path: Path) -> str:
    """git's blob id of a file: sha1(b"blob <size>\\0" + content)."""
    data = Path(path).read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def git_commit(src: Path) -> str | None:
    """The checkout's HEAD commit, or None when it is not a git work tree."""
    try:
        out = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=20)
        if out.returncode == 0 and len(out.stdout.strip()) == 40:
            return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    head = Path(src) / ".git" / "HEAD"
    if head.is_file():
        ref = head.read_text().strip()
        if ref.startswith("ref: "):
            target = Path(src) / ".git" / ref[5:]
            return target.read_text().strip() if target.is_file() else None
        return ref
    return None


def git_commit_date(src: Path) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(src), "log", "-1", "--format=%cs"], capture_output=True, text=True,
                             timeout=20)
        return out.stdout.strip() or None if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


@dataclass(frozen=True)
class Revision:
    """A revision an adapter was written for: a name, its commit, and the blob of every file run."""

    name: str
    commit: str
    blobs: dict
    clone: str  # the exact commands that give this checkout


@dataclass
class SourceCheck:
    src: Path
    commit: str | None
    revision: Revision | None          # the known revision whose blobs all match, if any
    closest: Revision                  # the known revision with the most matching blobs
    differing: list = field(default_factory=list)   # files whose blob differs from `closest`
    missing: list = field(default_factory=list)

    def version(self) -> str:
        c = f"git:{self.commit[:12]}" if self.commit else "git:unknown commit"
        date = git_commit_date(self.src) if self.commit else None
        if date:
            c += f" committed {date}"
        if self.revision is not None:
            return f"{c} ({self.revision.name}, blobs verified)"
        parts = [c]
        if self.differing:
            parts.append(f"differs from tested {self.closest.name} {self.closest.commit[:8]} in " + ", ".join(self.differing))
        if self.missing:
            parts.append("missing " + ", ".join(self.missing))
        return "; ".join(parts)


def check_source(src: Path, revisions: list[Revision]) -> SourceCheck:
    src = Path(src)
    blobs = {}
    for rev in revisions:
        for rel in rev.blobs:
            p = src / rel
            if rel not in blobs:
                blobs[rel] = blob_id(p) if p.is_file() else None
    scored = []
    for rev in revisions:
        same = sum(1 for rel, b in rev.blobs.items() if blobs[rel] == b)
        scored.append((same / len(rev.blobs), rev))
    exact = [rev for score, rev in scored if score == 1.0]
    closest = max(scored, key=lambda s: s[0])[1]
    differing = [rel for rel, b in closest.blobs.items() if blobs[rel] is not None and blobs[rel] != b]
    missing = [rel for rel, b in closest.blobs.items() if blobs[rel] is None]
    return SourceCheck(src, git_commit(src), exact[0] if exact else None, closest, differing, missing)


# stand-ins ----------------------------------------------------------------------------------------

def package_shell(name: str, path: Path) -> types.ModuleType:
    """A package whose ``__init__.py`` is not executed; its real submodules import from ``path``."""
    mod = types.ModuleType(name)
    mod.__path__ = [str(path)]
    mod.__package__ = name
    mod.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
    mod.__spec__.submodule_search_locations = [str(path)]
    sys.modules[name] = mod
    parent, _, child = name.rpartition(".")
    if parent and parent in sys.modules:
        setattr(sys.modules[parent], child, mod)
    return mod


def stand_in(name: str, **attrs) -> types.ModuleType:
    """A stand-in module holding only ``attrs`` (with a real ``__spec__``: torch._dynamo looks it up)."""
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    mod.__path__ = []
    mod.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
    mod.__pgspec_stand_in__ = True
    sys.modules[name] = mod
    parent, _, child = name.rpartition(".")
    if parent and parent in sys.modules:
        setattr(sys.modules[parent], child, mod)
    return mod


class Placeholder:
    """A name that an executed file imports only for annotations or for code the loss never runs."""

    def __init__(self, *a, **k):
        pass

    def __class_getitem__(cls, item):
        return cls


def permissive_stand_in(name: str) -> types.ModuleType:
    """A stand-in module in which every name exists as a class that refuses to be called.

    For the framework's own modules that an executed file imports only for its other classes
    (tokenizers, distributed helpers, distillation utilities): importing works, using one of
    them raises, so a stand-in can never take part in a computed result."""
    mod = stand_in(name)

    def __getattr__(attr):
        if attr.startswith("__"):
            raise AttributeError(attr)

        def refuse(*a, **k):
            raise RuntimeError(f"{name}.{attr} is a pgspec stand-in: the loss path was not expected to use it")

        cls = type(attr, (Placeholder,), {"__init__": refuse, "__module__": name})
        setattr(mod, attr, cls)
        return cls

    mod.__getattr__ = __getattr__
    return mod


def not_run(name: str):
    """A function the loss code never calls; calling it says so."""

    def _f(*a, **k):
        raise RuntimeError(f"{name} is a pgspec stand-in: the loss path was not expected to call it")

    _f.__name__ = name
    return _f


# adapter base ----------------------------------------------------------------------------------------

def source_env(name: str) -> str:
    return f"PGSPEC_{name.upper()}_SOURCE"


class SourceAdapter(Adapter):
    """An adapter that executes a user's checkout.  Subclasses set ``revisions`` and ``load``."""

    requires_isolation = True
    revisions: list = []
    framework_modules: dict = {}

    def source(self) -> Path | None:
        value = os.environ.get(source_env(self.name))
        return Path(value).expanduser().resolve() if value else None

    def clone_hint(self) -> str:
        return self.revisions[0].clone

    def available(self):
        src = self.source()
        if src is None:
            return False, (f"no {self.framework} checkout: pass --source PATH or set {source_env(self.name)}; "
                           f"get it with: {self.clone_hint()}")
        if not src.is_dir():
            return False, f"{source_env(self.name)}={src} is not a directory"
        # No import here: ``pgspec adapters`` lists every adapter in one process, and the stand-ins
        # must never reach another adapter.  The framework is imported in the worker, on first use.
        check = check_source(src, self.revisions)
        if check.missing and len(check.missing) == len(check.closest.blobs):
            return False, (f"{src} is not a {self.framework} checkout (none of "
                           f"{', '.join(check.closest.blobs)} is there); get one with: {self.clone_hint()}")
        return True, ""

    def refresh_version(self):
        src = self.source()
        if src is not None and src.is_dir():
            self.check = check_source(src, self.revisions)
            self.version = self.check.version()
        return self

    def load(self):  # pragma: no cover - subclasses
        raise NotImplementedError

    def call(self, formula_id, inputs, params):
        """The implementation's outputs; in a float64 run, outputs a framework computed in float32
        (its documented precision, declared as a convention) are handed back as float64 tensors of
        the same values."""
        import torch

        out = super().call(formula_id, inputs, params)
        run64 = any(torch.is_tensor(t) and t.dtype == torch.float64 for t in inputs.values())
        if not run64 or not isinstance(out, dict):
            return out

        def up(t):
            return t.to(torch.float64) if torch.is_tensor(t) and t.is_floating_point() and t.dtype != torch.float64 else t

        return {k: ({n: up(g) for n, g in v.items()} if isinstance(v, dict) else up(v)) for k, v in out.items()}
