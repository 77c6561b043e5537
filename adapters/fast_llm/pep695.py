"""Import Fast-LLM's Python 3.12 source on Python 3.11: a line-preserving rewrite at import time.

pgspec's own code (research notes gitonly.md section 4.1), used only when the user asks for it
(``PGSPEC_FAST_LLM_COMPAT=pep695``, adapters/fast_llm/README.md) and the worker runs Python < 3.12.
Fast-LLM's files on disk are never changed and no bytecode is written: each ``fast_llm`` module is
rewritten in memory and compiled from the rewritten text, under the file's own path, so tracebacks,
``co_firstlineno`` and links name the file's real lines.

What is rewritten (and nothing else):

- PEP 695 generic classes.  ``class C[T: Bound, U](Base[T], metaclass=M):`` becomes, on the same
  line, ``class C(*_pep695.declare(T := _pep695.TypeVar("T", bound=Bound), U := _pep695.TypeVar("U")),
  Base[T], _pep695.Generic[T, U], metaclass=M):``.  The type variables keep their bounds (Fast-LLM's
  ``Configurable.__init_subclass__`` reads ``__bound__`` to find a layer's config class) and
  ``__orig_bases__`` is ``(Base[T], Generic[T, U])``, as Python 3.12 makes it.  Constraints
  (``T: (int, str)``) become ``TypeVar("T", int, str)``.
- PEP 695 generic functions.  ``def f[T](x: T) -> T:`` becomes ``def f(x: T) -> T:``; every such
  name is an unbounded module-level ``TypeVar`` put in the module's namespace before it runs (the
  annotations are evaluated at ``def`` time without ``from __future__ import annotations``).
- PEP 701 f-strings, only in a file that does not compile otherwise: a string literal inside a
  replacement field that uses the enclosing f-string's quote is re-quoted with the other quote
  (``f"{".".join(x)}"`` -> ``f"{'.'.join(x)}"``).
- ``types.get_original_bases`` (3.12) is backported: ``cls.__dict__.get("__orig_bases__", cls.__bases__)``.

Every rewrite keeps the line count and the line of every statement (a multi-line type-parameter
list is removed and the rest of its closing line joined to the opening one, with the line breaks
kept inside the statement's brackets); :func:`rewrite` checks the line count and raises otherwise.

Limits (a source using one of them fails to import, with the file and line, never silently):

- not handled: ``type X = ...`` alias statements, ``*Ts`` / ``**P`` type parameters, PEP 696
  defaults (``T = int``), a backslash inside an f-string expression, a re-quoted literal that holds
  the other quote too;
- semantics that differ from 3.12: bounds are evaluated eagerly where the class is defined (3.12
  evaluates them lazily; a bound naming something defined later fails); the type variables are
  names of the enclosing scope (module or class body) instead of a hidden annotation scope, so the
  last generic class's ``T`` is what a later *runtime* use of the bare name ``T`` sees; no variance
  inference; ``__type_params__`` is not set;
- other 3.12 library features (``typing.override``, ``itertools.batched``, ...) are not provided.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import io
import sys
import tokenize
import types
import typing

ALIAS = "_pep695"   # the helper namespace's name inside a rewritten module


def _declare(*type_vars):
    """``class C(*_pep695.declare(T := TypeVar(...)), ...)``: binds the type variables, adds no base."""
    return ()


HELPERS = types.SimpleNamespace(TypeVar=typing.TypeVar, Generic=typing.Generic, declare=_declare)


class RewriteError(SyntaxError):
    """A construct the rewrite does not handle (see the module's limits); names the line."""


# tokens ------------------------------------------------------------------------------------------

_SKIP = (tokenize.NL, tokenize.COMMENT)


def _is_op(tok, chars):
    return tok.type == tokenize.OP and tok.string in chars


def _match(toks, i):
    """Index of the bracket closing the one at ``toks[i]``."""
    depth = 0
    for j in range(i, len(toks)):
        if _is_op(toks[j], ("(", "[", "{")):
            depth += 1
        elif _is_op(toks[j], (")", "]", "}")):
            depth -= 1
            if depth == 0:
                return j
    raise RewriteError(f"unbalanced bracket at line {toks[i].start[0]}")


def _top_level_split(toks):
    """The tokens between two brackets, split at their top-level commas (comments and NL dropped)."""
    parts, cur, depth = [], [], 0
    for t in toks:
        if t.type in _SKIP:
            continue
        if depth == 0 and _is_op(t, (",",)):
            parts.append(cur)
            cur = []
            continue
        if _is_op(t, ("(", "[", "{")):
            depth += 1
        elif _is_op(t, (")", "]", "}")):
            depth -= 1
        cur.append(t)
    if cur:
        parts.append(cur)
    return parts


def _text(toks):
    """One-line source of an expression's tokens (its line breaks and comments dropped)."""
    return " ".join(t.string for t in toks)


def _type_params(toks, line):
    """[(name, TypeVar arguments after the name)] of the tokens strictly between ``[`` and ``]``."""
    params = []
    for part in _top_level_split(toks):
        if _is_op(part[0], ("*", "**")):
            raise RewriteError(f"line {line}: TypeVarTuple / ParamSpec type parameters are not handled")
        if part[0].type != tokenize.NAME:
            raise RewriteError(f"line {line}: unexpected type parameter {_text(part)!r}")
        name, rest = part[0].string, part[1:]
        if any(_is_op(t, ("=",)) for t in rest):
            raise RewriteError(f"line {line}: type parameter defaults (PEP 696) are not handled")
        if not rest:
            params.append((name, ""))
        elif _is_op(rest[0], (":",)):
            bound = rest[1:]
            inner = bound[1:-1]
            if _is_op(bound[0], ("(",)) and _match(bound, 0) == len(bound) - 1 and len(_top_level_split(inner)) > 1:
                params.append((name, ", " + _text(inner)))        # constraints: T: (int, str)
            else:
                params.append((name, ", bound=" + _text(bound)))
        else:
            raise RewriteError(f"line {line}: unexpected type parameter {_text(part)!r}")
    return params


# the rewrite -------------------------------------------------------------------------------------

def rewrite_generics(source: str) -> tuple[str, list[str]]:
    """PEP 695 classes and functions rewritten for 3.11: (source, the function type-parameter names,
    which the module's namespace must hold before it runs)."""
    toks = list(tokenize.generate_tokens(io.StringIO(source).readline))
    lines = source.splitlines(keepends=True)
    edits = []           # ((row, col), "insert", text) / ((row, col), "cut", (end row, end col)): applied
                         # from the end of the file backwards, so no edit moves a later one
    func_names: list[str] = []
    statement_start = True
    for i, t in enumerate(toks):
        if t.type in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT) or _is_op(t, (";",)):
            statement_start = True
            continue
        if t.type in _SKIP:
            continue
        at_start, statement_start = statement_start, False
        if (at_start and t.type == tokenize.NAME and t.string == "type" and i + 1 < len(toks)
                and toks[i + 1].type == tokenize.NAME):
            raise RewriteError(f"line {t.start[0]}: `type` alias statements (PEP 695) are not handled")
        if not (t.type == tokenize.NAME and t.string in ("class", "def") and i + 2 < len(toks)):
            continue
        if not (toks[i + 1].type == tokenize.NAME and _is_op(toks[i + 2], ("[",))):
            continue
        close = _match(toks, i + 2)
        params = _type_params(toks[i + 3:close], t.start[0])
        names = [n for n, _ in params]
        edits.append((toks[i + 2].start, "cut", toks[close].end))
        if t.string == "def":
            func_names += [n for n in names if n not in func_names]
            continue
        declare = f"*{ALIAS}.declare(" + ", ".join(f'{n} := {ALIAS}.TypeVar("{n}"{args})' for n, args in params) + ")"
        generic = f"{ALIAS}.Generic[{', '.join(names)}]"
        after = toks[close + 1]
        if not _is_op(after, ("(",)):
            edits.append((after.start, "insert", f"({declare}, {generic})"))
            continue
        end = _match(toks, close + 1)
        args = _top_level_split(toks[close + 2:end])
        keyword = next((a[0] for a in args if _is_op(a[0], ("**",)) or (len(a) > 1 and _is_op(a[1], ("=",)))), None)
        if keyword is not None:                      # Generic goes before metaclass=... / **kwargs
            edits.append((keyword.start, "insert", f"{generic}, "))
        elif args:
            last = [x for x in toks[close + 2:end] if x.type not in _SKIP][-1]
            edits.append((last.end, "insert", f"{generic}" if _is_op(last, (",",)) else f", {generic}"))
        else:
            edits.append((toks[end].start, "insert", generic))
        edits.append((toks[close + 1].end, "insert", declare + ", "))
    for (row, col), kind, payload in sorted(edits, key=lambda e: e[0], reverse=True):
        if kind == "insert":
            lines[row - 1] = lines[row - 1][:col] + payload + lines[row - 1][col:]
            continue
        end_row, end_col = payload
        if end_row == row:
            lines[row - 1] = lines[row - 1][:col] + lines[row - 1][end_col:]
            continue
        # a type-parameter list over several lines: the rest of its last line joins the first, and the
        # line breaks follow it (inside the parameter or base brackets, or as blank lines after the
        # header), so every later line keeps its number
        lines[row - 1] = lines[row - 1][:col] + lines[end_row - 1][end_col:] + "\n" * (end_row - row)
        for r in range(row, end_row):
            lines[r] = ""
    return "".join(lines), func_names


