"""Where an exception raised by an adapter call comes from (spec/verdicts.md, "Validation"): the
framework's code, the adapter's own code, or pgspec's; and the record a result keeps of it (its
type, message, origin and frame), which an ``expect = "error"`` rule and a ``[[check]]`` match.
"""

from __future__ import annotations


ORIGIN_TEXT = {"framework": "the framework's code", "adapter": "the adapter's own code",
               "pgspec": "pgspec's code (not the implementation under test)",
               "unknown": "code of neither the framework nor its adapter"}


def _module_matches(name: str, prefixes) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def exception_record(e: BaseException, adapter) -> dict:
    """{"type", "message", "origin", "where"} of an exception raised by an adapter call.  ``origin``:
    the innermost frame of the traceback that belongs to the framework (a module of
    ``adapter.framework_modules``), to the adapter (its own modules: ``pgspec.adapters.<name>``, or
    the modules its class and implementations are defined in) or to pgspec; frames of other
    libraries (torch, numpy, the standard library) are passed over, so that torch raising inside a
    framework's function is the framework's.  ``where``: that frame's file and line."""
    try:
        message = str(e)
    except Exception:  # noqa: BLE001 - an exception whose str() fails is still an exception
        message = f"<{type(e).__name__} whose str() raised>"
    framework = tuple(getattr(adapter, "framework_modules", ()) or ())
    own = {type(adapter).__module__}
    impls = getattr(adapter, "implementations", None)
    if isinstance(impls, dict):
        own |= {getattr(fn, "__module__", None) or "" for fn in impls.values()}
    own = {m for m in own if m and not _module_matches(m, framework)}
    origin, where = "unknown", "?"
    tb = e.__traceback__
    frames = []
    while tb is not None:
        frames.append(tb)
        tb = tb.tb_next
    for t in reversed(frames):
        name = t.tb_frame.f_globals.get("__name__", "") or ""
        if _module_matches(name, framework):
            kind = "framework"
        elif name.startswith("pgspec.adapters.") and name != "pgspec.adapters.base" or name in own:
            kind = "adapter"
        elif name == "pgspec" or name.startswith("pgspec."):
            kind = "pgspec"
        else:
            continue
        origin, where = kind, f"{_short_path(t.tb_frame.f_code.co_filename)}:{t.tb_lineno}"
        break
    return {"type": type(e).__name__, "message": message[:2000], "origin": origin, "where": where}


def _short_path(path: str) -> str:
    """A frame's file from its package down (``trl/trainer/grpo_trainer.py``), not the machine's path."""
    parts = path.replace("\\", "/").split("/")
    for anchor in ("site-packages", "dist-packages"):
        if anchor in parts:
            return "/".join(parts[len(parts) - parts[::-1].index(anchor):])
    for anchor in ("adapters", "conformance", "reference"):
        if anchor in parts:
            i = len(parts) - 1 - parts[::-1].index(anchor)
            return "/".join(parts[i:])
    return "/".join(parts[-3:])
