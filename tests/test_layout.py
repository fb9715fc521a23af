"""The test suite's own layout: test modules share code only through tests/helpers/."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).parent


def imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports, anywhere in it, relative ones as written (``.test_x``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            found.add(module)
            if not node.module:  # from . import test_x
                found.update(module + alias.name for alias in node.names)
    return found


def test_no_test_module_imports_conftest_or_another_test_module() -> None:
    offending = {
        f"{path.name}: {module}"
        for path in sorted(TESTS.glob("test_*.py"))
        for module in imported_modules(path)
        if module.rsplit(".", 1)[-1] == "conftest" or module.rsplit(".", 1)[-1].startswith("test_")
    }
    assert not offending, "shared code belongs in tests/helpers/: " + ", ".join(sorted(offending))


def test_the_top_of_tests_holds_only_test_modules() -> None:
    """Helpers live in tests/helpers/, fixtures in conftest.py."""
    others = {p.name for p in TESTS.glob("*.py") if not p.name.startswith("test_")}
    assert others == {"__init__.py", "conftest.py"}, sorted(others - {"__init__.py", "conftest.py"})
