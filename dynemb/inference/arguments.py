"""The argument checks of the inference modules (dynemb.inference.exportable_tables): the
constructor's feature map and pooling code, and forward's batch, checked so that
tracing (torch.export, fake tensors) needs no data."""

import torch
from torch._subclasses.fake_tensor import FakeTensor

from dynemb.config.types import DynamicEmbPoolingMode
from dynemb.tbe.batch_layout import check_batch

# DynamicEmb's pooling codes (DYNAMICEMB_API.md section 11): -1 none, 1 sum, 2 mean.
DYNAMICEMB_POOLING = {
    -1: DynamicEmbPoolingMode.NONE,
    1: DynamicEmbPoolingMode.SUM,
    2: DynamicEmbPoolingMode.MEAN,
}


def pooling_mode_of(mode) -> DynamicEmbPoolingMode:
    """The pooling of a DynamicEmb code (-1, 1, 2) or a DynamicEmbPoolingMode."""
    if isinstance(mode, DynamicEmbPoolingMode):
        return mode
    if isinstance(mode, int) and not isinstance(mode, bool) and mode in DYNAMICEMB_POOLING:
        return DYNAMICEMB_POOLING[mode]
    raise ValueError(
        f"pooling_mode must be -1 (none), 1 (sum), 2 (mean) or a DynamicEmbPoolingMode, got {mode!r}"
    )


def feature_map(feature_names, feature_table_map, num_tables: int) -> list[int]:
    """Each feature's table (default: one table per feature, in order)."""
    if feature_table_map is None:
        count = len(feature_names) if feature_names is not None else num_tables
        fmap = list(range(count))
    else:
        fmap = [int(t) for t in feature_table_map]
    if not fmap or any(not 0 <= t < num_tables for t in fmap):
        raise ValueError(
            f"feature_table_map must map each feature to a table in [0, {num_tables}), got {fmap}"
        )
    if feature_names is not None and len(feature_names) != len(fmap):
        raise ValueError(f"feature_names has {len(feature_names)} names for {len(fmap)} features")
    return fmap


def check_inference_batch(
    keys, offsets, pooling_offsets, weights, *, device, num_features: int, pooling_mode
) -> None:
    """Checks shapes and dtypes always, offset values only when not tracing (then
    the pooling op still checks them at run time), so that tracing needs no data."""
    if pooling_offsets is not None:
        raise ValueError("pooling_offsets must be None: dynemb pools the bags of `offsets`")
    for name, t in (("keys", keys), ("offsets", offsets)):
        if (
            not isinstance(t, torch.Tensor)
            or t.dtype not in (torch.int64, torch.int32)
            or t.dim() != 1
        ):
            raise TypeError(f"{name} must be a 1-D int64 (or int32) tensor, got {describe(t)}")
        if t.device != device:
            raise ValueError(f"{name} are on {t.device}, the tables are on {device}")
    if (offsets.shape[0] - 1) % num_features:
        raise ValueError(
            f"offsets must have B * F + 1 entries with F={num_features} features, got {offsets.shape[0]}"
        )
    if weights is not None:
        if pooling_mode == DynamicEmbPoolingMode.NONE:
            raise ValueError(
                "per_sample_weights need sum or mean pooling, the pooling_mode is none"
            )
        if not isinstance(weights, torch.Tensor) or weights.shape != keys.shape:
            raise ValueError(
                f"per_sample_weights must be a tensor of shape {tuple(keys.shape)}, got {describe(weights)}"
            )
    if not torch.compiler.is_compiling() and not isinstance(offsets, FakeTensor):
        check_batch(keys, offsets, weights, num_features)  # offsets from 0 to n, never decreasing


def describe(x) -> str:
    """A tensor's dtype and shape, or the repr of anything else (for error messages)."""
    if isinstance(x, torch.Tensor):
        return f"{x.dtype} tensor of shape {tuple(x.shape)}"
    return repr(x)


__all__ = [
    "DYNAMICEMB_POOLING",
    "check_inference_batch",
    "describe",
    "feature_map",
    "pooling_mode_of",
]
