"""``Cache``: the interface of a fast tier in front of a ``Storage`` (DynamicEmb's
``dynamicemb.types.Cache``); dynemb's ``CachedTable`` implements it."""

import abc

import torch


class Cache(abc.ABC):
    """A cache of a table's rows in front of the slow tier that holds every row.

    Training lookups go through the cache; ``prefetch`` brings a future batch's keys in
    ahead of time; ``sync`` / ``flush`` write the cached rows back; ``empty_cache``
    empties the cache after writing it back (the slow tier then holds the table).
    """

    @abc.abstractmethod
    def prefetch(self, keys: torch.Tensor) -> int:
        """Brings distinct keys ((n,) int64) of a future training batch into the cache;
        returns the batch number."""

    @abc.abstractmethod
    def find(self, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows ((n, dim)) and found ((n,) bool) of keys over both tiers; changes nothing."""

    @abc.abstractmethod
    def sync(self) -> None:
        """Writes every cached row (and score) back to the slow tier; the cache keeps them."""

    @abc.abstractmethod
    def flush(self) -> None:
        """``sync``, then persists the slow tier where it has a directory."""

    @abc.abstractmethod
    def empty_cache(self) -> None:
        """``sync``, then empties the cache."""

    @abc.abstractmethod
    def cache_size(self) -> int:
        """Rows held by the cache."""


__all__ = ["Cache"]
