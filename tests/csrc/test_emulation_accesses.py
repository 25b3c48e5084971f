"""dynemb._ops.emulation_accesses(): the table bytes and lines the emulated executor's
ops touch, reported by TableRef's accessors (csrc/core/access_count.h). Exact counts
of one-key ops on small tables, whose every byte is known: the row, the key and digest
a claim writes, the score and pin an evicting hit rewrites. The ops run in a fresh
process with DYNEMB_EXECUTOR=cuda-emulated, whatever the pass."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.no_emulated_pass("runs its own process with the emulated executor")

ROOT = Path(__file__).resolve().parents[2]

_SCRIPT = """
import json, torch
from dynemb import _ops
from dynemb.table.scored_hash_table import ScoredHashTable
from dynemb.types import DynamicEmbScoreStrategy as S
out = {}
key = torch.tensor([12345])
for name, strategy in (("no_eviction", S.NO_EVICTION), ("timestamp", S.TIMESTAMP)):
    table = ScoredHashTable(dim=4, capacity=1024, score_strategy=strategy)
    table.find(key)
    out[name + " off"] = _ops.emulation_accesses()
    _ops.emulation_count_accesses(True)
    table.find_or_insert(key)
    out[name + " new"] = _ops.emulation_accesses(reset=True)
    table.find_or_insert(key)
    out[name + " hit"] = _ops.emulation_accesses(reset=True)
    table.find(key)
    out[name + " find"] = _ops.emulation_accesses(reset=True)
    _ops.emulation_count_accesses(False)
    table.find(key)
    out[name + " off again"] = _ops.emulation_accesses()
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def counts() -> dict[str, dict[str, int]]:
    env = dict(os.environ, DYNEMB_EXECUTOR="cuda-emulated")
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize("table", ["no_eviction", "timestamp"])
def test_nothing_is_counted_while_counting_is_off(counts, table):
    assert not any(counts[f"{table} off"].values())
    assert not any(counts[f"{table} off again"].values())


@pytest.mark.parametrize("table", ["no_eviction", "timestamp"])
def test_a_find_reads_its_row_and_writes_nothing(counts, table):
    c = counts[f"{table} find"]
    assert c["bytes_row_read"] == 4 * 4 and c["lines_row_read"] == 1  # dim 4 float32
    assert c["bytes_meta_written"] == c["bytes_row_written"] == 0
    # Its digests (a 16-byte group at least) and its key.
    assert c["bytes_meta_read"] >= 16 + 8 and c["lines_meta_read"] >= 2
    assert c["lines_meta"] == c["lines_meta_read"]


def test_a_new_key_writes_its_key_digest_and_row(counts):
    c = counts["no_eviction new"]
    assert c["bytes_meta_written"] == 8 + 1 and c["lines_meta_written"] == 2
    assert c["bytes_row_written"] == 4 * 4 and c["bytes_row_read"] == 0


def test_an_evicting_new_key_also_writes_its_score_and_pin(counts):
    c = counts["timestamp new"]
    assert c["bytes_meta_written"] == 8 + 1 + 8 + 4 and c["lines_meta_written"] == 4


def test_a_hit_rewrites_only_what_its_strategy_keeps(counts):
    assert counts["no_eviction hit"]["bytes_meta_written"] == 0
    c = counts["timestamp hit"]
    assert c["bytes_meta_written"] == 8 + 4 and c["lines_meta_written"] == 2  # score, pin
    assert c["bytes_row_read"] == 4 * 4 and c["bytes_row_written"] == 0
