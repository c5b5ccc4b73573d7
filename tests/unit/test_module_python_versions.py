"""The collection's modules and module_utils run with the managed node's Python: 3.6 (CentOS/RHEL 8) or 2.7
(CentOS 7). Their source must parse as Python 3.6 and use nothing that Python 2.7 cannot parse or import: types live
in PEP 484 type comments, and `typing` is imported only where the node never runs it."""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

import pytest

from installer import content

SOURCES = sorted((content.root() / "plugins").rglob("*.py"))


def _typing_only(node: ast.If) -> bool:
    """`if False:` -- the block the checker reads and the node skips."""
    return isinstance(node.test, ast.Constant) and node.test.value is False


def py27_problems(source: str, name: str = "<source>") -> list[str]:
    """What in `source` Python 2.7 cannot parse or import (beyond the Python 3.6 grammar, checked by ast.parse's
    feature_version), each as `line: what`."""
    tree = ast.parse(source, name, feature_version=(3, 6))
    out: list[str] = []

    def bad(node: ast.AST, what: str) -> None:
        out.append(f"{getattr(node, 'lineno', '?')}: {what}")

    guarded: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _typing_only(node):
            guarded.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.Lambda):
            args = node.args
            if isinstance(node, ast.FunctionDef) and node.returns is not None:
                bad(node, f"return annotation on {node.name}() (use a type comment)")
            for a in args.posonlyargs + args.args + args.kwonlyargs + [x for x in (args.vararg, args.kwarg) if x]:
                if a.annotation is not None:
                    bad(a, f"annotation on argument {a.arg} (use a type comment)")
            if args.kwonlyargs or args.posonlyargs:
                bad(node, "keyword-only or positional-only arguments")
        elif isinstance(node, ast.AnnAssign):
            bad(node, "variable annotation (use a type comment)")
        elif isinstance(node, ast.JoinedStr):
            bad(node, "f-string")
        elif isinstance(node, ast.Nonlocal):
            bad(node, "nonlocal")
        elif isinstance(node, ast.YieldFrom):
            bad(node, "yield from")
        elif isinstance(node, ast.AsyncFunctionDef | ast.Await | ast.AsyncFor | ast.AsyncWith):
            bad(node, "async")
        elif isinstance(node, ast.Raise) and node.cause is not None:
            bad(node, "raise ... from")
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
            bad(node, "@ operator")
        elif isinstance(node, ast.Dict) and None in node.keys:
            bad(node, "{**mapping} in a dict display")
        elif isinstance(node, ast.Starred) and not _call_star(tree, node):
            bad(node, "* unpacking outside a call")
        elif isinstance(node, ast.Call):
            if sum(isinstance(a, ast.Starred) for a in node.args) > 1 or sum(k.arg is None for k in node.keywords) > 1:
                bad(node, "more than one *args or **kwargs in a call")
            if isinstance(node.func, ast.Name) and node.func.id == "super" and not node.args:
                bad(node, "super() without arguments")
        elif isinstance(node, ast.ImportFrom) and node.module == "__future__":
            if any(a.name == "annotations" for a in node.names):
                bad(node, "from __future__ import annotations")
        if isinstance(node, ast.Import | ast.ImportFrom) and id(node) not in guarded:
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            if any(m.split(".")[0] in ("typing", "typing_extensions") for m in modules):
                bad(node, "typing imported outside `if False:` (2.7 has no typing module)")
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.NUMBER and "_" in tok.string:
            out.append(f"{tok.start[0]}: underscore in the number {tok.string}")
    return out


def _call_star(tree: ast.AST, star: ast.Starred) -> bool:
    return any(isinstance(n, ast.Call) and any(a is star for a in n.args) for n in ast.walk(tree))


def test_the_modules_are_found() -> None:
    names = {p.relative_to(content.root()).as_posix() for p in SOURCES}
    assert {"plugins/modules/daemon_json.py", "plugins/module_utils/files.py"} <= names, names


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_module_source_runs_on_python_27_and_36(path: Path) -> None:
    assert py27_problems(path.read_text(encoding="utf-8"), str(path)) == []


@pytest.mark.parametrize("source, problem", [
    ("def f(x: int):\n    pass\n", "annotation on argument x"),
    ("def f(x) -> int:\n    return x\n", "return annotation on f()"),
    ("x: int = 1\n", "variable annotation"),
    ("x = f'{1}'\n", "f-string"),
    ("def f():\n    x = 1\n    def g():\n        nonlocal x\n", "nonlocal"),
    ("def f(*, k):\n    pass\n", "keyword-only"),
    ("try:\n    pass\nexcept ValueError as e:\n    raise KeyError() from e\n", "raise ... from"),
    ("def f():\n    yield from []\n", "yield from"),
    ("a, *b = [1, 2]\n", "* unpacking outside a call"),
    ("x = [*a, *b]\n", "* unpacking outside a call"),
    ("x = {**a}\n", "{**mapping}"),
    ("f(*a, *b)\n", "more than one *args"),
    ("class A(B):\n    def f(self):\n        super().f()\n", "super() without arguments"),
    ("from typing import List\n", "typing imported outside"),
    ("import typing\n", "typing imported outside"),
    ("from __future__ import annotations\n", "from __future__ import annotations"),
    ("x = 1_000\n", "underscore in the number"),
])
def test_each_python27_breaker_is_named(source: str, problem: str) -> None:
    found = py27_problems(source)
    assert len(found) >= 1 and any(problem in p for p in found), found


def test_python27_safe_forms_pass() -> None:
    source = ("if False:  # typing only\n    from typing import Any  # noqa: F401\n\n\n"
              "def f(a, *args, **kw):\n    # type: (Any, *str, **int) -> dict[str, Any]\n"
              "    return dict(kw, a=a, rest=list(args), x=f(*args, **kw), y=u'', z=b'', m=0o755)\n"
              "class A(object):\n    def f(self):\n        return super(A, self).f()\n")
    assert py27_problems(source) == []


def test_python36_grammar_is_enforced() -> None:
    with pytest.raises(SyntaxError):
        py27_problems("if (n := 1):\n    pass\n")
