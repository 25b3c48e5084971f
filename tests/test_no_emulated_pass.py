"""The no_emulated_pass marker (tests/conftest.py): a marked test is skipped, with its
reason, in the DYNEMB_EXECUTOR=cuda-emulated pass only; a marker without a reason is an
error."""

import pytest

from tests import conftest


class _Item:
    def __init__(self, *args):
        self.nodeid = "tests/test_x.py::test_x"
        self.marker = pytest.mark.no_emulated_pass(*args).mark if args is not None else None
        self.added = []

    def get_closest_marker(self, name):
        return self.marker if name == "no_emulated_pass" else None

    def add_marker(self, marker):
        self.added.append(marker.mark)


@pytest.mark.parametrize("executor", [None, "cpu"])
def test_marked_tests_run_outside_the_emulated_pass(monkeypatch, executor):
    if executor is None:
        monkeypatch.delenv("DYNEMB_EXECUTOR", raising=False)
    else:
        monkeypatch.setenv("DYNEMB_EXECUTOR", executor)
    item = _Item("file format")
    conftest.pytest_collection_modifyitems(None, [item])
    assert item.added == []


def test_marked_tests_are_skipped_with_their_reason_in_the_emulated_pass(monkeypatch):
    monkeypatch.setenv("DYNEMB_EXECUTOR", "cuda-emulated")
    marked, plain = _Item("file format"), _Item()
    plain.marker = None
    conftest.pytest_collection_modifyitems(None, [marked, plain])
    assert [(m.name, m.kwargs) for m in marked.added] == [
        ("skip", {"reason": "no_emulated_pass: file format"})
    ]
    assert plain.added == []


def test_a_marker_without_a_reason_is_an_error(monkeypatch):
    monkeypatch.setenv("DYNEMB_EXECUTOR", "cuda-emulated")
    with pytest.raises(pytest.UsageError, match="test_x.*needs a reason"):
        conftest.pytest_collection_modifyitems(None, [_Item()])
