"""SequenceDLRM (unsharded): sequence rows are mean-pooled; the input's key order is free."""

import pytest
import torch
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, EmbeddingCollection
from torchrec.modules.embedding_configs import EmbeddingConfig, PoolingType
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dynemb.models import SequenceDLRM

DIM = 4


def make_model(sequence_dim: int = DIM) -> SequenceDLRM:
    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(
        tables=[
            EmbeddingBagConfig(
                name=f"t{i}",
                embedding_dim=DIM,
                num_embeddings=10,
                feature_names=[f"p{i}"],
                pooling=PoolingType.MEAN,
            )
            for i in range(2)
        ]
    )
    ec = EmbeddingCollection(
        tables=[
            EmbeddingConfig(
                name="s", embedding_dim=sequence_dim, num_embeddings=10, feature_names=["seq"]
            )
        ]
    )
    return SequenceDLRM(ebc, 3, [8, DIM], [8, 1], embedding_collection=ec)


def kjt(keys: list[str], rows: dict[str, list[list[int]]]) -> KeyedJaggedTensor:
    values = [v for k in keys for bag in rows[k] for v in bag]
    lengths = [len(bag) for k in keys for bag in rows[k]]
    return KeyedJaggedTensor(
        keys=keys, values=torch.tensor(values), lengths=torch.tensor(lengths, dtype=torch.int32)
    )


def test_sequence_rows_are_averaged():
    model = make_model()
    table = model.embedding_collection.embeddings["s"].weight
    with torch.no_grad():
        table[9] = (table[1] + table[2] + table[6]) / 3
    dense = torch.randn(2, 3).repeat(2, 1)  # samples 0, 1 == samples 2, 3
    rows = {
        "p0": [[1], [2], [1], [2]],
        "p1": [[3], [4], [3], [4]],
        "seq": [[1, 2, 6], [5], [9], [5]],
    }
    logits = model(dense, kjt(["p0", "p1", "seq"], rows))
    assert logits.shape == (4,)
    torch.testing.assert_close(logits[0], logits[2])  # mean of rows 1, 2, 6 == row 9
    torch.testing.assert_close(logits[1], logits[3])


def test_key_order_and_extra_keys_do_not_matter():
    model = make_model()
    rows = {"p0": [[1], [2, 3]], "p1": [[3], []], "seq": [[1, 2], [7]], "other": [[5], [6]]}
    dense = torch.randn(2, 3)
    expected = model(dense, kjt(["p0", "p1", "seq"], rows))
    torch.testing.assert_close(model(dense, kjt(["seq", "other", "p1", "p0"], rows)), expected)


def test_mismatched_dims_are_rejected():
    with pytest.raises(ValueError, match="embedding_dim"):
        make_model(sequence_dim=DIM + 1)
