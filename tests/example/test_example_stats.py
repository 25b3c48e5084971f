"""``example.py --stats``: after each epoch the lead rank prints every rank's table of
its dynamic tables' telemetry; each rank's counts are its own shard's."""

import pytest

from tests.support.example_runs import run_example
from tests.support.multiprocess import free_port

# 256 rows per table for 1,000 ids per feature: the tables evict.
SIZES = "--num_train 2048 --num_eval 600 --vocab_size 1000 --capacity 256 --batch_size 256"
TABLES = ["t_f0", "t_f1", "t_f2", "t_f3", "t_f4", "t_f5", "t_f7"]  # f6 is ordinary


def _tables(block: str) -> dict:
    """``{table: (steps, hits, inserted, evicted, failed)}`` of one printed summary."""
    rows = {}
    for line in block.splitlines()[1:]:
        fields = line.split()
        rows[fields[0]] = tuple(int(v) for v in fields[1:6])
    return rows


@pytest.mark.no_emulated_pass("two torchrun processes: their table ops are tested elsewhere")
def test_stats_prints_each_ranks_tables_after_each_epoch():
    torchrun = ("-m", "torch.distributed.run", "--nproc_per_node=2")
    torchrun += ("--master_port", str(free_port()))
    out = run_example(["--train", "--stats", "--epochs", "2", *SIZES.split()], torchrun,
                      OMP_NUM_THREADS="1")  # fmt: skip
    blocks = out.split("telemetry:\n")[1:]
    assert len(blocks) == 4  # 2 epochs x 2 ranks
    first = [_tables(b.split("\nepoch")[0].split("\ndone")[0]) for b in blocks[:2]]
    for rows in first:
        assert list(rows) == TABLES
        for steps, hits, inserted, *_ in rows.values():  # 2048 rows / (2 ranks x 256 samples)
            assert steps == 4 and hits > 0 and inserted > 0
    assert sum(rows["t_f0"][3] for rows in first) > 0  # the small tables evict (and fail keys)
    t_f0 = [line for line in blocks[0].splitlines() if line.startswith("t_f0")][0]
    assert "seconds" in t_f0  # the evicted keys' age (TIMESTAMP scores), sampled every step
    assert "epoch 2/2, rank 1 telemetry" in out


def test_stats_refuses_static_tables(capsys):
    import example

    assert example.main(["--train", "--stats", "--static"]) == 2
    assert "--stats reports dynamic tables" in capsys.readouterr().err
