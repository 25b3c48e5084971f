"""A delta whose checksums were recomputed by whoever changed it is still checked for
what they cannot vouch for: a key upserted and tombstoned at once, a key given twice, a
negative score, or a table its base checkpoint does not hold, are refused naming the
delta, and the served tables do not change."""

import dataclasses
import shutil

import pytest
import torch

from dynemb.deltas import delta_path
from dynemb.deltas.format import read_delta, table_delta_meta, write_delta
from dynemb.dump_files.format import CheckpointError
from tests.support.delta_chains import lookup, one_table_chain, serving_base

KEYS = torch.arange(-5, 30)


@pytest.fixture
def chain(tmp_path):
    """A base and delta 1 of one table ``t`` (keys 0..11 upserted, key 3 tombstoned)."""
    return one_table_chain(tmp_path / "chain", [(torch.arange(12), 3)])


def _forge(publisher, change) -> None:
    """Rewrites delta 1 with ``change(tables)`` applied, checksums recomputed."""
    path = delta_path(publisher.directory, 1)
    delta = read_delta(path)
    tables = change(dict(delta.tables))
    shutil.rmtree(path)
    meta = {
        n: table_delta_meta(d.dim, d.values.dtype, 0, d.score_strategy) for n, d in tables.items()
    }
    write_delta(
        publisher.directory,
        1,
        delta.base_dump_id,
        False,
        {n: (meta[n], d) for n, d in tables.items()},
    )


def _with(t, **fields):
    return dataclasses.replace(t, **fields)


def _upsert_tombstoned(tables):
    t = tables["t"]
    return {"t": _with(t, tombstones=torch.cat([t.tombstones, t.keys[:1]]))}


def _upsert_twice(tables):
    t = tables["t"]
    twice = lambda x: torch.cat([x, x[:1]])  # noqa: E731
    return {"t": _with(t, keys=twice(t.keys), values=twice(t.values), scores=twice(t.scores))}


def _tombstone_twice(tables):
    t = tables["t"]
    return {"t": _with(t, tombstones=torch.cat([t.tombstones, t.tombstones]))}


def _negative_score(tables):
    t = tables["t"]
    return {"t": _with(t, scores=torch.cat([t.scores[:1] * 0 - 7, t.scores[1:]]))}


def _unknown_table(tables):
    return {**tables, "evil": tables["t"]}


FORGERIES = {
    "a key upserted and tombstoned": (_upsert_tombstoned, r"both upserts and tombstones key"),
    "a key upserted twice": (_upsert_twice, r"has key \d+ upserted twice"),
    "a key tombstoned twice": (_tombstone_twice, r"has key 3 tombstoned twice"),
    "a negative score": (_negative_score, r"has score -7 < 0 for key"),
    "a table the base lacks": (_unknown_table, r"tables \['evil'\] are not tables of its base"),
}


@pytest.mark.parametrize("forgery", FORGERIES)
def test_a_forged_delta_is_refused_naming_it_and_changes_nothing(chain, forgery):
    change, message = FORGERIES[forgery]
    _forge(chain, change)
    serving = serving_base(chain)
    before = lookup(serving, KEYS)
    path = delta_path(chain.directory, 1)
    with pytest.raises(CheckpointError, match=str(path) + ".*" + message):
        serving.apply_delta(path)
    assert serving.delta_version == 0
    assert torch.equal(lookup(serving, KEYS), before)


def test_the_published_delta_applies(chain):
    serving = serving_base(chain)
    assert serving.apply_delta(delta_path(chain.directory, 1)) == 1
    assert serving.sizes == [11]
