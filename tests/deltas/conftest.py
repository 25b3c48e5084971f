"""Fixtures of the delta tests."""

import threading

import pytest

from dynemb.deltas import publisher as publisher_module


@pytest.fixture
def gated(monkeypatch):
    """The publisher's writes wait for ``gate.set()`` (each write, on the writer thread)."""
    gate = threading.Event()
    write = publisher_module.write_delta

    def held(*args, **kwargs):
        assert gate.wait(timeout=30), "the test never opened the gate"
        return write(*args, **kwargs)

    monkeypatch.setattr(publisher_module, "write_delta", held)
    return gate
