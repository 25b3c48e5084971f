"""Inference modules (dynemb.inference.exportable_tables): built from a trained sharded model or a
checkpoint of another world size, their lookups equal the trained model's eval lookups
bit for bit, and a whole model with them exports, saves and loads with torch.export."""

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.export import Dim

from dynemb import DynamicEmbTableOptions
from dynemb.inference.exportable_tables import (
    InferenceEmbeddingBagCollection,
    InferenceEmbeddingCollection,
)
from tests.support.inference_workers import inference_module, train_and_build
from tests.support.multiprocess import run_ranks
from tests.support.sharded_workers import Case

CASES = [
    Case("ADAM", "roundrobin", "SUM"),
    Case("EXACT_SGD", "hash_roundrobin", "NONE"),
    Case("EXACT_ADAGRAD", "roundrobin", "MEAN", weighted=True),
]
IDS = [c.pooling for c in CASES]
BATCHES = {1: [6], 2: [3, 4]}


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory):
    root = tmp_path_factory.mktemp("one_rank")
    return root, run_ranks(train_and_build, 1, CASES, BATCHES[1], str(root), timeout=240)[0]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    root = tmp_path_factory.mktemp("two_ranks")
    return root, run_ranks(train_and_build, 2, CASES, BATCHES[2], str(root), timeout=240)


class _Ranker(nn.Module):
    """A whole model: dynamic embeddings, then a dense layer."""

    def __init__(self, embeddings: nn.Module, width: int) -> None:
        super().__init__()
        self.embeddings = embeddings
        self.dense = nn.Linear(width, 1)
        with torch.no_grad():
            self.dense.weight.copy_(torch.linspace(-1, 1, width))

    def forward(self, keys, offsets, weights=None):
        return self.dense(self.embeddings(keys, offsets, per_sample_weights=weights))


@pytest.mark.parametrize("index", range(len(CASES)), ids=IDS)
def test_lookups_equal_the_trained_models_eval_lookups_bit_for_bit(one_rank, index):
    expected, got, keys, _, _, sizes = one_rank[1][index]
    assert got.dtype == expected.dtype and got.shape == expected.shape
    assert torch.equal(got, expected)
    assert all(sizes) and keys.numel()  # the trained rows were copied; a batch was looked up


def test_missing_keys_get_the_eval_initializer():
    ec = inference_module(Case("ADAM", "roundrobin", "NONE"))  # empty tables
    keys, offsets = torch.tensor([5, -7, 1 << 62]), torch.tensor([0, 1, 2, 3])
    assert torch.equal(ec(keys, offsets), torch.zeros(3, 4))  # eval initializer: constant 0
    options = DynamicEmbTableOptions(dim=2, max_capacity=64)
    options.eval_initializer_args.value = 0.25
    module = InferenceEmbeddingCollection([options])
    assert torch.equal(module(keys[:1], offsets[:2]), torch.full((1, 2), 0.25))


@pytest.mark.no_emulated_pass(
    "spawned ranks: gathering and checkpoint files; lookups run on the executor in the one-rank tests"
)
@pytest.mark.parametrize("index", range(len(CASES)), ids=IDS)
def test_a_two_rank_model_gathers_into_every_rank(two_ranks, index):
    _, ranks = two_ranks
    for expected, got, _, _, _, sizes in (r[index] for r in ranks):
        assert sizes == ranks[0][index][5]  # every rank holds every row
        if CASES[index].pooling == "NONE":  # rows are not summed across ranks: exact
            assert torch.equal(got, expected)
        else:  # pooled: the model adds the ranks' partial sums
            torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)


@pytest.mark.no_emulated_pass(
    "spawned ranks: gathering and checkpoint files; lookups run on the executor in the one-rank tests"
)
@pytest.mark.parametrize("layout", ["dynemb", "dynamicemb"])
@pytest.mark.parametrize("index", range(len(CASES)), ids=IDS)
def test_a_two_rank_checkpoint_loads_into_one_process(two_ranks, index, layout):
    root, ranks = two_ranks
    module = inference_module(CASES[index])
    module.load_from_dynamicemb_file(
        root / (f"{index}_dynamicemb" if layout == "dynamicemb" else str(index))
    )
    assert module.sizes == ranks[0][index][5]
    for expected, got, keys, offsets, weights, _ in (r[index] for r in ranks):
        out = module(keys, offsets, per_sample_weights=weights)
        assert torch.equal(out, got)  # what every rank gathered from the trained model
        if CASES[index].pooling == "NONE":
            assert torch.equal(out, expected)


