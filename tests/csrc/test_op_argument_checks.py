"""Every rejection of the embedding ops' shared argument checks (csrc/torch/
embedding_op_impls.h), on both op libraries (the CPU executor and the emulated CUDA
executor register the same checks): each error names the argument, and the table is
unchanged after it.

Device mismatches cannot be provoked here (a CPU-only machine has one device, and a
tensor on the meta device makes the dispatcher skip the op); they are checked by the
same code, on a GPU.
"""

import dynemb._C  # noqa: F401
import pytest
import torch

LIBRARIES = {"cpu": torch.ops.dynemb, "cuda-emulated": torch.ops.dynemb_cuda_emulated}
DIM, ROW, SLOTS = 4, 5, 32
MISSING = [3.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]  # CONSTANT 0
SGD = [0.0, 0.1, 1e-8, 0.9, 0.99, 0.0]


def _table():
    return [
        torch.zeros(2, 16, dtype=torch.uint8),
        torch.zeros(SLOTS, dtype=torch.int64),
        torch.zeros(SLOTS, dtype=torch.int64),
        torch.zeros(0, dtype=torch.int64),
        torch.ones(SLOTS, ROW),
        torch.zeros(2, dtype=torch.int32),
        torch.zeros(2, dtype=torch.uint8),
        torch.zeros(0, ROW),
        torch.zeros(0, dtype=torch.int32),  # pins: none (no upserts here)
    ]


def _bags():
    """3 bags over 4 indices: slots, keys, offsets, weights."""
    return (
        torch.tensor([0, 1, -1, 3]),
        torch.tensor([10, 11, 12, 13]),
        torch.tensor([0, 2, 2, 4]),
        torch.ones(4),
    )


def _call(lib, op, table, **changes):
    slots, keys, offsets, weights = _bags()
    args = dict(slots=slots, keys=keys, offsets=offsets, weights=weights)
    args.update(changes)
    if op == "pool":
        return lib.embedding_pool(
            table, args["slots"], args["keys"], args["offsets"], args["weights"], 0, MISSING, 0, DIM
        )
    if op == "gather":
        return lib.embedding_gather(table, args["slots"], args["keys"], MISSING, 0, DIM)
    unique_slots = args.get("unique_slots", torch.tensor([0, 1, 3]))
    inverse = args.get("inverse", torch.tensor([0, 1, 2, 2]))
    grad = args.get("grad", torch.ones(3, DIM))
    return lib.embedding_backward(
        table, unique_slots, inverse, args["offsets"], args["weights"], 0, grad, SGD, 1, DIM
    )


CASES = [
    ("pool", dict(offsets=torch.tensor([1, 2, 2, 4])), "`offsets` must start at 0, got 1"),
    (
        "pool",
        dict(offsets=torch.tensor([0, 3, 2, 4])),
        r"`offsets` must never decrease.*offsets\[2\]=2",
    ),
    (
        "pool",
        dict(offsets=torch.tensor([0, 2, 2, 3])),
        "`offsets` must end at the number of indices 4, got 3",
    ),
    ("pool", dict(offsets=torch.tensor([], dtype=torch.int64)), "`offsets` must not be empty"),
    (
        "pool",
        dict(offsets=torch.tensor([0, 2, 2, 4], dtype=torch.int32)),
        "`offsets` must have dtype",
    ),
    (
        "pool",
        dict(slots=torch.tensor([0, 1, -2, 3])),
        r"`slots` must hold slots in \[-1, 32\), got values in \[-2, 3\]",
    ),
    ("pool", dict(slots=torch.tensor([0, 1, 32, 3])), r"`slots` must hold slots in \[-1, 32\)"),
    ("pool", dict(slots=torch.tensor([[0, 1, 2, 3]])), "`slots` must be 1-D"),
    ("pool", dict(keys=torch.tensor([10, 11, 12])), "`keys` has 3 elements, `slots` has 4"),
    ("pool", dict(weights=torch.ones(3)), "`weights` has 3 elements, `slots` has 4"),
    ("pool", dict(weights=torch.ones(4, dtype=torch.float64)), "`weights` must have dtype"),
    ("pool", dict(slots=torch.arange(8)[::2]), "`slots` must be contiguous"),
    ("gather", dict(slots=torch.tensor([0, 1, 99, 3])), r"`slots` must hold slots in \[-1, 32\)"),
    ("gather", dict(keys=torch.tensor([10])), "`keys` has 1 elements, `slots` has 4"),
    ("gather", dict(keys=torch.tensor([10.0, 11, 12, 13])), "`keys` must have dtype"),
    (
        "backward",
        dict(unique_slots=torch.tensor([0, 1, 40])),
        r"`unique_slots` must hold slots in \[-1, 32\)",
    ),
    (
        "backward",
        dict(inverse=torch.tensor([0, 1, 2, 3])),
        r"`inverse` must hold ids in \[0, 3\), got values in \[0, 3\]",
    ),
    (
        "backward",
        dict(inverse=torch.tensor([0, 1, 2])),
        "`offsets` must end at the number of indices 3",
    ),
    ("backward", dict(offsets=torch.tensor([0, 2, 1, 4])), "`offsets` must never decrease"),
    ("backward", dict(grad=torch.ones(2, DIM)), r"`grad` must have shape \(3, 4\)"),
    ("backward", dict(grad=torch.ones(3, DIM, dtype=torch.float64)), "`grad` must have dtype"),
]


@pytest.mark.parametrize("library", list(LIBRARIES))
@pytest.mark.parametrize("op, change, match", CASES)
def test_rejection_names_the_argument_and_changes_nothing(library, op, change, match):
    table = _table()
    before = [t.clone() for t in table]
    with pytest.raises((ValueError, TypeError), match=match):
        _call(LIBRARIES[library], op, table, **change)
    for t, b in zip(table, before):
        assert torch.equal(t, b)


@pytest.mark.parametrize("library", list(LIBRARIES))
@pytest.mark.parametrize("op", ["pool", "gather", "backward"])
def test_good_arguments_pass_the_checks(library, op):
    table = _table()
    _call(LIBRARIES[library], op, table)
    if op == "backward":
        assert not torch.equal(table[4], _table()[4])  # the rows were updated
