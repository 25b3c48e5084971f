"""8-bit serving tables (dynemb.inference.quantize, csrc/core/quantized_rows.h): the e4m3
decode is torch's, int8 rows are fbgemm's, pooled and sequence lookups stay within the
stated bound of the float rows on random and adversarial rows, both executors give the
same bits, and the modules quantize rows from a model, a checkpoint and deltas, and
export."""

import pytest
import torch

from dynemb import (
    BatchedDynamicEmbeddingTables,
    DynamicEmbPoolingMode,
    DynamicEmbTableOptions,
    _ops,
)
from dynemb.deltas import DeltaPublisher, delta_path
from dynemb.deltas.replay import stored_rows
from dynemb.inference.exportable_tables import (
    InferenceEmbeddingBagCollection,
    InferenceEmbeddingCollection,
)
from dynemb.inference.quantize import (
    FORMATS,
    dequantize_rows,
    element_error_bound,
    quantize_rows,
    row_bytes,
)
from dynemb.inference.rows import quantized_table
from dynemb.optimizer import EmbOptimType

DTYPES = [torch.int8, torch.float8_e4m3fn]
DTYPE_IDS = ["int8", "e4m3"]
LIBRARIES = {"cpu": torch.ops.dynemb, "emulated": torch.ops.dynemb_cuda_emulated}
MISSING = [0.0] * 7  # constant 0 rows for keys not stored (Init list)
SUM, MEAN = _ops.POOLING_CODES["SUM"], _ops.POOLING_CODES["MEAN"]


def _adversarial(dim: int, g: torch.Generator) -> torch.Tensor:
    """Rows that stress a per-row scale: wide ranges, zeros, one value, one outlier,
    tiny and huge magnitudes, one sign."""
    base = torch.randn(8, dim, generator=g)
    rows = [
        torch.randn(dim, generator=g) * 1e6,  # large range
        torch.linspace(-3e4, 1e-3, dim),  # range and tiny values in one row
        torch.zeros(dim),  # zeros
        torch.full((dim,), 3.7),  # all equal: int8 scale 0
        torch.full((dim,), -1e-30),  # all equal, tiny
        base[0] * 1e-3,
        torch.cat([base[1, :-1] * 1e-2, torch.tensor([1e4])]),  # one outlier
        torch.cat([torch.tensor([-5e5]), base[2, 1:]]),  # one negative outlier
        torch.rand(dim, generator=g) + 1e5,  # far from zero, narrow (the bias matters)
        torch.randn(dim, generator=g) * 1e-38,  # subnormal floats
        torch.rand(dim, generator=g).neg() * 7,  # one sign
    ]
    return torch.stack(rows)


