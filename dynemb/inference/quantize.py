"""8-bit rows of serving tables (csrc/core/quantized_rows.h): the row layout, the
quantizers, a decoder for tests and tools, and the error bound of each format.

A row of ``dim`` elements is ``dim`` codes then float32 parameters (fbgemm's fused
rowwise layout, codes first):

* ``torch.int8`` (INT8, fbgemm's 8-bit rowwise): per row ``bias = min``, ``scale =
  (max - min) / 255``, code ``q = round((x - bias) / scale)`` in [0, 255] (0 where the
  row is all one value, scale 0); decoded ``fmaf(q, scale, bias)``. ``dim + 8`` bytes.
* ``torch.float8_e4m3fn`` (E4M3): per row ``scale = max|x| / 448`` (1 for a zero
  row), code ``e4m3(x / scale)`` (round to nearest even, torch's cast); decoded
  ``scale * e4m3_value(code)``. ``dim + 4`` bytes.

Parameters are float32, not fp16: an fp16 bias of a row far from zero would err by
more than half a step and break the int8 bound below.

Error bound of one element x of a row (``element_error_bound``; derived in
DynamicEmb_APIs.md, "8-bit rows"; checked by tests/inference/test_quantized_rows.py):

* INT8: ``|x - x̂| <= scale * (1/2 + 2^-14) + 2^-23 * max(|min|, |max|)``: half a step,
  plus the float roundings of the code's division and of the decode.
* E4M3: ``|x - x̂| <= 2^-4 * |x| + 2^-10 * scale + 2^-20 * max|x|``: half an e4m3 ulp
  (3 mantissa bits) in the normal range, half the subnormal spacing (2^-9) below it,
  plus float roundings.

A pooled bag errs by at most ``sum_i |w_i| * e_i`` (MEAN: divided by the bag's
length) plus the float rounding of the pooling itself.
"""

import torch

from dynemb import _ops

# weights_dtype -> the row format's code (core RowFormat).
FORMATS: dict[torch.dtype, int] = {
    torch.int8: _ops.ROW_FORMAT_CODES["INT8"],
    torch.float8_e4m3fn: _ops.ROW_FORMAT_CODES["E4M3"],
}
_PARAMETERS = {torch.int8: 2, torch.float8_e4m3fn: 1}  # float32 parameters after the codes
_E4M3_MAX = 448.0


def check_weights_dtype(weights_dtype) -> None:
    """None (float rows), torch.int8 or torch.float8_e4m3fn."""
    if weights_dtype is not None and weights_dtype not in FORMATS:
        raise ValueError(
            "weights_dtype must be None (float rows), torch.int8 or torch.float8_e4m3fn, "
            f"got {weights_dtype!r}"
        )


def row_bytes(weights_dtype: torch.dtype, dim: int) -> int:
    """Bytes of one stored row: ``dim`` codes and the float32 parameters."""
    check_weights_dtype(weights_dtype)
    return dim + 4 * _PARAMETERS[weights_dtype]


def quantize_rows(values: torch.Tensor, weights_dtype: torch.dtype) -> torch.Tensor:
    """(n, dim) float rows -> (n, row_bytes) uint8 rows, quantized on the host (the
    same bytes whatever the table's device).

    Raises:
        ValueError: an unknown ``weights_dtype``, rows that are not 2-D, or a row with
            a non-finite element or range (nothing to scale it by).
    """
    check_weights_dtype(weights_dtype)
    if weights_dtype is None:
        raise ValueError("quantize_rows needs weights_dtype torch.int8 or torch.float8_e4m3fn")
    if values.dim() != 2:
        raise ValueError(f"values must be (n, dim) rows, got shape {tuple(values.shape)}")
    x = values.detach().to("cpu", torch.float32)
    n, dim = x.shape
    if not bool(torch.isfinite(x).all()):
        bad = int(torch.nonzero(~torch.isfinite(x).all(dim=1))[0, 0])
        raise ValueError(f"row {bad} has a non-finite element; 8-bit rows need finite values")
    if weights_dtype == torch.int8:
        lo = x.amin(dim=1) if dim else torch.zeros(n)
        hi = x.amax(dim=1) if dim else torch.zeros(n)
        scale = (hi - lo) / 255.0
        if not bool(torch.isfinite(scale).all()):
            bad = int(torch.nonzero(~torch.isfinite(scale))[0, 0])
            raise ValueError(
                f"row {bad} spans [{float(lo[bad])}, {float(hi[bad])}]: its range overflows float32"
            )
        steps = (x - lo[:, None]) / torch.where(scale > 0, scale, 1.0)[:, None]
        codes = torch.where(scale[:, None] > 0, torch.round(steps), 0.0).clamp(0, 255)
        params = torch.stack([scale, lo], dim=1)
        codes = codes.to(torch.uint8)
    else:
        amax = x.abs().amax(dim=1) if dim else torch.zeros(n)
        scale = torch.where(amax > 0, amax / _E4M3_MAX, 1.0)
        y = (x / scale[:, None]).clamp(-_E4M3_MAX, _E4M3_MAX)
        codes = y.to(torch.float8_e4m3fn).view(torch.uint8)
        params = scale[:, None]
    return torch.cat([codes, params.contiguous().view(torch.uint8)], dim=1)


def dequantize_rows(rows: torch.Tensor, weights_dtype: torch.dtype, dim: int) -> torch.Tensor:
    """(n, row_bytes) uint8 -> (n, dim) float32: each element decoded by the kernels'
    rule (E4M3: the same bits; INT8: fmaf in float64, rounded once to float32, the
    same bits save where a rare double rounding differs by one ulp)."""
    check_weights_dtype(weights_dtype)
    rows = rows.to("cpu").contiguous()
    expected = row_bytes(weights_dtype, dim)
    if rows.dtype != torch.uint8 or rows.dim() != 2 or rows.shape[1] != expected:
        raise ValueError(
            f"rows must be (n, {expected}) uint8 for {weights_dtype} dim={dim}, got "
            f"{rows.dtype} of shape {tuple(rows.shape)}"
        )
    codes = rows[:, :dim]
    params = rows[:, dim:].contiguous().view(torch.float32)
    if weights_dtype == torch.int8:
        # fmaf(q, scale, bias): one rounding, as float64 (exact product) rounded once
        exact = codes.double() * params[:, :1].double() + params[:, 1:].double()
        return exact.float()
    return codes.contiguous().view(torch.float8_e4m3fn).float() * params[:, :1]


def element_error_bound(values: torch.Tensor, weights_dtype: torch.dtype) -> torch.Tensor:
    """(n, dim) float64: the bound on ``|x - x̂|`` of each element of float rows
    ``values`` once quantized (the module docstring's formulas)."""
    check_weights_dtype(weights_dtype)
    x = values.detach().to("cpu", torch.float64)
    if weights_dtype == torch.int8:
        lo, hi = x.amin(dim=1, keepdim=True), x.amax(dim=1, keepdim=True)
        scale = (hi - lo) / 255.0
        bound = scale * (0.5 + 2.0**-14) + 2.0**-23 * torch.maximum(lo.abs(), hi.abs())
        return bound.expand_as(x)
    amax = x.abs().amax(dim=1, keepdim=True)
    scale = amax / _E4M3_MAX
    return 2.0**-4 * x.abs() + 2.0**-10 * scale + 2.0**-20 * amax


__all__ = [
    "FORMATS",
    "check_weights_dtype",
    "dequantize_rows",
    "element_error_bound",
    "quantize_rows",
    "row_bytes",
]
