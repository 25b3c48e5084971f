"""The test tree's own rule (docs/development.md): what tests share lives in
tests/support (or a conftest.py fixture); no test module imports from another test
module, and tests/support holds no tests."""

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

pytestmark = pytest.mark.no_emulated_pass("reads the test tree: no table op runs")


def _imported_modules(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
            package = TESTS.parent.joinpath(*node.module.split("."))
            if package.is_dir():  # `from tests.table import test_x`: the names are modules
                names += [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names += [a.name for a in node.names]
    return names


def test_no_test_module_imports_another():
    offenders = []
    for path in sorted(TESTS.rglob("*.py")):
        for module in _imported_modules(path):
            parts = module.split(".")
            if parts[0] == "tests" and any(p.startswith("test_") for p in parts[1:]):
                offenders.append(f"{path.relative_to(TESTS.parent)} imports {module}")
    assert not offenders, "move the shared code to tests/support:\n" + "\n".join(offenders)


def test_support_holds_no_tests():
    found = sorted(p.name for p in (TESTS / "support").glob("test_*.py"))
    assert not found, f"tests/support is collected by nobody: {found}"


def test_shared_modules_live_in_support():
    stray = sorted(
        str(p.relative_to(TESTS.parent))
        for p in TESTS.rglob("*.py")
        if "support" not in p.relative_to(TESTS).parts
        and not p.name.startswith("test_")
        and p.name not in ("conftest.py", "__init__.py")
    )
    assert not stray, f"modules that are not tests belong in tests/support: {stray}"