def _rows(dim: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.cat([torch.randn(40, dim, generator=g) * 0.1, _adversarial(dim, g)])


def _table(values: torch.Tensor, dtype, keys=None):
    keys = torch.arange(values.shape[0]) * 7 + 3 if keys is None else keys
    options = DynamicEmbTableOptions(dim=values.shape[1], max_capacity=64, bucket_capacity=16)
    return keys, quantized_table(options, (keys, values), torch.device("cpu"), dtype)


def _batch(keys: torch.Tensor, g: torch.Generator, bags: int = 30):
    """Bags of stored keys (repeats) and some absent ones, an empty bag, weights."""
    lengths = torch.randint(0, 9, (bags,), generator=g)
    lengths[3] = 0
    n = int(lengths.sum())
    batch = keys[torch.randint(0, keys.numel(), (n,), generator=g)]
    batch[::11] = -999  # not stored: the missing row (0)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    weights = torch.rand(n, generator=g) * 4 - 2
    return batch, offsets, weights


def _pool(lib, keys, table, dtype, batch, offsets, weights, mode):
    slots = lib.table_find_slots(table.tensors, batch)
    dim = table.rows.shape[1] - row_bytes(dtype, 0)
    return lib.embedding_pool_quantized(
        table.tensors, table.rows, FORMATS[dtype], slots, batch, offsets, weights, mode,
        MISSING, 0, dim,
    )  # fmt: skip


def _exact_pool(values_of, batch, offsets, weights, mode):
    """float64 pooling of the float rows ``values_of(batch)`` (absent keys: 0)."""
    rows = values_of(batch)
    w = weights.double() if weights is not None else torch.ones(batch.numel(), dtype=torch.float64)
    out = []
    for b in range(offsets.numel() - 1):
        lo, hi = int(offsets[b]), int(offsets[b + 1])
        s = (w[lo:hi, None] * rows[lo:hi]).sum(0)
        out.append(s / max(hi - lo, 1) if mode == MEAN else s)
    return torch.stack(out)


def _lookup_of(keys, values):
    index = {int(k): i for i, k in enumerate(keys)}

    def values_of(batch):
        out = torch.zeros(batch.numel(), values.shape[1], dtype=values.dtype)
        for i, k in enumerate(batch.tolist()):
            if k in index:
                out[i] = values[index[k]]
        return out

    return values_of


def test_e4m3_decode_is_torchs_for_every_code():
    codes = torch.arange(256, dtype=torch.uint8)[None, :]
    packed = torch.cat([codes, torch.tensor([[1.0]]).view(torch.uint8)], dim=1)
    keys = torch.tensor([42])
    options = DynamicEmbTableOptions(dim=256, max_capacity=16, bucket_capacity=16)
    table = quantized_table(options, (keys, packed), torch.device("cpu"), torch.float8_e4m3fn)
    expected = codes.view(torch.float8_e4m3fn).float()
    for lib in LIBRARIES.values():
        slots = lib.table_find_slots(table.tensors, keys)
        got = lib.embedding_gather_quantized(
            table.tensors, table.rows, FORMATS[torch.float8_e4m3fn], slots, keys, MISSING, 0, 256
        )
        assert torch.equal(got.view(torch.int32), expected.view(torch.int32)) or (
            torch.equal(got.isnan(), expected.isnan())
            and torch.equal(got[~got.isnan()], expected[~expected.isnan()])
        )
        assert int(got.isnan().sum()) == 2  # 0x7F, 0xFF


def test_int8_rows_are_fbgemms_rowwise_rows():
    values = _rows(16)
    ours = quantize_rows(values, torch.int8)
    theirs = torch.ops.fbgemm.FloatToFused8BitRowwiseQuantized(values)
    assert ours.shape == theirs.shape == (values.shape[0], 16 + 8)
    assert torch.equal(ours[:, 16:], theirs[:, 16:])  # scale and bias: the same floats
    # codes: fbgemm multiplies by 255 / (range + 1e-8) where we divide by scale: a tie
    # may round apart, never by more than one step, where the 1e-8 is negligible
    # (range >= 1e-3); a row of a smaller range is all code 0 in fbgemm's, off by up
    # to its whole range, and within half a step in ours
    scale = ours[:, 16:20].contiguous().view(torch.float32)
    wide = scale[:, 0] * 255 >= 1e-3
    assert 0 < int(wide.sum()) < values.shape[0]
    diff = (ours[wide, :16].int() - theirs[wide, :16].int()).abs()
    assert int(diff.max()) <= 1 and float((diff > 0).float().mean()) < 0.02
    decoded = torch.ops.fbgemm.Fused8BitRowwiseQuantizedToFloat(theirs)
    ours_decoded = dequantize_rows(ours, torch.int8, 16)
    close = (ours_decoded - decoded).abs() <= scale * 1.0001 + 1e-30
    assert bool(close[wide].all())


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_each_element_is_within_its_bound(dtype):
    values = _rows(24)
    decoded = dequantize_rows(quantize_rows(values, dtype), dtype, 24).double()
    error = (decoded - values.double()).abs()
    bound = element_error_bound(values, dtype)
    assert bool((error <= bound).all()), float((error - bound).max())
    # the bound is tight: half a step (int8) / half an ulp (e4m3) is reached, to 1%
    positive = bound > 0  # a zero row's bound is 0
    assert float((error[positive] / bound[positive]).max()) > 0.9
    # all-equal and zero rows are exact
    for r in (2, 3, 4):
        assert torch.equal(decoded[40 + r], values[40 + r].double())


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("mode", [SUM, MEAN], ids=["sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
def test_pooled_bags_are_within_the_stated_bound(dtype, mode, weighted):
    values = _rows(32)
    keys, table = _table(values, dtype)
    g = torch.Generator().manual_seed(5)
    batch, offsets, weights = _batch(keys, g)
    weights = weights if weighted else None
    got = _pool(torch.ops.dynemb, keys, table, dtype, batch, offsets, weights, mode).double()
    exact = _exact_pool(_lookup_of(keys, values.double()), batch, offsets, weights, mode)
    bound_rows = _lookup_of(keys, element_error_bound(values, dtype))
    bound = _exact_pool(
        bound_rows, batch, offsets, weights.abs() if weighted else None, mode
    )  # sum_i |w_i| e_i (MEAN: / len)
    decoded = _lookup_of(keys, dequantize_rows(table_rows(table, keys), dtype, 32).double())
    magnitude = _exact_pool(
        lambda b: decoded(b).abs(), batch, offsets, weights.abs() if weighted else None, mode
    )
    lengths = (offsets[1:] - offsets[:-1]).double()[:, None]
    rounding = (lengths + 2) * 2.0**-24 * magnitude  # the float pooling's own roundings
    assert bool(((got - exact).abs() <= bound + rounding).all())
    assert bool((bound > 0).any())


def table_rows(table, keys):
    """The stored 8-bit rows of ``keys`` (by their slots)."""
    slots = _ops.table_find_slots(table.tensors, keys)
    return table.rows[slots]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_the_executors_give_the_same_bits(dtype):
    values = _rows(40, seed=2)  # dim 40: not a multiple of 8 or of the 32 GPU lanes
    keys, table = _table(values, dtype)
    g = torch.Generator().manual_seed(7)
    batch, offsets, weights = _batch(keys, g, bags=200)
    for mode in (SUM, MEAN):
        for w in (None, weights):
            cpu, emulated = (
                _pool(lib, keys, table, dtype, batch, offsets, w, mode)
                for lib in LIBRARIES.values()
            )
            assert torch.equal(cpu.view(torch.int32), emulated.view(torch.int32))
    gathered = []
    for lib in LIBRARIES.values():
        slots = lib.table_find_slots(table.tensors, batch)
        gathered.append(
            lib.embedding_gather_quantized(
                table.tensors, table.rows, FORMATS[dtype], slots, batch, MISSING, 0, 40
            )
        )
    assert torch.equal(gathered[0].view(torch.int32), gathered[1].view(torch.int32))
    stored = batch != -999
    decoded = dequantize_rows(table_rows(table, batch[stored]), dtype, 40)
    assert torch.equal(gathered[0][stored], decoded)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("dim", [8, 16, 32, 128])
def test_every_code_pools_to_the_same_bits_on_both_executors(dtype, dim):
    """Rows of random codes (every e4m3 code but the two NaNs, subnormals included) and
    parameters, at the dims the CPU executor sums in registers; bags of stored keys only
    and with an absent key (core's loop)."""
    g = torch.Generator().manual_seed(dim)
    n = 300
    codes = torch.randint(0, 256, (n, dim), generator=g, dtype=torch.int64)
    if dtype == torch.float8_e4m3fn:
        codes[(codes & 0x7F) == 0x7F] -= 1  # no NaN
        codes[0, :] = torch.arange(dim) % 8  # zero and the subnormals
    scale = torch.exp(torch.randn(n, 1, generator=g) * 8)
    params = [scale, torch.randn(n, 1, generator=g) * 100][: 2 if dtype == torch.int8 else 1]
    packed = torch.cat([codes.to(torch.uint8), torch.cat(params, 1).view(torch.uint8)], dim=1)
    keys = torch.arange(n) * 13 + 1
    options = DynamicEmbTableOptions(dim=dim, max_capacity=1024, bucket_capacity=16)
    table = quantized_table(options, (keys, packed), torch.device("cpu"), dtype)
    batch, offsets, weights = _batch(keys, g, bags=300)
    for absent in (False, True):
        b = batch if absent else torch.where(batch == -999, keys[0], batch)
        for mode in (SUM, MEAN):
            for w in (None, weights):
                cpu, emulated = (
                    _pool(lib, keys, table, dtype, b, offsets, w, mode)
                    for lib in LIBRARIES.values()
                )
                assert torch.equal(cpu.view(torch.int32), emulated.view(torch.int32))
    gathered = [
        lib.embedding_gather_quantized(
            table.tensors, table.rows, FORMATS[dtype], lib.table_find_slots(table.tensors, batch),
            batch, MISSING, 0, dim,
        )
        for lib in LIBRARIES.values()
    ]  # fmt: skip
    assert torch.equal(gathered[0].view(torch.int32), gathered[1].view(torch.int32))
    # one kernel launch per lookup on the CUDA executor, no read back (the emulation's
    # counts): find_slots, then the pooling
    before = _ops.emulation_counters()
    _pool(LIBRARIES["emulated"], keys, table, dtype, batch, offsets, None, SUM)
    after = _ops.emulation_counters()
    assert (
        after["launches"] - before["launches"] == 2 and after["host_reads"] == before["host_reads"]
    )
    # the decoded rows are dequantize_rows' (and, for e4m3, torch's cast)
    rows = lambda lib: lib.embedding_pool_quantized(  # noqa: E731
        table.tensors, table.rows, FORMATS[dtype], lib.table_find_slots(table.tensors, keys),
        keys, torch.arange(n + 1), None, SUM, MISSING, 0, dim,
    )  # fmt: skip
    expected = dequantize_rows(packed, dtype, dim)
    assert torch.equal(rows(torch.ops.dynemb), expected)


def _model(dim=8):
    options = [DynamicEmbTableOptions(dim=dim, max_capacity=256, bucket_capacity=16, seed=4)] * 2
    model = BatchedDynamicEmbeddingTables(
        options, [0, 1], pooling_mode=DynamicEmbPoolingMode.NONE,
        optimizer=EmbOptimType.ADAM, learning_rate=0.1, table_names=["a", "b"],
    )  # fmt: skip
    return options, model


def _train(model, step: int) -> None:
    g = torch.Generator().manual_seed(step)
    keys = torch.randint(0, 100, (32,), generator=g)
    model(keys, torch.arange(keys.numel() + 1)).sum().backward()


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("pooling", [-1, 1, 2], ids=["none", "sum", "mean"])
def test_a_module_serves_a_trained_model_within_the_bound(dtype, pooling):
    options, model = _model()
    for step in range(3):
        _train(model, step)
    cls = InferenceEmbeddingCollection if pooling == -1 else InferenceEmbeddingBagCollection
    kwargs = dict(pooling_mode=pooling, table_names=["a", "b"], feature_table_map=[0, 1])
    floats = cls(options, **kwargs)
    quantized = cls(options, **kwargs, weights_dtype=dtype)
    floats.load_from_model(model)
    quantized.load_from_model(model)
    assert quantized.sizes == floats.sizes and all(quantized.sizes)
    keys = torch.cat([torch.arange(-5, 105), torch.arange(-5, 105)])
    offsets = torch.arange(0, keys.numel() + 1, 2)
    got, expected = quantized(keys, offsets).double(), floats(keys, offsets).double()
    assert not torch.equal(got, expected)
    # every stored row of the model within its bound: a bag of 2 within twice the worst
    stored = [stored_rows(t.tensors(), 8)[1] for t in floats.tables]
    worst = max(float(element_error_bound(v, dtype).max()) for v in stored)
    assert float((got - expected).abs().max()) <= 2 * worst * (1 + 1e-5)
    # less memory than the float tables
    size = sum(b.numel() * b.element_size() for b in quantized.buffers())
    assert size < sum(b.numel() * b.element_size() for b in floats.buffers())


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_deltas_quantize_only_their_rows(tmp_path, dtype):
    """A base and its deltas served 8-bit equal the final model served 8-bit bit for bit:
    a row no delta changed keeps its base bytes (never quantized twice)."""
    options, model = _model()
    publisher = DeltaPublisher(model, tmp_path)
    _train(model, 0)
    publisher.publish_base()
    for step in range(1, 4):
        _train(model, step)
        publisher.publish()
    kwargs = dict(table_names=["a", "b"], feature_table_map=[0, 1], weights_dtype=dtype)
    serving = InferenceEmbeddingCollection(options, **kwargs)
    serving.load_from_dynamicemb_file(publisher.base_path)
    base = InferenceEmbeddingCollection(options, **kwargs)
    base.load_from_dynamicemb_file(publisher.base_path)
    for version in range(1, publisher.version + 1):
        serving.apply_delta(delta_path(tmp_path, version))
    final = InferenceEmbeddingCollection(options, **kwargs)
    final.load_from_model(model)
    keys = torch.arange(-5, 105)
    both, offsets = torch.cat([keys, keys]), torch.arange(2 * keys.numel() + 1)
    assert torch.equal(serving(both, offsets), final(both, offsets))
    assert not torch.equal(serving(both, offsets), base(both, offsets))
    assert serving.sizes == final.sizes


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_a_quantized_module_exports(dtype):
    options, model = _model()
    _train(model, 0)
    module = InferenceEmbeddingBagCollection(
        options, table_names=["a", "b"], feature_table_map=[0, 1, 0], weights_dtype=dtype
    )
    module.load_from_model(model)
    keys, offsets = torch.arange(12), torch.tensor([0, 2, 3, 5, 8, 10, 12])
    weights = torch.rand(12)
    program = torch.export.export(module, (keys, offsets), {"per_sample_weights": weights})
    assert torch.equal(
        program.module()(keys, offsets, per_sample_weights=weights),
        module(keys, offsets, per_sample_weights=weights),
    )
    rows = [t for n, t in program.state_dict.items() if n.endswith(".rows")]
    assert len(rows) == 2 and all(t.dtype == torch.uint8 for t in rows)


def test_bad_arguments_raise_naming_them():
    options = [DynamicEmbTableOptions(dim=4, max_capacity=64)]
    with pytest.raises(ValueError, match="weights_dtype must be"):
        InferenceEmbeddingCollection(options, weights_dtype=torch.float16)
    with pytest.raises(ValueError, match="non-finite"):
        quantize_rows(torch.tensor([[1.0, float("nan")]]), torch.int8)
    with pytest.raises(ValueError, match="overflows"):
        quantize_rows(torch.tensor([[-3e38, 3e38]]), torch.int8)
    values = _rows(4)
    keys, table = _table(values, torch.int8)
    slots = _ops.table_find_slots(table.tensors, keys)
    offsets = torch.tensor([0, keys.numel()])
    args = (slots, keys, offsets, None, SUM, MISSING, 0, 4)
    with pytest.raises(ValueError, match="`format` must be 0"):
        torch.ops.dynemb.embedding_pool_quantized(table.tensors, table.rows, 2, *args)
    with pytest.raises(ValueError, match=r"`rows` must have shape \(\d+, 8\)"):
        torch.ops.dynemb.embedding_pool_quantized(table.tensors, table.rows, 1, *args)
    with pytest.raises(TypeError, match="`rows` must have dtype"):
        torch.ops.dynemb.embedding_pool_quantized(table.tensors, table.rows.int(), 0, *args)
