"""The rows of a synthetic click split, stored column by column."""

import dataclasses

import numpy as np

__all__ = ["ClickRows"]


@dataclasses.dataclass(frozen=True)
class ClickRows:
    """The rows of one split, column by column (numpy arrays).

    Attributes:
        ids: per feature, ``(total_f,)`` int64 ids in ``[0, vocab_size)``, row after row.
        offsets: per feature, ``(n + 1,)`` int64; row ``r``'s ids are
            ``ids[f][offsets[f][r]:offsets[f][r + 1]]``.
        dense: ``(n, num_dense)`` float32 dense features.
        probs: ``(n,)`` float64 true click probabilities.
        labels: ``(n,)`` float32 clicks (0 or 1).
    """

    ids: list[np.ndarray]
    offsets: list[np.ndarray]
    dense: np.ndarray
    probs: np.ndarray
    labels: np.ndarray

    def __len__(self) -> int:
        return len(self.offsets[0]) - 1

    def head(self, n: int) -> "ClickRows":
        """The first ``n`` rows (views, no copy)."""
        return ClickRows(
            ids=[ids[: offsets[n]] for ids, offsets in zip(self.ids, self.offsets, strict=True)],
            offsets=[offsets[: n + 1] for offsets in self.offsets],
            dense=self.dense[:n],
            probs=self.probs[:n],
            labels=self.labels[:n],
        )

    @staticmethod
    def concat(parts: list["ClickRows"], num_features: int, num_dense: int) -> "ClickRows":
        """The rows of ``parts``, one after the other (offsets rebased)."""
        if not parts:
            return ClickRows(
                ids=[np.empty(0, dtype=np.int64)] * num_features,
                offsets=[np.zeros(1, dtype=np.int64)] * num_features,
                dense=np.empty((0, num_dense), np.float32),
                probs=np.empty(0),
                labels=np.empty(0, np.float32),
            )
        offsets = []
        for f in range(num_features):
            shifts = np.cumsum([0] + [p.offsets[f][-1] for p in parts[:-1]])
            starts = [p.offsets[f][:-1] + shift for p, shift in zip(parts, shifts, strict=True)]
            offsets.append(np.concatenate([*starts, [shifts[-1] + parts[-1].offsets[f][-1]]]))
        return ClickRows(
            ids=[np.concatenate([p.ids[f] for p in parts]) for f in range(num_features)],
            offsets=offsets,
            dense=np.concatenate([p.dense for p in parts]),
            probs=np.concatenate([p.probs for p in parts]),
            labels=np.concatenate([p.labels for p in parts]),
        )
