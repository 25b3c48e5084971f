"""Bytes a rank sends through torch.distributed's collectives, by phase of a DMP step.

``CommBytes.install()`` wraps the collectives TorchRec and dynemb call (all_to_all_single,
reduce_scatter_tensor, reduce_scatter, all_gather_into_tensor, all_gather, all_reduce)
and adds, to the current phase's count, the bytes that leave this rank:

- all-to-all: the input less this rank's own split;
- reduce-scatter: the input less this rank's own share;
- all-gather: this rank's input, once per other rank;
- all-reduce: ``2 (N - 1) / N`` times the tensor (a ring's traffic).

The phase is set by the caller (``with counter.phase("input"): ...``); TorchRec's
sharded module does its input dist in ``input_dist`` (waited before the lookup), so
wrapping that method and the backward gives input / output / backward bytes.
"""

import collections
import contextlib

import torch
import torch.distributed as dist


def _bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class CommBytes:
    def __init__(self) -> None:
        self.by_phase: collections.Counter = collections.Counter()
        self.by_op: collections.Counter = collections.Counter()
        self._phase = "other"

    @contextlib.contextmanager
    def phase(self, name: str):
        previous, self._phase = self._phase, name
        try:
            yield
        finally:
            self._phase = previous

    def add(self, op: str, n: int) -> None:
        self.by_phase[self._phase] += n
        self.by_op[f"{self._phase}.{op}"] += n

    def reset(self) -> None:
        self.by_phase.clear()
        self.by_op.clear()

    def install(self) -> None:
        """Wraps the collectives of ``torch.distributed`` in this process."""
        counter = self
        orig = {
            name: getattr(dist, name)
            for name in (
                "all_to_all_single", "reduce_scatter_tensor", "reduce_scatter",
                "all_gather_into_tensor", "all_gather", "all_reduce",
            )
        }  # fmt: skip

        def rank_and_size(group):
            return dist.get_rank(group), dist.get_world_size(group)

        def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None,
                              group=None, async_op=False):  # fmt: skip
            rank, size = rank_and_size(group)
            row = _bytes(input) // max(1, input.shape[0]) if input.dim() else input.element_size()
            own = (
                input_split_sizes[rank] * row
                if input_split_sizes
                else _bytes(input) // max(1, size)
            )
            counter.add("all_to_all", _bytes(input) - own)
            return orig["all_to_all_single"](
                output, input, output_split_sizes, input_split_sizes, group, async_op
            )

        def reduce_scatter_tensor(output, input, op=dist.ReduceOp.SUM, group=None,
                                  async_op=False):  # fmt: skip
            counter.add("reduce_scatter", _bytes(input) - _bytes(output))
            return orig["reduce_scatter_tensor"](output, input, op, group, async_op)

        def reduce_scatter(output, input_list, op=dist.ReduceOp.SUM, group=None,
                           async_op=False):  # fmt: skip
            counter.add("reduce_scatter", sum(_bytes(t) for t in input_list) - _bytes(output))
            return orig["reduce_scatter"](output, input_list, op, group, async_op)

        def all_gather_into_tensor(output, input, group=None, async_op=False):
            _, size = rank_and_size(group)
            counter.add("all_gather", _bytes(input) * (size - 1))
            return orig["all_gather_into_tensor"](output, input, group, async_op)

        def all_gather(tensor_list, tensor, group=None, async_op=False):
            _, size = rank_and_size(group)
            counter.add("all_gather", _bytes(tensor) * (size - 1))
            return orig["all_gather"](tensor_list, tensor, group, async_op)

        def all_reduce(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
            _, size = rank_and_size(group)
            counter.add("all_reduce", 2 * (size - 1) * _bytes(tensor) // size)
            return orig["all_reduce"](tensor, op, group, async_op)

        for name, fn in (
            ("all_to_all_single", all_to_all_single),
            ("reduce_scatter_tensor", reduce_scatter_tensor),
            ("reduce_scatter", reduce_scatter),
            ("all_gather_into_tensor", all_gather_into_tensor),
            ("all_gather", all_gather),
            ("all_reduce", all_reduce),
        ):
            setattr(dist, name, fn)
