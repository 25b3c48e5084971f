"""SyntheticClicks: deterministic, known click function, learnable, batches sliced per rank."""

import numpy as np
import pytest
import torch
from torchmetrics.functional.classification import binary_auroc

from dynemb.datasets import SyntheticClicks, roc_auc, spread_ids
from dynemb.datasets.synthetic_clicks import CHUNK_ROWS

pytestmark = pytest.mark.no_emulated_pass("a synthetic dataset: tensor ops, no dynemb op")

SMALL = dict(num_train=3000, num_eval=1000, vocab_size=1000)


def assert_rows_equal(a, b, n=None) -> None:
    n = len(b) if n is None else n
    for f in range(len(a.ids)):
        np.testing.assert_array_equal(a.offsets[f][: n + 1], b.offsets[f][: n + 1])
        np.testing.assert_array_equal(a.ids[f][: a.offsets[f][n]], b.ids[f][: b.offsets[f][n]])
    np.testing.assert_array_equal(a.dense[:n], b.dense[:n])
    np.testing.assert_array_equal(a.probs[:n], b.probs[:n])
    np.testing.assert_array_equal(a.labels[:n], b.labels[:n])


def test_same_arguments_same_rows_other_seed_other_rows():
    a, b = SyntheticClicks(**SMALL), SyntheticClicks(**SMALL)
    assert_rows_equal(a.rows("train"), b.rows("train"))
    assert_rows_equal(a.rows("eval"), b.rows("eval"))
    other = SyntheticClicks(**SMALL, seed=1)
    assert not np.array_equal(other.rows("train").ids[0], a.rows("train").ids[0])
    assert not np.array_equal(a.rows("train").ids[0][:1000], a.rows("eval").ids[0])


def test_a_subset_is_a_prefix_across_chunks():
    big = SyntheticClicks(
        num_train=CHUNK_ROWS + 100, num_eval=50, vocab_size=1000, max_ids_per_feature=[1, 3] * 4
    )
    small = SyntheticClicks(
        num_train=CHUNK_ROWS + 10, num_eval=50, vocab_size=1000, max_ids_per_feature=[1, 3] * 4
    )
    assert_rows_equal(big.rows("train"), small.rows("train"))
    assert_rows_equal(big.rows("eval"), small.rows("eval"))  # independent of num_train


def test_shapes_and_ranges():
    data = SyntheticClicks(**SMALL, max_ids_per_feature=[1] * 7 + [5], num_dense=3)
    rows = data.rows("train")
    assert len(rows) == 3000 and rows.dense.shape == (3000, 3)
    for f in range(8):
        lengths = np.diff(rows.offsets[f])
        assert lengths.min() >= 1 and lengths.max() == (5 if f == 7 else 1)
        assert rows.ids[f].dtype == np.int64 and len(rows.ids[f]) == lengths.sum()
        assert 0 <= rows.ids[f].min() and rows.ids[f].max() < 1000
    assert set(np.unique(rows.labels)) == {0.0, 1.0}
    assert ((rows.probs > 0) & (rows.probs < 1)).all()


def test_ids_follow_zipf():
    rows = SyntheticClicks(num_train=20_000, num_eval=0, vocab_size=100_000).rows("train")
    counts = np.bincount(np.concatenate(rows.ids), minlength=100_000)
    harmonic = (np.arange(1, 100_001, dtype=np.float64) ** -1.05).sum()
    expected = 160_000 / harmonic  # draws of id 0
    assert abs(counts[0] - expected) < 5 * np.sqrt(expected)
    assert counts[0] > counts[1] > counts[10] > counts[1000]


def test_default_click_rate_and_bayes_auc():
    data = SyntheticClicks(num_train=0)  # the defaults' 100k held-out rows
    rows = data.rows("eval")
    assert 0.2 <= rows.labels.mean() <= 0.3
    assert 0.75 <= data.bayes_auc("eval") <= 0.85