_PREFIX = set("rRbBuUfF")


def _string_start(src, i):
    """Whether a string literal (with its prefix) starts at ``src[i]``."""
    if src[i] in "\"'":
        return True
    if src[i] not in _PREFIX or (i > 0 and (src[i - 1].isalnum() or src[i - 1] == "_")):
        return False
    j = i
    while j < len(src) and src[j] in _PREFIX and j - i < 2:
        j += 1
    return j < len(src) and src[j] in "\"'"


def _open(src, i):
    """(prefix, quote, index of the body) of the literal starting at ``src[i]``."""
    j = i
    while src[j] in _PREFIX:
        j += 1
    quote = src[j] * 3 if src.startswith(src[j] * 3, j) else src[j]
    return src[i:j], quote, j + len(quote)


def _literal(src, i, in_use, line):
    """(3.11 text, end) of the literal at ``src[i]``; re-quoted when its quote is ``in_use``."""
    prefix, quote, k = _open(src, i)
    raw = "r" in prefix.lower()
    if "f" in prefix.lower():
        text, end = _fstring(src, i, in_use, line)
    else:
        while not src.startswith(quote, k):
            k += 2 if src[k] == "\\" and not raw else 1
        end = k + len(quote)
        text = src[i:end]
    if quote[0] in in_use:
        other = "'" if quote[0] == '"' else '"'
        body = text[len(prefix) + len(quote):len(text) - len(quote)]
        if other in body:
            raise RewriteError(f"line {line}: a string nested in an f-string holds both quotes")
        text = prefix + other * len(quote) + body + other * len(quote)
    return text, end