@pytest.mark.parametrize("index", range(len(CASES)), ids=IDS)
def test_a_whole_exported_model_equals_the_trained_one_bit_for_bit(one_rank, tmp_path, index):
    """Checkpoint of the trained model -> inference module -> export -> save -> load:
    the loaded program's outputs equal the dense layer over the trained model's eval lookups."""
    root, results = one_rank
    expected, _, keys, offsets, weights, _ = results[index]
    module = inference_module(CASES[index])
    module.load_from_dynamicemb_file(root / str(index))
    model = _Ranker(module, expected.shape[1]).eval()
    trained = model.dense(expected)
    program = torch.export.export(model, (keys, offsets, weights))
    assert torch.equal(program.module()(keys, offsets, weights), trained)
    torch.export.save(program, tmp_path / "model.pt2")
    loaded = torch.export.load(tmp_path / "model.pt2")
    assert torch.equal(loaded.module()(keys, offsets, weights), trained)
    values = [t for n, t in loaded.state_dict.items() if n.endswith(".values")]
    assert len(values) == 2 and all(t.numel() for t in values)  # tables travel as buffers


@pytest.mark.parametrize("pooling", [1, -1])
def test_an_export_with_dynamic_shapes_serves_other_batch_sizes(pooling):
    cls = InferenceEmbeddingCollection if pooling == -1 else InferenceEmbeddingBagCollection
    options = [DynamicEmbTableOptions(dim=4, max_capacity=64, seed=1)] * 2
    module = cls(options, pooling_mode=pooling, table_names=["a", "b"], feature_table_map=[0, 0, 1])
    keys, offsets = torch.arange(7), torch.tensor([0, 1, 2, 3, 4, 5, 7])
    dynamic = {"keys": {0: Dim.AUTO}, "offsets": {0: Dim.AUTO}}
    program = torch.export.export(module, (keys, offsets), dynamic_shapes=dynamic)
    keys, offsets = torch.arange(11) - 3, torch.tensor([0, 2, 3, 5, 6, 8, 9, 10, 11, 11])
    assert torch.equal(program.module()(keys, offsets), module(keys, offsets))


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_tracing_needs_no_data(case):
    module = inference_module(case)
    with FakeTensorMode(allow_non_fake_inputs=True):
        keys = torch.empty(11, dtype=torch.int64)
        offsets = torch.empty(3 * 4 + 1, dtype=torch.int64)  # values never read
        out = module(keys, offsets)
    assert isinstance(out, FakeTensor)
    # f0, f1 -> t0 (dim 4), f2 -> t1 (dim 8; dim 4 in the sequence case)
    assert tuple(out.shape) == ((11, 4) if case.pooling == "NONE" else (4, 4 + 4 + 8))


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
    module = InferenceEmbeddingCollection(options * 2, feature_table_map=[0, 1])
    keys, offsets = torch.tensor([1, 2]), torch.tensor([0, 1, 2])
    with pytest.raises(ValueError, match="pooling_offsets"):
        module(keys, offsets, pooling_offsets=offsets)
    with pytest.raises(TypeError, match="keys must be"):
        module(keys.float(), offsets)
    with pytest.raises(ValueError, match="offsets must end"):
        module(keys, torch.tensor([0, 1, 3]))
    with pytest.raises(ValueError, match="not tables of this module"):
        module.load_from_dynamicemb_file("/nonexistent", table_names=["t9"])


def test_a_checkpoint_collection_must_be_found(one_rank):
    root, _ = one_rank
    module = inference_module(CASES[0])
    with pytest.raises(ValueError, match="collection='other'"):
        module.load_from_dynamicemb_file(root / "0", collection="other")
    module.load_from_dynamicemb_file(root / "0_dynamicemb", collection="model")  # DynamicEmb's name
    assert all(module.sizes)
