"""Python reads the op contract's codes from csrc/core (dynemb._C.constants); the public
enums must agree with them. tests/support/reference.py keeps an independent copy on purpose."""

import pytest
import torch

from dynemb import _ops
from dynemb.dynamicemb_config import init_mode_code
from dynemb.optimizer import EmbOptimType, OptimizerConfig
from dynemb.types import DynamicEmbInitializerMode, DynamicEmbPoolingMode, DynamicEmbScoreStrategy
from tests.support import decay_reference as decay
from tests.support import reference as ref

pytestmark = pytest.mark.no_emulated_pass("constants read from csrc/core: the same in every pass")


def test_public_score_strategies_are_the_core_codes():
    for s in DynamicEmbScoreStrategy:
        assert _ops.SCORE_STRATEGY_CODES[s.name] == s.value
    assert _ops.TIMESTAMP_LFU == ref.TIMESTAMP_LFU
    assert _ops.CACHE_SCORES == ref.CACHE


def test_statuses_pooling_and_initializer_codes_are_the_core_codes():
    assert [s.name for s in _ops.Status] == ["HIT", "INSERTED", "EVICTED", "FAILED"]
    assert [int(s) for s in _ops.Status] == [0, 1, 2, 3]
    assert _ops.STATUS_COUNT == len(_ops.Status)
    for mode in (DynamicEmbPoolingMode.SUM, DynamicEmbPoolingMode.MEAN):
        assert _ops.POOLING_CODES[mode.name] == mode.value
    codes = {mode: init_mode_code(mode) for mode in DynamicEmbInitializerMode}
    assert codes == {m: _ops.INIT_MODE_CODES[m.name] for m in DynamicEmbInitializerMode}
    assert sorted(codes.values()) == list(range(len(DynamicEmbInitializerMode)))


def test_row_formats_are_the_core_codes():
    from dynemb.inference.quantize import FORMATS

    assert _ops.ROW_FORMAT_CODES == {"INT8": 0, "E4M3": 1}
    assert FORMATS == {torch.int8: 0, torch.float8_e4m3fn: 1}


@pytest.mark.parametrize(
    "optimizer, columns",
    [
        (EmbOptimType.EXACT_SGD, lambda d: 0),
        (EmbOptimType.SGD, lambda d: 0),
        (EmbOptimType.EXACT_ADAGRAD, lambda d: d),
        (EmbOptimType.EXACT_ROWWISE_ADAGRAD, lambda d: 1),
        (EmbOptimType.ADAM, lambda d: 2 * d),
    ],
)
def test_optimizer_state_columns_come_from_the_core(optimizer, columns):
    for dim in (1, 8, 128):
        assert OptimizerConfig(optimizer=optimizer).state_columns(dim) == columns(dim)


def test_spill_window_is_one_bucket_when_evicting_else_home_and_second_bucket():
    assert _ops.spill_window(DynamicEmbScoreStrategy.LFU.value, 64) == 1
    no_eviction = DynamicEmbScoreStrategy.NO_EVICTION.value
    assert _ops.spill_window(no_eviction, 64) == _ops.MAX_PROBE_BUCKETS == 2
    assert _ops.spill_window(no_eviction, 2) == 2
    assert _ops.spill_window(no_eviction, 1) == 1  # no second bucket in a table of one
    assert _ops.SECOND_BUCKET_SPAN == 16


def test_batch_value_follows_the_cores_rule():
    clock = iter([10**12]).__next__
    assert _ops.batch_value(DynamicEmbScoreStrategy.TIMESTAMP.value, 7, clock) == 10**12
    assert _ops.batch_value(_ops.TIMESTAMP_LFU, 7, lambda: 5) == 5
    assert _ops.batch_value(DynamicEmbScoreStrategy.STEP.value, 7, clock) == 7
    for s in (DynamicEmbScoreStrategy.LFU, DynamicEmbScoreStrategy.CUSTOMIZED):
        assert _ops.batch_value(s.value, 7, clock) == 0
    assert _ops.BATCH_VALUE_SOURCES[_ops.CACHE_SCORES] == "batch_number"


def test_scores_after_hit_is_the_cores_score_rule():
    old = torch.tensor([0, 5, 2**63 - 1], dtype=torch.int64)
    acc = torch.tensor([1, 3, 4], dtype=torch.int64)
    s = DynamicEmbScoreStrategy
    assert _ops.scores_after_hit(old, s.TIMESTAMP.value, 4).tolist() == [4, 5, 2**63 - 1]
    assert _ops.scores_after_hit(old, s.STEP.value, 6).tolist() == [6, 6, 2**63 - 1]
    # LFU counts saturate at INT64_MAX (_ops.MAX_SCORE), never wrap to a negative score.
    assert _ops.scores_after_hit(old, s.LFU.value, 0, acc).tolist() == [1, 8, 2**63 - 1]
    assert _ops.scores_after_hit(old, s.LFU.value, 0).tolist() == [1, 6, 2**63 - 1]
    custom = torch.full_like(old, 9)
    assert _ops.scores_after_hit(old, s.CUSTOMIZED.value, 0, None, custom).tolist() == [9] * 3
    assert _ops.scores_after_hit(old, s.NO_EVICTION.value, 0).tolist() == old.tolist()
    with pytest.raises(ValueError, match="custom"):
        _ops.scores_after_hit(old, s.CUSTOMIZED.value, 0)
    with pytest.raises(ValueError, match="accesses"):
        _ops.scores_after_hit(old, s.LFU.value, 0, acc[:2])


def test_scores_after_hit_decays_and_scores_a_zero_as_a_new_key():
    """DECAYED_LFU in a cache tier: 0 is a key new to the table (its access scored as
    new, tests/support/decay_reference.py), any other score merges the batch's accesses."""
    old = decay.access_score(3, 2, 5)
    scores = torch.tensor([0, old, 0], dtype=torch.int64)
    acc = torch.tensor([3, 1, 0], dtype=torch.int64)
    code = DynamicEmbScoreStrategy.DECAYED_LFU.value
    got = _ops.scores_after_hit(scores, code, 0, acc, None, 5, 9).tolist()
    assert got == [decay.touched(None, 9, 3, 5), decay.touched(old, 9, 1, 5), 0]
    with pytest.raises(ValueError, match=r"needs half_life in \[1, 2147483647\], got 0"):
        _ops.scores_after_hit(scores, code, 0, acc)
    with pytest.raises(ValueError, match="decay_step must be in"):
        _ops.scores_after_hit(scores, code, 0, acc, None, 5, -1)
    with pytest.raises(ValueError, match="takes no half_life or decay_step, got 5 and 0"):
        _ops.scores_after_hit(scores, DynamicEmbScoreStrategy.LFU.value, 0, acc, None, 5)
