"""DynamicEmb's ``dynamicemb.embedding_admission``: the admission counters and strategy.

A front module: ``KVCounter`` and ``FrequencyAdmissionStrategy`` are dynemb.admission's,
``MultiTableKVCounter`` dynemb.multi_table_counter's; no module of dynemb imports it.
"""

from dynemb.admission import FrequencyAdmissionStrategy, KVCounter
from dynemb.multi_table_counter import MultiTableKVCounter

__all__ = ["FrequencyAdmissionStrategy", "KVCounter", "MultiTableKVCounter"]