def _fstring(src, i, outer, line):
    prefix, quote, k = _open(src, i)
    raw = "r" in prefix.lower()
    out = [prefix, quote]
    in_use = outer | {quote[0]}
    while not src.startswith(quote, k):
        c = src[k]
        if c == "\\" and not raw:
            out.append(src[k:k + 2])
            k += 2
        elif src.startswith("{{", k):
            out.append("{{")
            k += 2
        elif c == "{":
            depth = 0
            while True:
                c = src[k]
                if c in "{[(":
                    depth += 1
                elif c in "}])":
                    depth -= 1
                elif c == "\\":
                    raise RewriteError(f"line {line + src.count(chr(10), i, k)}: backslash in an f-string expression")
                elif _string_start(src, k):
                    text, k = _literal(src, k, in_use, line + src.count("\n", i, k))
                    if "\\" in text:
                        raise RewriteError(f"line {line + src.count(chr(10), i, k)}: backslash in an f-string expression")
                    out.append(text)
                    continue
                out.append(c)
                k += 1
                if depth == 0:
                    break
        else:
            out.append(c)
            k += 1
    out.append(quote)
    return "".join(out), k + len(quote)


def requote_fstrings(source: str) -> str:
    """PEP 701 f-strings made valid for 3.11 by re-quoting the literals nested in their replacement
    fields; the text is otherwise unchanged (same length of every line but the re-quoted ones'
    quote characters)."""
    out, i, n = [], 0, len(source)
    while i < n:
        c = source[i]
        if c == "#":
            j = source.find("\n", i)
            j = n if j < 0 else j
            out.append(source[i:j])
            i = j
        elif _string_start(source, i):
            text, i = _literal(source, i, set(), source.count("\n", 0, i) + 1)
            out.append(text)
        else:
            out.append(c)
            i += 1
    return "".join(out)