def test_labels_are_draws_of_the_true_function():
    data = SyntheticClicks(
        num_train=40_000, num_eval=0, vocab_size=5000, max_ids_per_feature=[1] * 6 + [4, 2]
    )
    rows = data.rows("train")
    # The probabilities are sigmoid of the documented function of the ids ...
    np.testing.assert_allclose(1 / (1 + np.exp(-data.logits(rows))), rows.probs, rtol=1e-12)
    r = 7  # ... recomputed by hand for one row: means over each feature's ids
    x, u = [], []
    for f in range(8):
        h, s = data.hidden(f, rows.ids[f][rows.offsets[f][r] : rows.offsets[f][r + 1]])
        x.append(h.mean(0))
        u.append(s.mean())
    pairs = sum(x[f] @ x[g] for f in range(8) for g in range(f + 1, 8))
    logit = data.bias + data.w_first * sum(u) + data.w_pair * pairs + rows.dense[r] @ data.w_dense
    assert np.isclose(logit, data.logits(rows)[r])
    # ... and the labels are Bernoulli draws of them: the AUC that the true function
    # reaches matches its expectation given the probabilities alone.
    p = rows.probs
    order = np.argsort(p)
    negatives_below = np.concatenate([[0.0], np.cumsum(1 - p[order])[:-1]])
    expected_u = (p[order] * negatives_below).sum()
    expected_pairs = p.sum() * (1 - p).sum() - (p * (1 - p)).sum()
    expected_auc = expected_u / expected_pairs
    assert abs(data.bayes_auc("train") - expected_auc) < 0.01
    assert abs(rows.labels.mean() - p.mean()) < 4 * np.sqrt((p * (1 - p)).sum()) / len(p)


