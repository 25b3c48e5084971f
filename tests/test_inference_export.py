"""Inference modules (dynemb.exportable_tables): built from a trained sharded model or a
checkpoint of another world size, their lookups equal the trained model's eval lookups
bit for bit, and a whole model with them exports, saves and loads with torch.export."""

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from dynemb import DynamicEmbTableOptions
from dynemb.exportable_tables import InferenceEmbeddingBagCollection, InferenceEmbeddingCollection
from tests.inference_workers import inference_module, train_and_build
from tests.multiprocess import run_ranks
from tests.sharded_workers import Case

CASES = [Case("ADAM", "roundrobin", "SUM"), Case("EXACT_SGD", "hash_roundrobin", "NONE")]
BATCHES = {1: [6], 2: [3, 4]}


@pytest.fixture(scope="module")
def one_rank():
    return run_ranks(train_and_build, 1, CASES, BATCHES[1], None, timeout=240)[0]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    root = tmp_path_factory.mktemp("inference")
    return root, run_ranks(train_and_build, 2, CASES, BATCHES[2], str(root), timeout=240)


class _Ranker(nn.Module):
    """A whole model: dynamic embeddings, then a dense layer."""

    def __init__(self, embeddings: nn.Module, width: int) -> None:
        super().__init__()
        self.embeddings = embeddings
        self.dense = nn.Linear(width, 1)
        torch.manual_seed(0)
        nn.init.normal_(self.dense.weight)

    def forward(self, keys, offsets):
        return self.dense(self.embeddings(keys, offsets))


def test_lookups_equal_the_trained_models_eval_lookups_bit_for_bit(one_rank):
    for case, (expected, got, keys, _, sizes) in zip(CASES, one_rank):
        assert got.dtype == expected.dtype and got.shape == expected.shape, case
        assert torch.equal(got, expected), case
        assert all(sizes), case  # the trained rows were copied
        assert keys.numel() > 0


def test_missing_keys_get_the_eval_initializer():
    ec = inference_module(Case("ADAM", "roundrobin", "NONE"))  # empty tables
    keys, offsets = torch.tensor([5, -7, 1 << 62]), torch.tensor([0, 1, 2, 3])
    assert torch.equal(ec(keys, offsets), torch.zeros(3, 4))  # eval initializer: constant 0
    options = DynamicEmbTableOptions(dim=2, max_capacity=64)
    options.eval_initializer_args.value = 0.25
    assert torch.equal(
        InferenceEmbeddingCollection([options])(keys[:1], offsets[:2]), torch.full((1, 2), 0.25)
    )


@pytest.mark.parametrize("index", [0, 1])
def test_a_two_rank_model_gathers_into_every_rank(two_ranks, index):
    _, ranks = two_ranks
    for expected, got, _, _, sizes in (r[index] for r in ranks):
        assert sizes == ranks[0][index][4]  # every rank holds every row
        if CASES[index].pooling == "NONE":  # rows are not summed across ranks: exact
            assert torch.equal(got, expected)
        else:  # pooled: the model adds the ranks' partial sums
            torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("layout", ["", "_dynamicemb"])
@pytest.mark.parametrize("index", [0, 1])
def test_a_two_rank_checkpoint_loads_into_one_process(two_ranks, index, layout):
    root, ranks = two_ranks
    module = inference_module(CASES[index])
    module.load_from_dynamicemb_file(root / f"{index}{layout}")
    assert module.sizes == ranks[0][index][4]
    for expected, got, keys, offsets, _ in (r[index] for r in ranks):
        assert torch.equal(module(keys, offsets), got)  # the same as gathered from the model
        if CASES[index].pooling == "NONE":
            assert torch.equal(module(keys, offsets), expected)


def test_a_whole_model_exports_saves_and_loads_bit_for_bit(one_rank, two_ranks, tmp_path):
    root, _ = two_ranks
    for index, case in enumerate(CASES):
        expected, _, keys, offsets, _ = one_rank[index]
        module = inference_module(case)
        module.load_from_dynamicemb_file(root / str(index))
        model = _Ranker(module, expected.shape[1]).eval()
        reference = model(keys, offsets)
        program = torch.export.export(model, (keys, offsets))
        assert torch.equal(program.module()(keys, offsets), reference)
        file = tmp_path / f"model{index}.pt2"
        torch.export.save(program, file)
        loaded = torch.export.load(file)
        assert torch.equal(loaded.module()(keys, offsets), reference), case
        # The table state travels with the program, as buffers.
        names = [n for n in loaded.state_dict if n.endswith("values")]
        assert names and all(loaded.state_dict[n].numel() for n in names if "slow" not in n)


def test_trained_model_outputs_through_the_dense_layer_are_exact(one_rank):
    expected, got, keys, offsets, _ = one_rank[0]
    module = inference_module(CASES[0])
    dense = _Ranker(module, expected.shape[1]).dense
    assert torch.equal(dense(got), dense(expected))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.pooling)
def test_tracing_needs_no_data(case):
    module = inference_module(case)
    with FakeTensorMode(allow_non_fake_inputs=True):
        keys = torch.empty(11, dtype=torch.int64)
        offsets = torch.empty(3 * 4 + 1, dtype=torch.int64)  # values never read
        out = module(keys, offsets)
    assert isinstance(out, FakeTensor)
    assert tuple(out.shape) == (
        (11, 4) if case.pooling == "NONE" else (4, 4 + 4 + 8)
    )  # f0, f1 -> t0 (dim 4), f2 -> t1 (dim 8)


def test_bad_arguments_raise_naming_them():
    options = [DynamicEmbTableOptions(dim=4, max_capacity=64)]
    with pytest.raises(ValueError, match="use_dynamic_hash"):
        InferenceEmbeddingCollection(options, use_dynamic_hash=False)
    with pytest.raises(ValueError, match="pooling_mode must be -1"):
        InferenceEmbeddingCollection(options, pooling_mode=0)
    with pytest.raises(ValueError, match="bag collection"):
        InferenceEmbeddingBagCollection(options, pooling_mode=-1)
    with pytest.raises(ValueError, match="feature_table_map"):
        InferenceEmbeddingCollection(options, feature_table_map=[1])
    module = InferenceEmbeddingCollection(options)
    keys, offsets = torch.tensor([1, 2]), torch.tensor([0, 2])
    with pytest.raises(ValueError, match="pooling_offsets"):
        module(keys, offsets, pooling_offsets=offsets)
    with pytest.raises(TypeError, match="keys must be"):
        module(keys.float(), offsets)
    with pytest.raises(ValueError, match="offsets` must end"):  # values: checked by the op
        InferenceEmbeddingBagCollection(options)(keys, torch.tensor([0, 3]))
    with pytest.raises(ValueError, match="not tables of this module"):
        module.load_from_dynamicemb_file("/nonexistent", table_names=["t9"])
