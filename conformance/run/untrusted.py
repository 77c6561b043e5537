"""What comes from an adapter is untrusted data (issue 39): its exceptions (even one whose ``str()``
raises), its missing dependencies, and its return values are described here in one line, for the
case's ``error`` or a start-up error; nothing an adapter does is allowed to become pgspec's own
internal error (exit 3).
"""

from __future__ import annotations

import math
import os
import traceback

# import name -> the distribution pip installs it from, where the two differ (the common ones)
PIP_NAMES = {
    "yaml": "pyyaml", "PIL": "pillow", "sklearn": "scikit-learn", "cv2": "opencv-python", "google.protobuf": "protobuf",
    "attr": "attrs", "dateutil": "python-dateutil", "omegaconf": "omegaconf", "hydra": "hydra-core",
    "git": "gitpython", "Levenshtein": "levenshtein", "bs4": "beautifulsoup4", "zmq": "pyzmq",
}


def safe_str(x, limit: int = 300) -> str:
    """``str(x)`` on one line, cut to ``limit`` characters; never raises (a ``__str__`` that raises,
    returns a non-string or recurses gives a placeholder naming the type)."""
    try:
        text = str(x)
        if not isinstance(text, str):
            raise TypeError
    except BaseException as e:  # noqa: BLE001 - whatever __str__ does, including SystemExit
        if isinstance(e, KeyboardInterrupt):
            raise
        text = f"<{type(x).__name__} whose str() raised {type(e).__name__}>"
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def describe_exception(e: BaseException) -> str:
    """``TypeName: message`` on one line (SystemExit shows its code); never raises."""
    if isinstance(e, SystemExit):
        try:
            return f"SystemExit (sys.exit({e.code!r}))"
        except Exception:  # noqa: BLE001 - a code whose repr() raises
            return "SystemExit"
    text = safe_str(e, 2000)
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def pip_name(module: str) -> str:
    top = module.split(".")[0]
    return PIP_NAMES.get(module) or PIP_NAMES.get(top) or top.replace("_", "-")


