"""Small recommendation models for examples, tests and benchmarks (like ``torchrec.models``).

``SequenceDLRM`` is the model of ``example.py`` and of workload W-quality.
"""

from dynemb.models.sequence_dlrm import SequenceDLRM, mean_of_rows

__all__ = ["SequenceDLRM", "mean_of_rows"]
