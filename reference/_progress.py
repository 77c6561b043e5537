"""Progress of one ``evaluate()``: its steps (the inputs, the formula, the gradient, the error scales),
reported to a callback or drawn on the terminal, as the rest of pgspec shows progress: on stderr, only
when stderr is a terminal, and gone when the evaluation returns.  Kept out of the formula functions:
``evaluate`` marks where each step starts, nothing else does.

An evaluation of up to MAX_ELEMENTS elements an input takes a tenth of a millisecond to a millisecond
an element at 60 digits, so a large one runs for minutes: by default (``progress=None``) one whose
largest input has at least PROGRESS_ELEMENTS elements shows its steps and the time elapsed on a terminal.
"""

from __future__ import annotations

import sys

from ._errors import SpecError

# the size from which evaluate() shows its progress on a terminal by default (5 to 25 s of work,
# measured on kl.k3 and loss.grpo; the golden corpus's largest input has 65,536 elements, so
# generating it shows nothing)
PROGRESS_ELEMENTS = 100_000

PROGRESS_HELP = ("progress must be None (shown on a terminal for an input of at least "
                 f"{PROGRESS_ELEMENTS:,} elements), True (shown on a terminal whatever the size), False "
                 "(never shown) or a callable progress(step, done, total)")


def check_progress(progress) -> None:
    if progress is None or isinstance(progress, bool) or callable(progress):
        return
    raise SpecError(f"{PROGRESS_HELP}, got {type(progress).__name__} {progress!r}")


def largest_input(f, inputs: dict) -> int:
    """The elements of the largest declared input, read along its first elements (exact for the
    rectangular inputs the checks that follow accept; never deeper than the input's rank)."""
    largest = 0
    for spec in f.inputs:
        x = inputs.get(spec.name)
        n, depth = 1, max(len(s) for s in spec.shapes)
        while isinstance(x, (list, tuple)) and depth > 0:
            n *= len(x)
            x = x[0] if x else None
            depth -= 1
        largest = max(largest, n)
    return largest


class Steps:
    """``with Steps(progress, title, names) as step:``, then ``step(name)`` as each step starts: the
    callback gets (name, steps done before it, number of steps), and ("done", n, n) at the end."""

    def __init__(self, callback, names: list[str]):
        self.callback = callback
        self.names = names
        self.done = 0

    def __call__(self, name: str) -> None:
        if self.callback is None:
            return
        assert name in self.names, name
        self.done = self.names.index(name)
        self.callback(name, self.done, len(self.names))

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc):
        if self.callback is not None:
            if exc_type is None:
                self.callback("done", len(self.names), len(self.names))
            close = getattr(self.callback, "close", None)
            if close is not None:
                close()
        return False


def steps(progress, f, inputs: dict, with_scale: bool) -> Steps:
    """The steps of evaluating ``f`` on ``inputs``, reported as ``progress`` says (check_progress)."""
    names = ["the inputs", "the formula"]
    if f.differentiable:
        names.append("the gradient")
    if with_scale:
        names.append("the error scales")
    if progress is False:
        return Steps(None, names)
    if callable(progress):
        return Steps(progress, names)
    elements = largest_input(f, inputs)
    if progress is None and elements < PROGRESS_ELEMENTS:
        return Steps(None, names)
    if not _stderr_is_a_terminal():
        return Steps(None, names)
    return Steps(TerminalProgress(f"pgspec evaluate {f.id} ({elements:,} elements)"), names)


def _stderr_is_a_terminal() -> bool:
    try:
        return sys.stderr is not None and sys.stderr.isatty()
    except (AttributeError, ValueError):     # a replaced or closed stderr
        return False


class TerminalProgress:
    """A transient bar on stderr: the step, the steps done of all, the time elapsed (ticking while a
    step runs: rich refreshes it from its own thread)."""

    def __init__(self, title: str):
        self.title = title
        self.bar = None
        self.task = None

    def __call__(self, step: str, done: int, total: int) -> None:
        if self.bar is None:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                TimeElapsedColumn(), console=Console(stderr=True), transient=True)
            self.task = self.bar.add_task(f"{self.title}: {step}", total=total, completed=done)
            self.bar.start()
        self.bar.update(self.task, completed=done, description=f"{self.title}: {step}")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None
