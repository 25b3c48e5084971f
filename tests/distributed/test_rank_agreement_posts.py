"""A rank that posts its outcome at a step and then fails (rank 0 of a delta
publication posts its write error, raises it, and its RankAgreement announces the
failure): a rank waiting at that step takes the post, even when it polled just before
the post and sees the announcement first. It raised RankFailure instead, and the
publication's other ranks then raised RankFailure, not rank 0's OSError
(tests/deltas/test_delta_sharded.py met that race on a loaded host)."""

import json

import pytest
import torch.distributed as dist

from dynemb.distributed.rank_faults import RankAgreement, RankFailure

pytestmark = pytest.mark.no_emulated_pass("the agreement is Python over a store, no table op")


class _LatePost:
    """A store whose first check of ``key`` misses it: the post lands between a
    waiter's poll of the step and its look at the failure announcement."""

    def __init__(self, store, key: str):
        self._store, self._key, self._missed = store, key, False

    def check(self, keys):
        if keys == [self._key] and not self._missed:
            self._missed = True
            return False
        return self._store.check(keys)

    def __getattr__(self, name):
        return getattr(self._store, name)


def _waiter(store) -> RankAgreement:
    """Rank 1 of 2 waiting on ``store``."""
    agreement = RankAgreement(None, "test", timeout=5)
    agreement.rank, agreement.world_size, agreement._store = 1, 2, store
    return agreement


def test_a_post_made_before_the_failure_is_taken():
    store = dist.HashStore()
    outcome = {"failed": "FileExistsError: exists already"}
    store.set("written/0", json.dumps(outcome))
    store.set("failed", json.dumps({"rank": 0, "error": "FileExistsError: exists already"}))
    agreement = _waiter(_LatePost(store, "written/0"))
    assert agreement.post("written", None, root=0) == [outcome]


def test_an_error_posted_before_the_failure_names_it():
    store = dist.HashStore()
    store.set("step/0", json.dumps({"error": "ValueError: bad"}))
    store.set("failed", json.dumps({"rank": 0, "error": "ValueError: bad"}))
    agreement = _waiter(_LatePost(store, "step/0"))
    with pytest.raises(RankFailure, match="rank 0 of 2 failed: ValueError: bad"):
        agreement.post("step", 1)


def test_a_rank_that_failed_without_posting_is_named():
    store = dist.HashStore()
    store.set("failed", json.dumps({"rank": 0, "error": "OSError: disk"}))
    agreement = _waiter(store)
    with pytest.raises(RankFailure, match="rank 0 of 2 failed: OSError: disk"):
        agreement.post("written", None, root=0)
