"""Random sequences of table ops, checkpoint dumps and loads, and published deltas, checked
against the dict-based ReferenceTable after every step (hypothesis; on a failure the
falsifying sequence is printed, and each step is noted as it runs).

The table is a module's LFU table large enough that nothing is evicted; a dump then a
load (into the same module: a load restores) must give back exactly what the oracle
holds (rows and LFU counts), and a serving module loaded from the published base and
every delta so far must look the stored keys up as the oracle's rows.
"""

import tempfile
from pathlib import Path

import numpy as np
import torch
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from dynemb import (
    BatchedDynamicEmbeddingTables,
    DynamicEmbDump,
    DynamicEmbInitializerArgs,
    DynamicEmbLoad,
    DynamicEmbPoolingMode,
    DynamicEmbScoreStrategy,
    DynamicEmbTableOptions,
)
from dynemb.deltas import DeltaPublisher, delta_path
from dynemb.inference.exportable_tables import InferenceEmbeddingCollection
from tests.support import reference as ref

DIM, CAPACITY, BUCKET, SEED = 4, 1024, 128, 5
OPTIONS = DynamicEmbTableOptions(
    dim=DIM,
    max_capacity=CAPACITY,
    bucket_capacity=BUCKET,
    score_strategy=DynamicEmbScoreStrategy.LFU,
    initializer_args=DynamicEmbInitializerArgs(lower=-0.1, upper=0.1),
    seed=SEED,
)
EDGE = [0, -1, 2**63 - 1, -(2**63)]

keys = st.lists(st.integers(0, 200) | st.sampled_from(EDGE), min_size=0, max_size=24)
ops = st.lists(
    st.one_of(
        st.tuples(st.just("find_or_insert"), keys),
        st.tuples(st.just("insert_or_assign"), keys, st.integers(0, 2**16)),
        st.tuples(st.just("erase"), keys),
        st.tuples(st.just("dump_and_load")),
        st.tuples(st.just("publish")),
    ),
    min_size=1,
    max_size=10,
)


class _Run:
    """The module under test, its oracle, and the chain of published versions."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.module = BatchedDynamicEmbeddingTables(
            [OPTIONS], [0], pooling_mode=DynamicEmbPoolingMode.NONE, table_names=["t"]
        )
        self.oracle = ref.ReferenceTable(
            DIM, CAPACITY, CAPACITY, BUCKET, ref.LFU, seed=SEED, init=(2, -0.1, 0.1)
        )
        self.publisher = DeltaPublisher(self.module, directory / "chain")
        self.publisher.publish_base()
        self.versions = 0
        self.dumps = 0

    @property
    def table(self):
        return self.module.tables[0]

    def apply(self, op) -> None:
        kind, args = op[0], op[1:]
        if kind in ("find_or_insert", "insert_or_assign", "erase"):
            batch = torch.tensor(args[0], dtype=torch.int64)
            if kind == "find_or_insert":
                self.table.find_or_insert(batch)
                self.oracle.upsert(batch.tolist())
            elif kind == "insert_or_assign":
                gen = torch.Generator().manual_seed(args[1])
                values = torch.randn(batch.numel(), DIM, generator=gen)
                self.table.insert_or_assign(batch, values)
                self.oracle.upsert(batch.tolist(), values=values.numpy())
            else:
                assert self.table.erase(batch) == self.oracle.erase(batch.tolist())
        elif kind == "dump_and_load":
            self.dumps += 1
            path = self.directory / f"ckpt-{self.dumps}"
            DynamicEmbDump(path, self.module)
            DynamicEmbLoad(path, self.module)
        else:
            self.versions = self.publisher.publish()
            self.check_serving()
        self.check_table()

    def check_table(self) -> None:
        k, v, s, _ = self.table.export_batch(0, self.table.capacity())
        got = {key: (row, score) for key, row, score in zip(k.tolist(), v, s.tolist())}
        assert set(got) == set(self.oracle.entries), "stored keys"
        for key, (row, score) in got.items():
            want = self.oracle.entries[key]
            assert ref.isclose_rows(row, want[0][:DIM]), f"row of key {key}"
            assert score == want[1], f"LFU count of key {key}"

    def check_serving(self) -> None:
        serving = InferenceEmbeddingCollection([OPTIONS], table_names=["t"])
        serving.load_from_dynamicemb_file(self.publisher.base_path)
        for version in range(1, self.versions + 1):
            serving.apply_delta(delta_path(self.publisher.directory, version))
        stored = sorted(self.oracle.entries)
        assert serving.sizes == [len(stored)]
        if stored:
            rows = serving(torch.tensor(stored), torch.arange(len(stored) + 1))
            want = np.stack([self.oracle.entries[key][0][:DIM] for key in stored])
            assert ref.isclose_rows(rows, want), "served rows"


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(sequence=ops)
def test_random_sequences_match_the_reference_table(sequence):
    with tempfile.TemporaryDirectory() as directory:
        run = _Run(Path(directory))
        try:
            for step, op in enumerate(sequence):
                note(f"step {step}: {op!r}")
                run.apply(op)
            run.versions = run.publisher.publish()
            run.check_serving()
        finally:  # its writer and capture threads end with each example
            run.publisher.close()
