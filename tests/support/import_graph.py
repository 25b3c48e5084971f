"""tools/import_graph.py, loaded for the tests (tools/ is not a package): the import
graph's checks and ``FRONT``, the front modules as pyproject.toml's contract lists them."""

import importlib.util
import pathlib

_TOOL = pathlib.Path(__file__).resolve().parents[2] / "tools" / "import_graph.py"
_spec = importlib.util.spec_from_file_location("import_graph", _TOOL)
import_graph = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(import_graph)
