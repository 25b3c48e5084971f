"""The MEAN divisor of a sharded EBC: TorchRec's on row-wise MEAN columns, exactly 1
elsewhere (table-wise / column-wise MEAN tables are averaged by their kernel)."""

import pytest
import torch

from dynemb.shard.mean_divisor import divided_columns, exact_divisor

pytestmark = pytest.mark.no_emulated_pass("a tensor mask: no table op runs")


def test_only_row_wise_mean_columns_keep_torchrecs_divisor():
    # f0 (dim 2): row-wise MEAN; f1 (dim 3): table-wise MEAN; f0@t2 (dim 1): f0 shared
    # by another row-wise MEAN table.
    columns = divided_columns(["f0", "f1", "f0@t2"], [2, 3, 1], ["f0"])
    assert columns.tolist() == [True, True, False, False, False, True]
    lengths = torch.tensor([[2.0], [3.0]]) + 1e-6  # TorchRec's divisor for 2 samples
    divisor = lengths.expand(2, 6).contiguous()
    got = exact_divisor(divisor, columns)
    assert torch.equal(got[:, columns], divisor[:, columns])
    assert torch.equal(got[:, ~columns], torch.ones(2, 3))  # exactly 1, no 1e-6
