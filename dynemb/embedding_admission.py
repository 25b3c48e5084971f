"""DynamicEmb's ``dynamicemb.embedding_admission``: the admission counters and strategies.

A front module: ``KVCounter``, ``FrequencyAdmissionStrategy`` and
``ProbabilisticAdmissionStrategy`` are dynemb.admission_strategies's, ``MultiTableKVCounter``
dynemb.multi_table_counter's; no module of dynemb imports it.
"""

from dynemb.admission_strategies import (
    FrequencyAdmissionStrategy,
    KVCounter,
    ProbabilisticAdmissionStrategy,
)
from dynemb.multi_table_counter import MultiTableKVCounter

__all__ = [
    "FrequencyAdmissionStrategy",
    "KVCounter",
    "MultiTableKVCounter",
    "ProbabilisticAdmissionStrategy",
]
