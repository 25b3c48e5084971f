"""Datasets for examples, tests and benchmarks (like ``torchrec.datasets``).

``SyntheticClicks`` is workload W-quality's click-through dataset: Zipf ids, a hidden
vector per id and a known click function, so that a model's held-out AUC can be
compared with the best possible one. See DynamicEmb_APIs.md, section Datasets.
"""

from dynemb.datasets.click_batches import ClickBatches, spread_ids
from dynemb.datasets.click_rows import ClickRows
from dynemb.datasets.roc_auc import roc_auc
from dynemb.datasets.synthetic_clicks import SyntheticClicks

__all__ = ["ClickBatches", "ClickRows", "SyntheticClicks", "roc_auc", "spread_ids"]
