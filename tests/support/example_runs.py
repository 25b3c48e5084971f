"""Runs example.py as a user does, in a process of its own (the tests of publishing
and serving: test_example_serve.py, attack/test_serve_gaps.py)."""

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_example(args: list[str], launcher: tuple[str, ...] = (), **env: str) -> str:
    """Runs ``example.py args`` from the repository root (under ``launcher``, e.g.
    torchrun's arguments, when given) with ``env`` added and no rank variables
    inherited; asserts that it succeeded and returns its stdout."""
    command = [sys.executable, *launcher, "example.py", *args]
    environment = dict(os.environ, PYTHONPATH=str(REPO), **env)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        environment.pop(name, None)
    done = subprocess.run(
        command, cwd=REPO, env=environment, capture_output=True, text=True, timeout=300
    )
    # both streams: where the output stops tells which phase failed
    assert done.returncode == 0, f"stdout:\n{done.stdout[-2000:]}\nstderr:\n{done.stderr[-3000:]}"
    return done.stdout
