"""Shared fixtures: every table test takes a `device` (cpu always, cuda when built and present)."""

import dynemb._C as _C
import pytest
import torch

DEVICES = ["cpu"] + (["cuda"] if _C.with_cuda and torch.cuda.is_available() else [])


@pytest.fixture(params=DEVICES)
def device(request):
    return torch.device(request.param)
