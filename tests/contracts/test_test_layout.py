"""No test file imports another test file or conftest: what tests share lives in tests/support (imported as
`from support.<module> import ...`), and conftest.py holds the fixtures and hooks alone. A test file is pytest's to
collect and a conftest pytest's to load: neither is a library for the other tests."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def forbidden(module: str) -> bool:
    """A test module (test_*) or a conftest, at any level of a dotted name."""
    return any(part.startswith("test_") or part == "conftest" for part in module.split("."))


def scan(source: str, name: str) -> list[str]:
    """`name:line: import X` for every import in `source` of a test module or conftest, nested ones included."""
    found = []
    imports = [node for node in ast.walk(ast.parse(source, name)) if isinstance(node, (ast.Import, ast.ImportFrom))]
    for node in sorted(imports, key=lambda node: node.lineno):
        if isinstance(node, ast.ImportFrom) and node.module:
            modules = [node.module]
        else:  # `import test_x`, and `from . import test_x`: the modules are the names
            modules = [alias.name for alias in node.names]
        found += [f"{name}:{node.lineno}: import {module}" for module in modules if forbidden(module)]
    return found


def test_no_test_file_imports_another_test_file_or_conftest() -> None:
    files = sorted(TESTS.rglob("*.py"))
    found = [hit for path in files for hit in scan(path.read_text(), str(path.relative_to(TESTS.parent)))]
    assert len(files) > 100 and not found, "move what they share to tests/support:\n" + "\n".join(found)


def test_the_scan_finds_an_import_of_a_test_file_or_conftest() -> None:
    source = (
        "import os\n"
        "import test_split\n"
        "from conftest import make_project\n"
        "from support.splits import schema_for\n"
        "def helper():\n"
        "    from test_hf import FILLER\n"
        "from . import gpu_kit, test_skips\n"
        "from .test_distributed import BY_KIND\n"
    )
    assert scan(source, "t.py") == [
        "t.py:2: import test_split",
        "t.py:3: import conftest",
        "t.py:6: import test_hf",
        "t.py:7: import test_skips",
        "t.py:8: import test_distributed",
    ]


def test_no_test_file_is_named_by_how_its_tests_came_about() -> None:
    """A file is named by the module or the guarantee its tests guard, so that a newcomer finds the tests of a module
    where they would look: never by how they came about (test_exact_*, test_survivors_*: which mutation run found
    them) nor as a second file of one name (*_2.py). Where tests came from is for commit messages."""
    files = sorted(TESTS.rglob("*.py"))
    named = [
        path.relative_to(TESTS.parent).as_posix()
        for path in files
        if path.name.startswith(("test_exact_", "test_survivors_")) or path.name.endswith("_2.py")
    ]
    assert len(files) > 100 and not named, "name each file by what its tests guard:\n" + "\n".join(named)