def missing_module_hint(e: BaseException, python: str) -> str | None:
    """For a ModuleNotFoundError (also one chained as the cause of another exception): one line naming
    the module, the file and line that imported it, and the command that installs it into ``python``;
    None for any other exception."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, ModuleNotFoundError) and isinstance(getattr(e, "name", None), str) and e.name:
            where = ""
            frames = [f for f in traceback.extract_tb(e.__traceback__) if "importlib" not in f.filename]
            if frames:
                where = f" (imported at {_short_path(frames[-1].filename)}:{frames[-1].lineno})"
            return (f"cannot import module {e.name!r}{where}: it is not installed in {python}; install it there with "
                    f"`{python} -m pip install {pip_name(e.name)}` (or the checkout's requirements)")
        e = e.__cause__ or e.__context__
    return None


def _short_path(path: str) -> str:
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return rel if not rel.startswith("..") else path


def require_differentiable(name: str, t, inputs: list) -> None:
    """MalformedOutput unless output ``name`` (which pgspec differentiates, the adapter having returned
    no ``grad``) carries an autograd graph."""
    from .outputs import MalformedOutput

    if not getattr(t, "requires_grad", False):
        raise MalformedOutput(
            f"not connected: output {name!r} does not require grad (detached, computed under torch.no_grad(), or not "
            f"floating) and "
            f"the adapter returned no 'grad' dict, so pgspec cannot differentiate it with respect to "
            f"{', '.join(inputs)}: keep the autograd graph, or return out['grad'] = {{input name: tensor}}")


def checked_call(adapter, formula_id: str, tensors: dict, params: dict, dtype: str, expected: dict,
                 unconnected: list | None = None, cotangent=None):
    """(outputs, gradients) of the adapter's formula, as ``compare.call`` gives them, with everything the
    adapter returns checked before pgspec reads it (`pgspec check`): a dict, the outputs of ``expected``
    ({name: shape}) tensors of that shape on the inputs' device in a dtype of the run
    (outputs.ACCEPTED_DTYPES), a differentiable primary output or a ``grad`` dict of tensors of the
    inputs' shapes.  Anything else is MalformedOutput, naming the output and what is wrong.  The inputs
    autograd finds no path to are appended to ``unconnected`` when a list is given.  Gradients are the VJP
    with ``cotangent`` (None: ones): autograd of ``objective`` with it, or the adapter's own made so by
    ``own_gradients`` (an own gradient that cannot be is MalformedOutput)."""
    import torch

    from pgspec.reference import REGISTRY

    from ..judge.compare import OwnGradientError, adapter_call, autograd, own_gradients
    from .outputs import MalformedOutput, _describe_tensor, _device_of, _short

    f = REGISTRY[formula_id]
    device = _device_of(tensors)
    if cotangent is not None and not isinstance(cotangent, torch.Tensor):
        cotangent = torch.as_tensor(cotangent, dtype=torch.float64)
    with torch.enable_grad():
        out, read = adapter_call(adapter, formula_id, tensors, dict(params), cotangent)
        if not isinstance(out, dict):
            raise MalformedOutput(f"the adapter returned {type(out).__name__} {_short(out)}; expected a dict of "
                                  f"output name -> tensor ({', '.join(o.name for o in f.outputs)})")
        kinds = {o.name: o.kind for o in f.outputs}
        primary = f.grad_of or f.outputs[0].name
        if primary in expected and out.get(primary) is None:
            keys = ", ".join(_short(k) for k in list(out)[:8]) or "nothing"
            raise MalformedOutput(f"the adapter returned no {primary!r} (its dict holds {keys})")
        for name, shape in expected.items():
            got = out.get(name)
            if got is None:
                continue
            problem = _describe_tensor(name, got, tuple(shape), dtype, kinds.get(name) == "real", "output", device)
            if problem:
                raise MalformedOutput(problem)
        grads = out.get("grad")
        if grads is not None and not isinstance(grads, dict):
            raise MalformedOutput(f"the adapter's 'grad' must be a dict of input name -> tensor, got "
                                  f"{type(grads).__name__} {_short(grads)}")
        diff = [n for n in f.differentiable if n in tensors]
        if grads is None and diff and out.get(f.grad_of) is not None:
            require_differentiable(f.grad_of, out[f.grad_of], diff)
            got = autograd(out[f.grad_of], tensors, diff, cotangent)
            grads = {n: (g if g is not None else torch.zeros_like(tensors[n])) for n, g in zip(diff, got)}
            if unconnected is not None:
                unconnected.extend(n for n, g in zip(diff, got) if g is None)
            own = False
        else:
            own = grads is not None
    grads = {n: g for n, g in (grads or {}).items() if g is not None}     # None: not returned
    for name, g in grads.items():
        if name in tensors and g is not None:
            problem = _describe_tensor(f"grad.{name}", g, tuple(tensors[name].shape), dtype, True, "gradient", device)
            if problem:
                raise MalformedOutput(problem + f" (the shape of input {name!r})")
    if own:
        try:
            grads = own_gradients(formula_id, grads, cotangent, read, getattr(adapter, "name", "the adapter"))
        except OwnGradientError as e:
            raise MalformedOutput(str(e)) from None
    return out, grads


# A case's time limit in this process (`pgspec run --case-timeout` without --python, the pytest plugin's
# --pgspec-case-timeout): None, no limit; and the option that set it, which the timeout's error names.
CASE_TIMEOUT: float | None = None
CASE_TIMEOUT_OPTION = "--case-timeout"
MAX_SECONDS = 7 * 24 * 3600     # a larger time limit overflowed the platform's timeout (exit 3)


def parse_seconds(text) -> float:
    """A time limit as a user gives it (``--case-timeout``, ``--startup-timeout``, the pytest plugin's
    ``--pgspec-case-timeout`` and ini ``pgspec_case_timeout``): a number of seconds, more than 0 and at
    most MAX_SECONDS (docs/bad-input.md); ValueError saying what is wrong otherwise."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise ValueError(f"must be a number of seconds, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"must be a positive number of seconds, got {text!r}")
    if value > MAX_SECONDS:
        raise ValueError(f"must be at most {MAX_SECONDS} seconds (7 days), got {text!r}")
    return value