def test_signal_is_learnable():
    # A factorisation machine (the true function's form) learns most of the Bayes AUC
    # from 30k rows in one pass.
    torch.manual_seed(0)
    data = SyntheticClicks(num_train=30_000, num_eval=10_000, vocab_size=500)
    train, held_out = data.rows("train"), data.rows("eval")
    emb = torch.nn.Parameter(torch.randn(8, 500, 8) * 0.1)
    first = torch.nn.Parameter(torch.zeros(8, 500))
    dense = torch.nn.Linear(data.num_dense, 1)
    optimizer = torch.optim.Adam([emb, first, *dense.parameters()], lr=0.03)
    features = torch.arange(8)[:, None]

    def logits(rows, index):
        ids = torch.from_numpy(np.stack([rows.ids[f][index] for f in range(8)]))  # (8, b)
        e = emb[features, ids]  # (8, b, 8)
        total = e.sum(0)
        pairs = 0.5 * ((total * total).sum(1) - (e * e).sum((0, 2)))
        x = torch.from_numpy(rows.dense[index])
        return first[features, ids].sum(0) + pairs + dense(x).squeeze(1)

    labels = torch.from_numpy(train.labels)
    for start in range(0, len(train), 1000):
        index = np.arange(start, start + 1000)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(
            logits(train, index), labels[index]
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        auc = roc_auc(logits(held_out, np.arange(len(held_out))).numpy(), held_out.labels)
    bayes = data.bayes_auc("eval")
    assert 0.8 < bayes < 0.87
    assert auc > 0.72, (auc, bayes)


@pytest.mark.parametrize("world_size,drop_last", [(1, False), (3, False), (3, True)])
def test_batches_slice_each_global_batch_per_rank(world_size, drop_last):
    data = SyntheticClicks(num_train=100, num_eval=10, vocab_size=1000, max_ids_per_feature=[2] * 8)
    rows = data.rows("train")
    per_rank = [
        list(
            data.batches(
                "train", 7, rank=r, world_size=world_size, id_view="row", drop_last=drop_last
            )
        )
        for r in range(world_size)
    ]
    steps = data.num_batches("train", 7, world_size, drop_last)
    assert all(len(b) == steps for b in per_rank)
    assert len(data.batches("train", 7, world_size=world_size, drop_last=drop_last)) == steps
    covered = []
    for step in range(steps):
        sizes = {len(per_rank[r][step].labels) for r in range(world_size)}
        assert len(sizes) == 1  # collectives need the same batch size on every rank
        for r in range(world_size):
            batch = per_rank[r][step]
            begin = len(covered)
            n = len(batch.labels)
            covered += range(begin, begin + n)
            np.testing.assert_array_equal(batch.labels.numpy(), rows.labels[begin : begin + n])
            np.testing.assert_array_equal(
                batch.dense_features.numpy(), rows.dense[begin : begin + n]
            )
            kjt = batch.sparse_features
            assert kjt.keys() == data.feature_names and kjt.lengths().dtype == torch.int32
            for f, jagged in enumerate(kjt.to_dict().values()):
                lo, hi = rows.offsets[f][begin], rows.offsets[f][begin + n]
                np.testing.assert_array_equal(jagged.values().numpy(), rows.ids[f][lo:hi])
    full = 100 // (7 * world_size) * 7 * world_size
    assert len(covered) == (full if drop_last else 100 - (100 - full) % world_size)


def test_id_views():
    data = SyntheticClicks(**SMALL)
    row = next(iter(data.batches("train", 64, id_view="row"))).sparse_features
    raw = next(iter(data.batches("train", 64))).sparse_features  # "raw" by default
    mixed = next(iter(data.batches("train", 64, id_view={"f0": "row"}))).sparse_features
    for key in data.feature_names:
        expected = spread_ids(row[key].values())
        assert torch.equal(raw[key].values(), expected)
        assert torch.equal(mixed[key].values(), row[key].values() if key == "f0" else expected)
    with pytest.raises(ValueError, match="id_view"):
        data.batches("train", 64, id_view="hashed")
    with pytest.raises(ValueError, match="id_view"):
        data.batches("train", 64, id_view={"f9": "row"})


def test_spread_ids():
    ids = np.arange(0, 1 << 16, dtype=np.int64)
    keys = spread_ids(ids)
    assert keys.dtype == torch.int64 and (keys >= 0).all()
    assert len(torch.unique(keys)) == len(ids)
    assert keys[1].item() == 0x9E3779B97F4A7C15 & 0x7FFFFFFFFFFFFFFF
    assert torch.equal(spread_ids(torch.from_numpy(ids)), keys)


def test_roc_auc_matches_torchmetrics_with_ties():
    gen = torch.Generator().manual_seed(0)
    scores = torch.randint(0, 20, (5000,), generator=gen).double()  # many ties
    labels = (torch.rand(5000, generator=gen) < torch.sigmoid(scores / 5 - 2)).long()
    expected = binary_auroc(scores, labels).item()
    assert abs(roc_auc(scores, labels) - expected) < 1e-6
    assert roc_auc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == 0.75
    assert np.isnan(roc_auc([0.1, 0.2], [1, 1]))


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(num_train=-1), "num_train"),
        (dict(vocab_size=[10] * 3), "vocab_size"),
        (dict(max_ids_per_feature=0), "max_ids_per_feature"),
        (dict(zipf_s=0.0), "zipf_s"),
        (dict(hidden_dim=0), "hidden_dim"),
        (dict(seed=-1), "seed"),
    ],
)
def test_bad_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SyntheticClicks(**kwargs)


def test_bad_batch_arguments():
    data = SyntheticClicks(**SMALL)
    with pytest.raises(ValueError, match="rank"):
        data.batches("train", 8, rank=2, world_size=2)
    with pytest.raises(ValueError, match="batch_size"):
        data.batches("train", 0)
    with pytest.raises(ValueError, match="split"):
        data.rows("test")
    with pytest.raises(ValueError, match="split"):
        data.batches("test", 8)
