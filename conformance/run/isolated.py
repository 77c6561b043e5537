"""Process-isolated adapters: run an adapter in another Python interpreter over JSON lines.

``pgspec run --adapter NAME --python OTHER/bin/python`` starts ``OTHER/bin/python -m
pgspec.conformance.run.isolated --adapter NAME`` (the *worker*) and talks to it one request per line
on its stdin, one response per line on its stdout.  Each framework can thus live in its own
environment with its own pins (torch, ray, transformers, ...); the worker's environment needs
torch, mpmath and the framework, and pgspec itself is made importable from this process's copy
when the worker's interpreter does not have it.

Protocol (``pgspec-worker/1``), every message one JSON object on one line:

    -> {"op": "hello"}
    <- {"ok": true, "protocol": "pgspec-worker/1", "adapter": {"name", "framework", "version",
        "devices", "dtypes", "capabilities", "declarations", "available", "why"}}
    -> {"op": "run", "case": <a golden case object>, "dtype": "float32", "device": "cpu"}
    <- {"ok": true, "result": <CaseResult as JSON>}
    -> {"op": "properties", "dtype": "float32", "device": "cpu", "formulas": "*"}
    <- {"ok": true, "results": [<PropertyResult as JSON>, ...]}
    -> {"op": "exit"}

A response with "ok": false carries "error" (a traceback).  The parent gives each case a timeout;
a worker that crashes, hangs or answers garbage is killed, its case becomes an ``error`` outcome
with what it printed on stderr, and a fresh worker takes the remaining cases.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import traceback
from pathlib import Path

PROTOCOL = "pgspec-worker/1"
DEFAULT_TIMEOUT = 300.0
STARTUP_TIMEOUT = 300.0


# worker side -----------------------------------------------------------------------------------

def worker_main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m pgspec.conformance.run.isolated")
    parser.add_argument("--adapter", required=True)
    args = parser.parse_args(argv)
    # The protocol owns the real stdout; anything a framework prints goes to stderr.
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    adapter = None
    load_error = None
    from pgspec.conformance.run import runner

    try:
        adapter = runner.load_adapter(args.adapter)
    except BaseException as e:  # noqa: BLE001 - reported to the parent (SystemExit at import too)
        if isinstance(e, KeyboardInterrupt):
            raise
        load_error = traceback.format_exc()
        load_summary = str(e) if isinstance(e, runner.RunError) else runner._one_line(e)

    def send(obj):
        proto.write(json.dumps(obj) + "\n")
        proto.flush()

    for line in sys.stdin:
        try:
            msg = json.loads(line)
        except ValueError:
            send({"ok": False, "error": f"not JSON: {line[:200]!r}"})
            continue
        op = msg.get("op")
        if op == "exit":
            break
        if load_error is not None:
            send({"ok": False, "error": load_error, "summary": load_summary})
            continue
        try:
            if op == "hello":
                ok, why = adapter.available()
                missing = _preload(adapter) if ok is True else None
                if missing is not None:
                    send({"ok": False, "error": missing[1], "summary": missing[0], "startup": True})
                    continue
                send({"ok": True, "protocol": PROTOCOL, "adapter": {
                    "name": adapter.name, "framework": adapter.framework, "version": adapter.version,
                    "devices": list(adapter.devices), "dtypes": list(adapter.dtypes),
                    "capabilities": sorted(adapter.capabilities()),
                    "declarations": runner.declarations_of(adapter).to_json(),
                    "available": ok, "why": why}})
            elif op == "run":
                result = runner.run_case(adapter, msg["case"], msg["dtype"], msg["device"])
                send({"ok": True, "result": result.to_json()})
            elif op == "properties":
                from pgspec.conformance.run import properties

                found = properties.run_properties(adapter, msg["dtype"], msg["device"], msg.get("formulas", "*"),
                                                  adapter_spec=args.adapter)
                send({"ok": True, "results": [p.to_json() for p in found]})
            else:
                send({"ok": False, "error": f"unknown op {op!r}"})
        except BaseException as e:  # noqa: BLE001 - reported to the parent (SystemExit too)
            if isinstance(e, KeyboardInterrupt):
                raise
            send({"ok": False, "error": traceback.format_exc(), "summary": runner._one_line(e)})
    return 0


def _preload(adapter):
    """Load what a checkout's adapter (``load()``: nemo_rl, slime, megatron, fast_llm) imports on first
    use, once, at the worker's start-up: a missing dependency of the checkout is then one start-up
    error naming the module and how to install it, not a traceback in every case (issue 39).
    Returns None, or (one line, the traceback)."""
    load = getattr(adapter, "load", None)
    if not getattr(adapter, "requires_isolation", False) or not callable(load):
        return None
    from .untrusted import describe_exception, missing_module_hint

    try:
        load()
    except BaseException as e:  # noqa: BLE001 - the checkout's code: SystemExit included
        if isinstance(e, KeyboardInterrupt):
            raise
        hint = missing_module_hint(e, sys.executable)
        line = hint or f"loading the checkout raised {describe_exception(e)}"
        return f"adapter {adapter.name!r}: {line}", traceback.format_exc()
    return None


# parent side -----------------------------------------------------------------------------------

def _pgspec_path_dir() -> str:
    """A directory whose ``pgspec/`` maps to this process's pgspec subpackages (symlinks), for a
    worker interpreter that does not have pgspec installed."""
    import pgspec.adapters
    import pgspec.conformance
    import pgspec.reference
    import pgspec.spec

    root = Path(tempfile.mkdtemp(prefix="pgspec-worker-path-"))
    (root / "pgspec").mkdir()
    for name, module in (("reference", pgspec.reference), ("conformance", pgspec.conformance),
                         ("adapters", pgspec.adapters), ("spec", pgspec.spec)):
        (root / "pgspec" / name).symlink_to(Path(list(module.__path__)[0]).resolve(), target_is_directory=True)
    return str(root)


class Worker:
    """One worker process with a reader thread, so that every read can time out."""

    def __init__(self, python: str, adapter: str, env: dict):
        try:
            self.proc = subprocess.Popen(
                [python, "-m", "pgspec.conformance.run.isolated", "--adapter", adapter],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, bufsize=1,
            )
        except OSError as e:
            raise WorkerDied(f"cannot start {python}: {e.strerror or e}") from None
        self.lines: queue.Queue = queue.Queue()
        self.stderr: list[str] = []
        self._pumper = threading.Thread(target=self._pump, args=(self.proc.stdout, self.lines), daemon=True)
        self._pumper.start()
        self._drainer = threading.Thread(target=self._drain, daemon=True)
        self._drainer.start()

    def _pump(self, stream, q):
        for line in stream:
            q.put(line)
        q.put(None)

    def _drain(self):
        for line in self.proc.stderr:
            self.stderr.append(line)
            del self.stderr[:-200]

    def request(self, obj: dict, timeout: float) -> dict:
        try:
            self.proc.stdin.write(json.dumps(obj) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise WorkerDied(self._tail("the worker exited before the request")) from None
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            self.kill()
            raise WorkerDied(self._tail(f"no answer within {timeout:g} s: the worker was killed"), timed_out=True) from None
        if line is None:
            self.proc.wait(timeout=5)
            raise WorkerDied(self._tail(f"the worker exited with code {self.proc.returncode}"))
        try:
            answer = json.loads(line)
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            self.kill()
            raise WorkerDied(self._tail(f"the worker answered something that is not a JSON object: {line[:200]!r}"))
        return answer

    def _tail(self, what: str) -> str:
        """``what``, and where the worker's output (its stderr, a traceback say) is saved."""
        if self.proc.poll() is not None:
            self._drainer.join(timeout=5)  # the rest of what it printed before it ended
        if not self.stderr:
            return what + " (it printed nothing on stderr)"
        from .logs import save

        text = "".join(self.stderr)
        path = save(f"{what}\n\nworker stderr (last {len(self.stderr)} lines):\n{text}", "worker")
        last = next((line.strip() for line in reversed(self.stderr) if line.strip()), "")
        where = f"; its output is saved to {path}" if path else f"\nworker stderr (last lines):\n{''.join(self.stderr[-30:])}"
        return f"{what}; its last line: {last}{where}"

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._release()

    def close(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"op": "exit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=10)
            except Exception:  # noqa: BLE001
                self.kill()
        self._release()

    def _release(self):
        """The pipes of an ended worker closed, once its reader threads have read them to the end."""
        if self.proc.poll() is None:
            return
        for thread in (self._pumper, self._drainer):
            thread.join(timeout=5)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            try:
                stream.close()
            except (OSError, ValueError):   # a broken pipe's buffered request, or closed already
                pass


class WorkerDied(Exception):
    def __init__(self, message: str, timed_out: bool = False):
        super().__init__(message)
        self.timed_out = timed_out


class IsolatedAdapter:
    """An adapter living in another interpreter; quacks like base.Adapter for the runner and CLI."""

    def __init__(self, python: str, adapter: str, timeout: float = DEFAULT_TIMEOUT,
                 startup_timeout: float = STARTUP_TIMEOUT):
        import math

        from ..verdicts.declarations import Declarations

        from .runner import RunError

        for option, value in (("--case-timeout", timeout), ("--startup-timeout", startup_timeout)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise RunError(f"{option} must be a positive number of seconds, got {value!r}")
            if value > 7 * 24 * 3600:   # a larger one overflows the platform's timeout
                raise RunError(f"{option} must be at most {7 * 24 * 3600} seconds (7 days), got {value!r}")
        if not Path(python).exists() and os.sep not in python:
            import shutil

            python = shutil.which(python) or python  # a bare name such as python3.12: look it up on PATH
        if not Path(python).exists():
            raise RunError(f"--python: {python} does not exist")
        if Path(python).is_dir():
            raise RunError(f"--python: {python} is a directory; give the interpreter, e.g. {python.rstrip('/')}/bin/python")
        self.python = python
        self.adapter_name = adapter
        self.timeout = timeout
        self.startup_timeout = startup_timeout
        env = dict(os.environ)
        if not self._probe(env):
            env["PYTHONPATH"] = _pgspec_path_dir() + os.pathsep + env.get("PYTHONPATH", "")
        self.env = env
        self.worker = None
        try:
            hello = self._request({"op": "hello"}, timeout=startup_timeout)
        except WorkerDied as e:
            hint = " (is importing the adapter hanging? --startup-timeout sets this limit)" if e.timed_out else ""
            raise RunError(f"--python {python}: the worker for adapter {adapter!r} failed while starting: {e}{hint}") from None
        if not isinstance(hello, dict) or not hello.get("ok") or not isinstance(hello.get("adapter"), dict):
            error = hello.get("error", "") if isinstance(hello, dict) else repr(hello)
            summary = hello.get("summary") if isinstance(hello, dict) else None
            if not summary:
                summary = next((line.strip() for line in reversed(str(error).splitlines()) if line.strip()), "no reason given")
            from .logs import save

            path = save(f"adapter {adapter!r} in {python}: the worker could not load it\n\n{error}", "worker")
            self.close()
            if hello.get("startup"):   # the checkout's own loading (_preload): its one line says it all
                raise RunError(f"--python {python}: {summary}"
                               + (f" (the worker's traceback is saved to {path})" if path else ""))
            raise RunError(f"--python {python}: the worker could not load adapter {adapter!r}: {summary}"
                           + (f" (the worker's traceback is saved to {path})" if path else f"\n{error}"))
        info = hello["adapter"]
        self.name = info["name"]
        self.framework = info["framework"]
        self.version = info["version"] + " (isolated)"
        self.python_path = python
        self.devices = tuple(info["devices"])
        self.dtypes = tuple(info["dtypes"])
        self._capabilities = set(info["capabilities"])
        self.deviations = Declarations.from_json(info.get("declarations") or {})
        self._available = (info["available"], info["why"])
        self.implementations = {fid: None for fid in self._capabilities}

    def _probe(self, env) -> bool:
        """Check that ``python`` is a Python >= 3.11 interpreter; True when it can import pgspec itself."""
        from .runner import RunError

        code = ("import sys; print('pgspec-probe', *sys.version_info[:2], flush=True)\n"
                "try:\n import pgspec.conformance.run.isolated\nexcept BaseException:\n sys.exit(1)\n")
        try:
            probe = subprocess.run([self.python, "-c", code], capture_output=True, text=True, env=env,
                                   timeout=self.startup_timeout)
        except subprocess.TimeoutExpired:
            raise RunError(f"--python {self.python}: no answer within {self.startup_timeout:g} s of starting "
                           "(--startup-timeout)") from None
        except OSError as e:
            raise RunError(f"--python {self.python}: cannot run it: {e.strerror or e}") from None
        line = next((x for x in probe.stdout.splitlines() if x.startswith("pgspec-probe ")), None)
        if line is None:
            raise RunError(f"--python {self.python}: not a Python interpreter (running it with -c printed no "
                           f"version; exit code {probe.returncode})")
        version = tuple(int(v) for v in line.split()[1:3])
        if version < (3, 11):
            raise RunError(f"--python {self.python}: Python {version[0]}.{version[1]}; pgspec needs Python 3.11 or newer")
        return probe.returncode == 0

    def _request(self, obj, timeout):
        try:
            if self.worker is None or self.worker.proc.poll() is not None:
                self.close()    # an ended worker's pipes
                # a fresh worker imports torch and the framework: that start-up is not the case's time
                self.worker = Worker(self.python, self.adapter_name, self.env)
                if obj.get("op") != "hello":
                    hello = self.worker.request({"op": "hello"}, self.startup_timeout)
                    if not hello.get("ok"):
                        raise WorkerDied(f"a fresh worker could not load the adapter: {hello.get('summary', '')}")
            return self.worker.request(obj, timeout)
        except WorkerDied:
            self.close()
            raise

    def capabilities(self):
        return set(self._capabilities)

    def available(self):
        return self._available

    def device_available(self, device):
        if device not in self.devices:
            return False, f"adapter {self.name!r} supports devices {', '.join(self.devices)}, not {device!r}"
        return True, ""

    def run_case(self, case: dict, dtype: str, device: str):
        from pgspec.reference import REGISTRY

        from .runner import CaseResult, classify, repro_snippet

        try:
            answer = self._request({"op": "run", "case": case, "dtype": dtype, "device": device}, self.timeout)
            if answer.get("ok"):
                return CaseResult(**_from_json(answer["result"]))
            message = _worker_error(answer)
        except WorkerDied as e:
            message = str(e)
        f = REGISTRY[case["formula"]]
        result = CaseResult(self.name, self.version, device, dtype, case["id"], case["formula"], f.family,
                            case["category"], "error", message=message)
        result.repro = repro_snippet(self.adapter_name, case["id"], dtype, device)
        # the worker classified nothing: a crash is an error unless a rule expects one
        return classify(result, self.deviations.rules_for(case["id"], case["formula"], dtype, case))

    def run_properties(self, dtype: str, device: str, formulas: str) -> list:
        """The property checks, run in the worker; a crash or a hang becomes one error row."""
        try:
            answer = self._request({"op": "properties", "dtype": dtype, "device": device, "formulas": formulas},
                                   self.timeout * 4)
            if answer.get("ok"):
                return answer["results"]
            message = _worker_error(answer)
        except WorkerDied as e:
            message = str(e)
        return [{"property": "prop.all", "formula": "*", "outcome": "error", "message": message, "examples": 0}]

    def close(self):
        if self.worker is not None:
            self.worker.close()
            self.worker = None


def _worker_error(answer: dict) -> str:
    """One line for an error the worker reported, with where its traceback is saved."""
    from .logs import save

    error = str(answer.get("error") or "the worker reported an error")
    summary = answer.get("summary") or next((x.strip() for x in reversed(error.splitlines()) if x.strip()), error)
    path = save(error, "worker")
    return f"the worker raised {summary}" + (f"; its traceback is saved to {path}" if path else f"\n{error}")


def _from_json(d: dict) -> dict:
    for k in ("error", "bound", "error_ratio"):
        if isinstance(d.get(k), str):
            d[k] = float(d[k])
    return d


if __name__ == "__main__":
    sys.exit(worker_main())