def can_time_limit() -> bool:
    """Whether ``time_limit`` can interrupt a call here: POSIX interval timers, in the main thread."""
    import signal
    import threading

    return hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()


class case_timeout:
    """``with case_timeout(seconds, option):`` sets the time limit of the cases run inside (None: none)
    and the option the timeout's error names, then restores the previous ones."""

    def __init__(self, seconds: float | None, option: str):
        self.seconds, self.option, self.saved = seconds, option, None

    def __enter__(self):
        global CASE_TIMEOUT, CASE_TIMEOUT_OPTION
        self.saved = (CASE_TIMEOUT, CASE_TIMEOUT_OPTION)
        CASE_TIMEOUT, CASE_TIMEOUT_OPTION = self.seconds, self.option
        return self

    def __exit__(self, *exc):
        global CASE_TIMEOUT, CASE_TIMEOUT_OPTION
        CASE_TIMEOUT, CASE_TIMEOUT_OPTION = self.saved
        return False


TIMED_OUT = "did not return within"     # in every CaseTimeout's message


class CaseTimeout(BaseException):
    """An adapter's call that did not return within CASE_TIMEOUT: the case's error.  A BaseException, so
    that an adapter's ``except Exception:`` does not swallow it and carry on past its time."""


class time_limit:
    """``with time_limit(name):`` raises CaseTimeout in the adapter's code once CASE_TIMEOUT seconds have
    passed (SIGALRM, an interval timer: POSIX, the main thread only; elsewhere no limit).  Python code
    is interrupted at its next bytecode; a long native call (one torch kernel) at its return.

    A timer already running (pytest-timeout's signal method, an outer time limit) is kept: when it is
    due first, it fires as it would have; otherwise it is set again, with its remaining time, on exit."""

    def __init__(self, name: str):
        self.name = name
        self.previous = None
        self.outer = None

    def __enter__(self):
        import signal
        import time

        seconds, option = CASE_TIMEOUT, CASE_TIMEOUT_OPTION
        if not seconds or not can_time_limit():
            return self
        outer, interval = signal.getitimer(signal.ITIMER_REAL)
        if outer and outer <= seconds:      # the outer deadline comes first: it decides
            return self

        def fire(signum, frame):
            raise CaseTimeout(f"adapter {self.name!r} {TIMED_OUT} {seconds:g} s ({option}): its call was interrupted")

        self.outer = (outer, interval, time.monotonic()) if outer else None
        self.previous = signal.signal(signal.SIGALRM, fire)
        signal.setitimer(signal.ITIMER_REAL, seconds)
        return self

    def __exit__(self, *exc):
        if self.previous is not None:
            import signal
            import time

            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self.previous)
            self.previous = None
            if self.outer is not None:      # the outer timer, with the time it had left (due now: at once)
                outer, interval, since = self.outer
                signal.setitimer(signal.ITIMER_REAL, max(outer - (time.monotonic() - since), 1e-6), interval)
                self.outer = None
        return False


def require_dict(out, names: tuple, what: str = "the adapter's result"):
    """``out`` when it is a dict, else MalformedOutput naming what it is and the keys expected."""
    from .outputs import MalformedOutput, _short

    if not isinstance(out, dict):
        raise MalformedOutput(f"{what} must be a dict of {', '.join(names)}, got {type(out).__name__} {_short(out)}")
    return out


def check_tensor(key: str, got, shape: tuple, dtype: str, device: str, where: str = "output") -> None:
    """MalformedOutput unless ``got`` is a dense floating tensor of ``shape`` on ``device``'s type, of a
    dtype a ``dtype`` run accepts (outputs.ACCEPTED_DTYPES)."""
    from .outputs import MalformedOutput, _describe_tensor

    if got is None:
        raise MalformedOutput(f"the adapter returned no {key!r}")
    problem = _describe_tensor(key, got, tuple(shape), dtype, True, where, str(device).split(":")[0])
    if problem:
        raise MalformedOutput(problem)
