"""pgspec's line-preserving PEP 695 / PEP 701 rewrite (adapters/fast_llm/pep695.py), which lets
Fast-LLM's Python 3.12 source import on Python 3.11 when the user opts in
(PGSPEC_FAST_LLM_COMPAT=pep695).  Runs without Fast-LLM: small sources with the constructs Fast-LLM
uses; the rewritten text is run on this interpreter, whatever its version."""

from __future__ import annotations

import ast
import re
import sys
import textwrap
import traceback
import types
import typing

import pytest

from pgspec.adapters.fast_llm import loader, pep695

GENERIC = textwrap.dedent('''\
    import abc


    class Config:
        pass


    class SubConfig(Config):
        pass


    class Configurable[ConfigType: Config](abc.ABC):
        def __init_subclass__(cls):
            super().__init_subclass__()
            import types
            bounds = [a.__bound__ for b in types.get_original_bases(cls) if hasattr(b, "__origin__")
                      for a in b.__args__ if getattr(a, "__name__", "") == "ConfigType"]
            cls.config_class = bounds[0] if bounds else None

    def deco(cls):
        return cls
    @deco
    class Layer[ConfigType: SubConfig](Configurable[ConfigType]):
        pass


    class Pair[
        KeyType,
        ValueType: (int, str),
    ](dict):
        pass


    class Bare[T]:
        pass


    class Meta(type):
        pass


    class WithMeta[T](Bare[T], metaclass=Meta):
        pass


    def first[ItemType](items: list[ItemType]) -> ItemType:
        return items[0]


    def div[
        T: float
    ](x: T, y: T) -> T:
        return x / y


    class Holder:
        def get[T](self, x: T) -> T:
            raise ValueError(f"{"-".join(["held", str(x)])}")
    ''')


def _run(source):
    new, names = pep695.rewrite(source)
    namespace = pep695.namespace(names)
    namespace["types"] = types
    saved = getattr(types, "get_original_bases", None)
    types.get_original_bases = pep695.get_original_bases
    try:
        exec(compile(new, "<generic>", "exec", dont_inherit=True), namespace)
    finally:
        if saved is None:
            del types.get_original_bases
        else:
            types.get_original_bases = saved
    return new, namespace


def _headers(source):
    """(line, name) of every def / class statement, found in the original text."""
    return sorted((i + 1, m.group(1)) for i, line in enumerate(source.splitlines())
                  if (m := re.match(r"\s*(?:async\s+)?(?:def|class)\s+(\w+)", line)))


def test_class_type_parameters_keep_their_bounds_and_3_12_orig_bases():
    new, ns = _run(GENERIC)
    assert ns["Layer"].config_class is ns["SubConfig"]       # the bound Fast-LLM reads at subclass time
    t, = ns["Layer"].__parameters__
    assert t.__name__ == "ConfigType" and t.__bound__ is ns["SubConfig"]
    assert pep695.get_original_bases(ns["Layer"]) == (ns["Configurable"][t], typing.Generic[t])
    key, value = ns["Pair"].__parameters__
    assert key.__bound__ is None and value.__constraints__ == (int, str)
    assert dict in ns["Pair"].__mro__
    t, = ns["WithMeta"].__parameters__
    assert type(ns["WithMeta"]) is ns["Meta"] and t.__name__ == "T"
    assert pep695.get_original_bases(ns["WithMeta"]) == (ns["Bare"][t], typing.Generic[t])
    assert ns["Bare"].__parameters__[0].__name__ == "T"


def test_function_type_parameters_are_removed_and_their_names_defined():
    new, ns = _run(GENERIC)
    assert ns["first"]([3, 4]) == 3 and ns["div"](1.0, 4.0) == 0.25
    item = ns["ItemType"]          # a name no class uses: defined for the functions only
    assert isinstance(item, typing.TypeVar) and ns["first"].__annotations__["items"] == list[item]
    assert "def first(items" in new and "def div(x: T" in new


def test_every_statement_keeps_its_line():
    new, _ = pep695.rewrite(GENERIC)
    assert new.count("\n") == GENERIC.count("\n")
    tree = ast.parse(new)
    got = sorted((n.lineno, n.name) for n in ast.walk(tree)
                 if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)))
    assert got == _headers(GENERIC)
    # the lines the rewrite has no reason to touch are the same text
    for old, line in zip(GENERIC.splitlines(), new.splitlines()):
        if not re.match(r"\s*(class|def) \w+\[|\s+(KeyType|ValueType|T: float)|\]\(", old):
            assert line == old or re.match(r'\s*raise ValueError\(f"', old), (old, line)


