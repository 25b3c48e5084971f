"""DLRM over pooled features and mean-pooled sequence features.

The model of ``example.py`` and of the W-quality benchmark; one definition, so that
the benchmark measures exactly what the example trains. Its embedding modules are
ordinary TorchRec modules (built on the meta device); which of their tables are
dynamic is decided by the sharding plan, not by the model.
"""

import torch
from torch import nn
from torchrec.models.dlrm import DenseArch, InteractionArch, OverArch
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection
from torchrec.sparse.jagged_tensor import JaggedTensor, KeyedJaggedTensor

__all__ = ["SequenceDLRM", "mean_of_rows"]


class SequenceDLRM(nn.Module):
    """DLRM (dense MLP, embeddings, pairwise dot products, over MLP) with sequence features.

    The embeddings of the ``embedding_bag_collection``'s features (pooled by their
    tables) and of the ``embedding_collection``'s features (one row per id, averaged
    here per sample) form ``F`` vectors of width ``D``; with the dense MLP's output
    they enter torchrec's ``InteractionArch`` (all pairwise dot products), whose
    output the over MLP maps to one logit.

    Args:
        embedding_bag_collection: pooled features; every table of width ``D``.
        dense_in_features: dense features per sample.
        dense_arch_layer_sizes: dense MLP widths, the last one ``D``.
        over_arch_layer_sizes: over MLP widths, the last one 1.
        embedding_collection: sequence features (tables of width ``D``), or None.

    Example::

        ebc = EmbeddingBagCollection(tables=[EmbeddingBagConfig(name="t0", embedding_dim=16,
            num_embeddings=100, feature_names=["f0"])], device=torch.device("meta"))
        ec = EmbeddingCollection(tables=[EmbeddingConfig(name="t1", embedding_dim=16,
            num_embeddings=100, feature_names=["f1"])], device=torch.device("meta"))
        model = SequenceDLRM(ebc, 4, [32, 16], [32, 1], embedding_collection=ec)
        # after DistributedModelParallel(model, ...): B = 2 samples,
        #   f0 = [[3], [5]], f1 = [[1, 2], [7]]  (f1 of sample 0 is the mean of rows 1 and 2)
        kjt = KeyedJaggedTensor(keys=["f0", "f1"], values=torch.tensor([3, 5, 1, 2, 7]),
                                lengths=torch.tensor([1, 1, 2, 1], dtype=torch.int32))
        logits = model(torch.randn(2, 4), kjt)  # (2,)
    """

    def __init__(
        self,
        embedding_bag_collection: EmbeddingBagCollection,
        dense_in_features: int,
        dense_arch_layer_sizes: list[int],
        over_arch_layer_sizes: list[int],
        embedding_collection: EmbeddingCollection | None = None,
    ) -> None:
        super().__init__()
        self.pooled_features = [
            f for t in embedding_bag_collection.embedding_bag_configs() for f in t.feature_names
        ]
        configs = embedding_collection.embedding_configs() if embedding_collection else []
        self.sequence_features = [f for t in configs for f in t.feature_names]
        dims = {t.embedding_dim for t in embedding_bag_collection.embedding_bag_configs()}
        dims |= {t.embedding_dim for t in configs}
        if dims != {dense_arch_layer_sizes[-1]}:
            raise ValueError(
                f"every table's embedding_dim must equal dense_arch_layer_sizes[-1] = "
                f"{dense_arch_layer_sizes[-1]}, got dims {sorted(dims)}"
            )
        if over_arch_layer_sizes[-1] != 1:
            raise ValueError(f"over_arch_layer_sizes must end with 1, got {over_arch_layer_sizes}")
        dim = dense_arch_layer_sizes[-1]
        num_sparse = len(self.pooled_features) + len(self.sequence_features)
        self.embedding_bag_collection = embedding_bag_collection
        self.embedding_collection = embedding_collection
        self.dense_arch = DenseArch(dense_in_features, dense_arch_layer_sizes)
        self.inter_arch = InteractionArch(num_sparse)
        interactions = dim + num_sparse + num_sparse * (num_sparse - 1) // 2
        self.over_arch = OverArch(interactions, over_arch_layer_sizes)

    def forward(
        self, dense_features: torch.Tensor, sparse_features: KeyedJaggedTensor
    ) -> torch.Tensor:
        """Logits of a batch.

        Args:
            dense_features: ``(B, dense_in_features)`` float32.
            sparse_features: the pooled and the sequence features (any key order;
                other keys are ignored), ``B`` samples each.

        Returns:
            ``(B,)`` float32 logits.
        """
        pooled, sequences = self._split(sparse_features)
        dense = self.dense_arch(dense_features)
        embeddings = self.embedding_bag_collection(pooled).to_dict()
        columns = [embeddings[f] for f in self.pooled_features]
        if self.embedding_collection is not None:
            jagged = self.embedding_collection(sequences)
            columns += [_mean(jagged[f]) for f in self.sequence_features]
        sparse = torch.stack(columns, dim=1)  # (B, F, D)
        return self.over_arch(self.inter_arch(dense, sparse)).squeeze(-1)

    def split_features(self, kjt: KeyedJaggedTensor) -> tuple[KeyedJaggedTensor, KeyedJaggedTensor]:
        """The (pooled, sequence) features forward gives its two collections (e.g. to
        prefetch them: dynemb.tiering.distribute_for_prefetch)."""
        return self._split(kjt)

    def _split(self, kjt: KeyedJaggedTensor) -> tuple[KeyedJaggedTensor, KeyedJaggedTensor]:
        wanted = self.pooled_features + self.sequence_features
        if kjt.keys() != wanted:  # e.g. the dataset's order; a permute is one gather
            index = {key: i for i, key in enumerate(kjt.keys())}
            kjt = kjt.permute([index[key] for key in wanted])
        pooled, sequences = kjt.split([len(self.pooled_features), len(self.sequence_features)])
        return pooled, sequences


def _mean(jagged: JaggedTensor) -> torch.Tensor:
    return mean_of_rows(jagged.values(), jagged.lengths())


def mean_of_rows(values: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """``(B, D)`` mean of each sample's rows (zeros for an empty sample): ``values``
    ``(n, D)`` the rows of the ``B`` samples one after the other, ``lengths`` ``(B,)``
    their counts. SequenceDLRM's pooling of sequence features, public so that a serving
    model (examples/serve.py) computes it identically; no data-dependent shapes, so
    ``torch.export`` traces it."""
    segments = torch.repeat_interleave(
        torch.arange(lengths.shape[0], device=values.device),
        lengths.long(),
        output_size=values.shape[0],
    )
    sums = values.new_zeros(lengths.shape[0], values.shape[1]).index_add_(0, segments, values)
    return sums / lengths.clamp(min=1).unsqueeze(1).to(values.dtype)