def rewrite(source: str, path: str = "<source>") -> tuple[str, list[str]]:
    """The 3.11 source of ``source`` and its function type-parameter names.  F-strings are re-quoted
    only when the generics rewrite alone does not compile.  Raises RewriteError (a SyntaxError) for
    what it does not handle, and if the line count changed (which would make every line number
    after it wrong)."""
    try:
        new, names = rewrite_generics(source)
        compile(new, path, "exec", dont_inherit=True)
    except (SyntaxError, tokenize.TokenError):
        new, names = rewrite_generics(requote_fstrings(source))
        try:
            compile(new, path, "exec", dont_inherit=True)
        except SyntaxError as e:
            raise RewriteError(f"{path}, line {e.lineno}: does not compile on Python "
                               f"{sys.version_info[0]}.{sys.version_info[1]} after the rewrite: {e.msg}") from None
    if new.count("\n") != source.count("\n"):
        raise RewriteError(f"{path}: the rewrite changed the line count ({source.count(chr(10))} -> {new.count(chr(10))})")
    return new, names


def namespace(func_names) -> dict:
    """What a rewritten module's namespace holds before it runs."""
    return {ALIAS: HELPERS, **{n: typing.TypeVar(n) for n in func_names}}


def get_original_bases(cls, /):
    """Python 3.12's ``types.get_original_bases``: the bases as written in the class statement (its own
    ``__orig_bases__``, never a parent's), else ``__bases__``."""
    if not isinstance(cls, type):
        raise TypeError(f"Expected an instance of type, not {type(cls).__name__!r}")
    return cls.__dict__.get("__orig_bases__", cls.__bases__)


def backport_get_original_bases() -> None:
    """``types.get_original_bases`` where it is missing (Python < 3.12), for ``fast_llm.config.Configurable``."""
    if not hasattr(types, "get_original_bases"):
        types.get_original_bases = get_original_bases


# the import hook ---------------------------------------------------------------------------------

class _Loader(importlib.machinery.SourceFileLoader):
    """Compiles the rewritten source; never reads or writes bytecode caches."""

    def get_code(self, fullname):
        path = self.get_filename(fullname)
        new, self._func_names = rewrite(importlib.util.decode_source(self.get_data(path)), path)
        return compile(new, path, "exec", dont_inherit=True)

    def exec_module(self, module):
        code = self.get_code(module.__name__)
        module.__dict__.update(namespace(self._func_names))
        exec(code, module.__dict__)


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, packages):
        self.packages = tuple(packages)

    def find_spec(self, fullname, path, target=None):
        if fullname.partition(".")[0] not in self.packages:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and type(spec.loader) is importlib.machinery.SourceFileLoader:
            spec.loader = _Loader(spec.loader.name, spec.loader.path)
            spec.cached = None
        return spec


def install(*packages: str) -> bool:
    """Rewrite the named top-level packages at import, on Python < 3.12 (True), else nothing (False)."""
    if sys.version_info >= (3, 12):
        return False
    backport_get_original_bases()
    if not any(isinstance(f, _Finder) and f.packages == packages for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder(packages))
    return True