def test_a_traceback_names_the_original_line():
    new, ns = _run(GENERIC)
    with pytest.raises(ValueError, match="^held-7$") as info:
        ns["Holder"]().get(7)
    line = traceback.extract_tb(info.tb)[-1].lineno
    assert GENERIC.splitlines()[line - 1].strip().startswith('raise ValueError(f"{"-".join')


def test_pep701_fstrings_are_requoted_only_where_needed():
    source = 'x = f"{".".join(["a", "b"])}:{{literal}}:{len("abc")!r:>4}"\ny = "keep \\"quotes\\""  # f"{"\n'
    new, _ = pep695.rewrite(source)
    ns = {}
    exec(compile(new, "<f>", "exec", dont_inherit=True), ns)
    assert ns["x"] == "a.b:{literal}:   3" and ns["y"] == 'keep "quotes"'
    assert new.splitlines()[1] == source.splitlines()[1]          # a comment and a plain string untouched
    assert pep695.rewrite("z = f'{x}' + \"{y}\"\n")[0] == "z = f'{x}' + \"{y}\"\n"   # valid 3.11: unchanged


@pytest.mark.parametrize("source, message", [
    ("type Alias = int\n", "`type` alias statements"),
    ("class C[*Ts]:\n    pass\n", "TypeVarTuple / ParamSpec"),
    ("def f[**P](x): pass\n", "TypeVarTuple / ParamSpec"),
    ("class C[T = int]:\n    pass\n", "defaults (PEP 696)"),
    ('x = f"{"\\n".join(y)}"\n', "backslash in an f-string expression"),
])
def test_what_it_does_not_handle_fails_naming_the_line(source, message):
    with pytest.raises(pep695.RewriteError, match=re.escape(message)) as info:
        pep695.rewrite(source)
    assert "line 1" in str(info.value)


def test_names_called_type_are_not_alias_statements():
    source = "type = 3\nx = type\nprint(type(x))\n"
    assert pep695.rewrite(source)[0] == source


def test_get_original_bases_backport_reads_the_class_own_bases():
    T = typing.TypeVar("T")

    class A(typing.Generic[T]):
        pass

    class B(A[int]):
        pass

    class C(B):
        pass

    assert pep695.get_original_bases(B) == (A[int],)
    assert pep695.get_original_bases(C) == (B,)           # not B's __orig_bases__, which C inherits
    assert pep695.get_original_bases(int) == (object,)
    with pytest.raises(TypeError, match="instance of type"):
        pep695.get_original_bases(3)
    if sys.version_info >= (3, 12):
        for cls in (A, B, C, int):
            assert pep695.get_original_bases(cls) == types.get_original_bases(cls)


def test_the_import_hook_rewrites_only_its_package_and_writes_no_bytecode(tmp_path, monkeypatch):
    pkg = tmp_path / "pgspec_pep695_probe"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "mod.py").write_text(GENERIC)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(types, "get_original_bases", pep695.get_original_bases, raising=False)
    before = list(sys.meta_path)
    try:
        installed = pep695.install("pgspec_pep695_probe")
        assert installed == (sys.version_info < (3, 12))
        import pgspec_pep695_probe.mod as mod

        assert mod.Layer.config_class is mod.SubConfig
        assert mod.Holder.get.__code__.co_firstlineno == _headers(GENERIC)[-1][0]
        assert mod.__file__ == str(pkg / "mod.py")
        assert not (pkg / "__pycache__").exists() or sys.version_info >= (3, 12)
    finally:
        sys.meta_path[:] = before
        for name in [m for m in sys.modules if m.partition(".")[0] == "pgspec_pep695_probe"]:
            del sys.modules[name]


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="the refusal is for Python < 3.12")
def test_without_the_opt_in_python_3_11_is_refused_naming_both_ways(monkeypatch, tmp_path):
    monkeypatch.delenv("PGSPEC_FAST_LLM_COMPAT", raising=False)
    with pytest.raises(RuntimeError, match="Fast-LLM needs Python >= 3.12.*PGSPEC_FAST_LLM_COMPAT=pep695"):
        loader.load(tmp_path)
    monkeypatch.setenv("PGSPEC_FAST_LLM_COMPAT", "off")
    assert not loader.rewritten()
    monkeypatch.setenv("PGSPEC_FAST_LLM_COMPAT", "pep695")
    assert loader.rewritten()


def test_a_rewrite_that_moved_lines_is_refused(monkeypatch):
    """The guard behind every rewrite: a line added or lost would make every later line number wrong."""
    monkeypatch.setattr(pep695, "rewrite_generics", lambda source: ("\n" + source, []))
    with pytest.raises(pep695.RewriteError, match=r"changed the line count \(1 -> 2\)"):
        pep695.rewrite("x = 1\n", "m.py")
