"""A warm-start source that records what it is asked: one entry per read."""

import torch

from dynemb.warm_start import WarmStart


class CountingSource(WarmStart):
    """Wraps ``source``; ``asked`` holds the keys of each read (empty probes left out)."""

    def __init__(self, source: WarmStart) -> None:
        self.source, self.asked = source, []
        self.dim, self.dtype, self.state_columns = source.dim, source.dtype, source.state_columns

    def rows(self, keys: torch.Tensor):
        if keys.numel():
            self.asked.append(sorted(keys.tolist()))
        return self.source.rows(keys)

    def keys_asked(self) -> list[int]:
        return sorted(k for read in self.asked for k in read)
