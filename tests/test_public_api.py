"""The lab (tools/) uses sarpd only through declared public names: every
``from sarpd.X import name`` in tools/**/*.py names something in ``sarpd.X.__all__``
(or a public submodule, one that declares ``__all__``), and every sarpd module tools
import declares ``__all__``. import-linter checks modules (pyproject.toml: tools stay
off the core's private submodules); this checks names. Also: the declared names exist."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOOLS = sorted((ROOT / "tools").rglob("*.py"))


def sarpd_imports(path: Path) -> list[tuple[int, str, str | None]]:
    """(line, module, name) of every import of sarpd in a file (name None: ``import
    sarpd.X``), at any depth (imports inside functions count)."""
    found: list[tuple[int, str, str | None]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "sarpd" or node.module.startswith("sarpd."):
                found += [(node.lineno, node.module, a.name) for a in node.names]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name, None) for a in node.names
                      if a.name == "sarpd" or a.name.startswith("sarpd.")]
    return found


def public_submodule(module: str, name: str) -> bool:
    """`module.name` is a module that declares its public names."""
    try:
        sub = importlib.import_module(f"{module}.{name}")
    except ImportError:
        return False
    return hasattr(sub, "__all__")


def violations(path: Path) -> list[str]:
    out = []
    for line, module, name in sarpd_imports(path):
        where = f"{path.relative_to(ROOT)}:{line}"
        mod = importlib.import_module(module)
        declared = getattr(mod, "__all__", None)
        if name is None:
            if declared is None:
                out.append(f"{where}: import {module}: {module} declares no __all__")
        elif name == "*":
            out.append(f"{where}: from {module} import *: name what is used")
        elif (declared is not None and name in declared) or public_submodule(module, name):
            continue
        elif declared is None:
            out.append(f"{where}: from {module} import {name}: {module} declares no __all__")
        else:
            out.append(f"{where}: from {module} import {name}: not in {module}.__all__")
    return out


def test_tools_import_only_declared_public_names() -> None:
    assert TOOLS, "no tools/**/*.py found"
    bad = [v for path in TOOLS for v in violations(path)]
    assert not bad, "tools/ reach past sarpd's declared API:\n" + "\n".join(bad)


def test_the_check_catches_a_private_name(tmp_path: Path) -> None:
    """The checker itself: a private module, a name off __all__ and a module without
    __all__ are each reported; public names pass."""
    probe = ROOT / "tools" / "_probe_public_api.py"
    probe.write_text(
        "from sarpd.core.index import SarpIndex\n"  # core's __init__ declares it, not index
        "from sarpd.client import _Nope\n"
        "from sarpd.core import SarpIndex as S, native\n"
        "import sarpd.client\n"
    )
    try:
        bad = violations(probe)
    finally:
        probe.unlink()
    assert len(bad) == 2, bad
    assert "sarpd.core.index declares no __all__" in bad[0]
    assert "_Nope: not in sarpd.client.__all__" in bad[1]


@pytest.mark.parametrize("module", ["sarpd.client", "sarpd.core", "sarpd.model",
                                    "sarpd.config", "sarpd.errors", "sarpd.events.mapping",
                                    "sarpd.core.native", "sarpd.core.verify"])
def test_every_declared_name_exists(module: str) -> None:
    mod: ModuleType = importlib.import_module(module)
    missing = [n for n in mod.__all__ if not hasattr(mod, n)]
    assert not missing, f"{module}.__all__ names what it does not define: {missing}"
    assert len(set(mod.__all__)) == len(mod.__all__), f"{module}.__all__ repeats a name"
