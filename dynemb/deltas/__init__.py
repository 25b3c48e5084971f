"""Versioned deltas: training publishes a base checkpoint and then the rows it upserted
and the keys it removed since the previous delta; a serving table replays them
(``InferenceEmbeddingCollection.apply_delta``). See DynamicEmb_APIs.md, "Deltas"."""

from dynemb.deltas.format import Delta, DeltaVersionError, TableDelta, delta_path, read_delta
from dynemb.deltas.publisher import DeltaPublisher

__all__ = ["Delta", "DeltaPublisher", "DeltaVersionError", "TableDelta", "delta_path", "read_delta"]
