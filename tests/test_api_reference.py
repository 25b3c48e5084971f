"""DynamicEmb_APIs.md names every public name: each entry of ``__all__`` of ``dynemb`` and
of DynamicEmb's module paths appears in the reference (as a whole word)."""

import importlib
import pathlib
import re

import pytest

from tests.support.import_graph import import_graph

pytestmark = pytest.mark.no_emulated_pass("reads a document; runs no table op")

REFERENCE = pathlib.Path(__file__).resolve().parent.parent / "DynamicEmb_APIs.md"
# The front (pyproject.toml's import-linter contract): dynemb and DynamicEmb's module paths.
PUBLIC_MODULES = import_graph.FRONT


@pytest.mark.parametrize("module_name", PUBLIC_MODULES)
def test_reference_names_every_public_name(module_name):
    module = importlib.import_module(module_name)
    names = module.__all__
    assert names, f"{module_name}.__all__ is empty"
    text = REFERENCE.read_text()
    missing = [
        name for name in names if not re.search(r"(?<![\w])" + re.escape(name) + r"(?![\w])", text)
    ]
    assert not missing, f"DynamicEmb_APIs.md does not name {module_name}'s {missing}"
