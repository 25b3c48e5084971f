"""A checkpoint moves between sharding types and world sizes, exactly: a model (an EBC,
or an EC) of two dynamic tables trained row-wise on 4 gloo ranks is dumped, loaded table-wise on 2 and
dumped, loaded column-wise on 2 (a column slice of every row on each rank) and dumped,
and loaded row-wise on 4 again. After every load the model holds the trained keys,
rows, optimizer state and scores bit for bit (a slice: its columns of each row, and its
columns' optimizer state; row-wise Adagrad's one row state on every slice), and the next
forward gives the trained model's outputs. A column-wise model trained further (its
slices' row-wise Adagrad states part) loads into the same plan slice for slice, and
into the row-wise plan as whole rows: the slices' columns side by side, Adam's moments
joined, and row-wise Adagrad's state the width-weighted mean of its slices' states.

dynemb holds one slice of a column-wise dynamic table per rank (two slices on one rank
raise ValueError), so column-wise runs on 2 ranks here."""

import json
import shutil

import pytest
import torch

from dynemb.checkpoint import CheckpointError
from dynemb.deltas import delta_path, read_delta
from dynemb.dump_files.manifest import read_manifest
from dynemb.inference.exportable_tables import InferenceEmbeddingCollection
from dynemb.warm_start.dump_source import read_dumped_table
from tests.support.checkpoint_plans_workers import (
    DIMS,
    GLOBAL_BATCH,
    STEPS,
    Case,
    back_to_row_wise,
    erased_keys,
    incremental_under_plans,
    publish_under_plans,
    seen_keys,
    serving_options,
    through_table_row_wise,
    through_two_ranks,
    train_and_dump,
)
from tests.support.checkpoint_tables import edit_manifest
from tests.support.multiprocess import run_ranks
from tests.support.table_wise_workers import global_batch

pytestmark = pytest.mark.no_emulated_pass(
    "spawned-rank dumps and loads under TorchRec plans: the table ops they use are tested per executor elsewhere"
)

CASES = [
    Case("EXACT_ROWWISE_ADAGRAD"),
    Case("ADAM"),
    Case("EXACT_SGD"),
    Case("EXACT_ROWWISE_ADAGRAD", sequence=True),
]


def _union(pieces: list) -> dict[str, torch.Tensor]:
    """Row-wise shares (or one whole table) as one table, by ascending key."""
    keys = torch.cat([p[2]["keys"] for p in pieces])
    order = torch.argsort(keys)
    return {f: torch.cat([p[2][f] for p in pieces])[order] for f in ("keys", "values", "scores")}


def _slice(whole: dict, optimizer: str, dim: int, offset: int, width: int) -> dict:
    """What the slice of columns [offset, offset + width) of ``whole`` holds: those
    columns, Adam's moments of those columns, row-wise Adagrad's row state as it is."""
    values = whole["values"]
    columns = [values[:, offset : offset + width]]
    if optimizer == "ADAM":
        columns += [values[:, dim + offset : dim + offset + width],
                    values[:, 2 * dim + offset : 2 * dim + offset + width]]  # fmt: skip
    elif optimizer == "EXACT_ROWWISE_ADAGRAD":
        columns.append(values[:, dim:])
    return {"keys": whole["keys"], "values": torch.cat(columns, 1), "scores": whole["scores"]}


def _join(pieces: list, optimizer: str, dim: int) -> dict:
    """Column slices as whole rows (the oracle of a load into whole rows): columns and
    Adam's moments side by side, row-wise Adagrad's state averaged by slice width."""
    pieces = sorted(pieces, key=lambda p: p[1])
    widths = [(dim if i + 1 == len(pieces) else pieces[i + 1][1]) - p[1] for i, p in enumerate(pieces)]  # fmt: skip
    parts = [p[2]["values"] for p in pieces]
    columns = [v[:, :w] for v, w in zip(parts, widths)]
    if optimizer == "ADAM":
        columns += [v[:, w : 2 * w] for v, w in zip(parts, widths)]
        columns += [v[:, 2 * w :] for v, w in zip(parts, widths)]
    elif optimizer == "EXACT_ROWWISE_ADAGRAD":
        columns.append(sum(v[:, w:] * w for v, w in zip(parts, widths)) / dim)
    first = pieces[0][2]
    return {"keys": first["keys"], "values": torch.cat(columns, 1), "scores": first["scores"]}


def _whole(pieces: list, optimizer: str, dim: int) -> dict:
    """A table's pieces as whole rows: column slices joined, else shares united."""
    return _join(pieces, optimizer, dim) if any(p[1] for p in pieces) else _union(pieces)


def _equal(got: dict, want: dict, what: str) -> None:
    for field in ("keys", "values", "scores"):
        assert got[field].shape == want[field].shape, (what, field)
        assert torch.equal(got[field], want[field]), (what, field)


def _slices_equal(pieces: list, whole: dict, optimizer: str, dim: int, what: str) -> None:
    offsets = sorted(p[1] for p in pieces)
    assert offsets == [0, dim // 2], (what, offsets)  # two slices, one per rank
    for rank, offset, got in pieces:
        _equal(got, _slice(whole, optimizer, dim, offset, dim // 2), f"{what} rank {rank}")


def _warm_start_reads(dump: str, name: str, want: dict, what: str) -> None:
    keys, values, state = read_dumped_table(dump, name)
    rows = values if state is None else torch.cat([values, state], 1)
    order = torch.argsort(keys)
    assert torch.equal(keys[order], want["keys"]), f"{what}: warm start from {dump}"
    assert torch.equal(rows[order], want["values"]), f"{what}: warm start from {dump}"


def test_checkpoint_moves_row_wise_4_table_wise_2_column_wise_2_row_wise_4(tmp_path):
    path = str(tmp_path)
    trained = run_ranks(train_and_dump, 4, CASES, path, timeout=120)[0]
    two = run_ranks(through_two_ranks, 2, CASES, path, timeout=120)[0]
    back = run_ranks(back_to_row_wise, 4, CASES, path, timeout=120)[0]
    for c, case in enumerate(CASES):
        opt = case.optimizer
        pieces, next_outputs = trained[c]
        whole = {name: _union(pieces[name]) for name in DIMS}
        assert all(w["keys"].numel() > 10 for w in whole.values()), "tables must be populated"
        (by_tw, tw_out), (by_cw, cw_out), (again, again_out), cw_trained = two[c]
        (from_cw, rw_out), (from_trained, trained_out) = back[c]
        for name, dim in DIMS.items():
            what = f"{case.name} {name}"
            assert len(by_tw[name]) == 1, what  # table-wise: held whole by one rank
            _equal(by_tw[name][0][2], whole[name], f"{what}: table-wise on 2")
            _slices_equal(by_cw[name], whole[name], opt, dim, f"{what}: column-wise on 2")
            _equal(_union(from_cw[name]), whole[name], f"{what}: row-wise on 4 again")
            # The column-wise model trained further: slice for slice into its plan...
            mine = {rank: got for rank, _, got in cw_trained[name]}
            for rank, _, got in again[name]:
                _equal(
                    got, mine[rank], f"{what}: trained column-wise into column-wise, rank {rank}"
                )
            # ... and as whole rows into the row-wise plan.
            joined = _join(cw_trained[name], opt, dim)
            got = _union(from_trained[name])
            assert torch.equal(got["keys"], joined["keys"]) and torch.equal(
                got["scores"], joined["scores"]
            )
            assert torch.equal(got["values"][:, :dim], joined["values"][:, :dim]), what
            if opt == "EXACT_ROWWISE_ADAGRAD":  # the mean of the slices' means: rounding
                states = [p[2]["values"][:, -1] for p in cw_trained[name]]
                assert not torch.equal(states[0], states[1]), (
                    f"{what}: the slices' states must part"
                )
                torch.testing.assert_close(
                    got["values"][:, dim:], joined["values"][:, dim:], rtol=1e-6, atol=0
                )
            else:
                assert torch.equal(got["values"], joined["values"]), what
            # A warm start reads a column-wise dump as the row-wise load does: whole rows.
            _warm_start_reads(f"{path}/{case.name}/column_wise", name, whole[name], what)
            _warm_start_reads(f"{path}/{case.name}/cw_trained", name, got, what)
        for outputs, where in (
            (tw_out, "table-wise"),
            (cw_out, "column-wise"),
            (rw_out, "row-wise"),
        ):
            assert torch.equal(outputs, next_outputs), (
                f"{case.name}: next forward after the {where} load"
            )
        torch.testing.assert_close(trained_out, again_out, atol=1e-6, rtol=0)
    _column_slices_schema(tmp_path / "EXACT_ROWWISE_ADAGRAD" / "column_wise", tmp_path / "edited")


def test_checkpoint_moves_row_wise_4_table_row_wise_4_row_wise_4(tmp_path):
    """Table-row-wise on 2 nodes of 2 ranks (table a on the last node, b on the first):
    a row-wise dump loads into it, its dump loads back row-wise, bit for bit."""
    path, cases = str(tmp_path), [c for c in CASES if not c.sequence]
    trained = run_ranks(train_and_dump, 4, cases, path, timeout=120)[0]
    moved = run_ranks(through_table_row_wise, 4, cases, path, timeout=120)[0]
    for c, case in enumerate(cases):
        pieces, next_outputs = trained[c]
        (by_twrw, twrw_out), (back, back_out) = moved[c]
        for name, node in (("a", {2, 3}), ("b", {0, 1})):
            what = f"{case.name} {name}"
            whole = _union(pieces[name])
            assert {rank for rank, _, _ in by_twrw[name]} == node, what
            _equal(_union(by_twrw[name]), whole, f"{what}: table-row-wise on 4")
            _equal(_union(back[name]), whole, f"{what}: row-wise on 4 again")
        assert torch.equal(twrw_out, next_outputs), f"{case.name}: after the TWRW load"
        assert torch.equal(back_out, next_outputs), f"{case.name}: after the row-wise load"


def _slices(edit):
    return lambda m: edit(m["tables"]["a"])


def _column_slices_schema(path, copy):
    """The manifest of a column-wise dump: version 3, the slices in column order; a
    manifest whose slices do not cover the columns once, or whose slices hold other
    keys, is refused by read_manifest (before a load changes anything)."""
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["version"] == 3
    assert manifest["tables"]["a"]["column_slices"] == [[0, 4], [4, 4]]
    assert manifest["tables"]["b"]["column_slices"] == [[0, 4], [4, 4]]
    for edit, message in [
        (
            _slices(lambda t: t.__setitem__("column_slices", [[0, 4], [3, 5]])),
            r"column_slices\[1\]\[0\] must be an integer in \[4, 4\]",
        ),
        (
            _slices(lambda t: t.__setitem__("column_slices", [[0, 4], [4, 3]])),
            r"the columns covered\) must be an integer in \[8, 8\]",
        ),
        (
            _slices(lambda t: t.__setitem__("column_slices", [[0, 8]])),
            r"column_slices must be a list of 2",
        ),
        (
            _slices(lambda t: t["files"][1]["fields"]["keys"].__setitem__("crc32", 1)),
            r"files\[1\] must be a slice of the same keys",
        ),
        (lambda m: m.__setitem__("version", 2), r"tables\['a'\] must be an object with keys"),
    ]:
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(path, copy)
        edit_manifest(copy, edit)
        with pytest.raises(CheckpointError, match=message):
            read_manifest(copy)


# (world size, plans): the 2-rank plans, and table-row-wise on 2 nodes of 2 ranks.
PLANS_BY_WORLD = [(2, ("table_wise", "column_wise", "one_slice")), (4, ("table_row_wise",))]


@pytest.mark.parametrize("world_size,plan_names", PLANS_BY_WORLD, ids=["2-ranks", "twrw-4"])
def test_incremental_dump_under_every_sharding_type(tmp_path, world_size, plan_names):
    """incremental_dump over the group under the table-wise, column-wise and
    table-row-wise plans: the entries the step touched, whole rows (a column-wise
    table's slices joined by key, a table-row-wise table's shares on its node's ranks
    gathered), the same under every plan."""
    case = Case("ADAM")
    run_ranks(train_and_dump, 4, [case], str(tmp_path), timeout=120)
    plans = run_ranks(
        incremental_under_plans, world_size, case, str(tmp_path), plan_names, timeout=120
    )[0]
    disagree = plans.pop("disagree", None)
    lengths, keys = global_batch(STEPS, GLOBAL_BATCH, len(DIMS))
    first = int(lengths[0].sum())
    touched = {"a": keys[:first].unique(), "b": keys[first:].unique()}
    dumps = {}
    for plan, (dumped, pieces) in plans.items():
        for name, dim in DIMS.items():
            got_keys, rows, scores = dumped[name]
            order = torch.argsort(got_keys)
            assert torch.equal(got_keys[order], touched[name]), (plan, name)
            whole = _whole(pieces[name], "ADAM", dim)
            at = torch.searchsorted(whole["keys"], got_keys[order])
            assert torch.equal(rows[order], whole["values"][at, :dim]), (plan, name)
            assert torch.equal(scores[order], whole["scores"][at]), (plan, name)
            dumps[plan, name] = rows[order]
        if plan == "table_row_wise":  # a on the last node, b on the first
            for name, node in (("a", {2, 3}), ("b", {0, 1})):
                assert {rank for rank, _, _ in pieces[name]} == node, name
    if disagree is None:
        return
    for name in DIMS:
        for plan in ("column_wise", "one_slice"):
            assert torch.equal(dumps["table_wise", name], dumps[plan, name]), (plan, name)
    # Slices that disagree (a key erased from one slice): refused, nothing committed.
    (dump0, incr0), (dump1, incr1) = disagree
    assert dump0.startswith("RuntimeError: DynamicEmbDump: the column slices of table 'a'")
    assert "rank 0 of 2 failed" in dump1
    for error in (incr0, incr1):
        assert "the column slices of table 'a' of 'model' hold different keys" in error
    assert not (tmp_path / "disagree" / "manifest.json").exists()


@pytest.mark.parametrize(
    "world_size,plan_names",
    [(2, ("table_wise", "column_wise")), (4, ("table_row_wise",))],
    ids=["2-ranks", "twrw-4"],
)
def test_deltas_under_every_sharding_type_replay_to_the_trained_rows(
    tmp_path, world_size, plan_names
):
    """A DeltaPublisher over the table-wise and the column-wise plan on 2 ranks, and the
    table-row-wise plan on 2 nodes of 2: the base and deltas are whole rows (a
    column-wise table's slices joined, Adam's moments too; a table-row-wise table's
    shares gathered from its node), and a serving module that loads the base and
    replays the deltas holds exactly the trained rows of every stored key and nothing
    else (erased keys gone), as one filled by load_from_model from the trained model
    does."""
    plans = run_ranks(
        publish_under_plans, world_size, Case("ADAM"), str(tmp_path), plan_names, timeout=120
    )[0]
    for plan, (version, pieces, (model_sizes, model_rows), erased) in plans.items():
        root = tmp_path / plan
        assert version == STEPS - 1
        holders = [count for count in erased if count is not None]
        if plan == "table_row_wise":  # a's shares on the last node's ranks: 3 in all
            assert [c is not None for c in erased] == [False, False, True, True], erased
            assert sum(holders) == 3, erased
        else:  # every holder of a's whole rows (or of a slice of them) erased 3
            assert holders and all(count == 3 for count in holders), erased
        serving = InferenceEmbeddingCollection(
            [serving_options(dim) for dim in DIMS.values()], table_names=list(DIMS)
        )
        serving.load_from_dynamicemb_file(root / "base")
        for v in range(1, version + 1):
            assert serving.apply_delta(delta_path(root, v)) == v
        last = read_delta(delta_path(root, version)).tables
        wholes = {}
        for name, dim in DIMS.items():
            whole = _whole(pieces[name], "ADAM", dim)
            wholes[name] = whole
            delta = last[name]
            at = torch.searchsorted(whole["keys"], delta.keys)
            assert torch.equal(whole["keys"][at], delta.keys), (plan, name)
            assert torch.equal(delta.values, whole["values"][at, :dim]), (plan, name)
            assert torch.equal(delta.state, whole["values"][at, dim:]), (plan, name)
        assert torch.equal(torch.sort(last["a"].tombstones).values, erased_keys()), plan
        assert serving.sizes == [wholes[n]["keys"].numel() for n in DIMS], plan
        counts = [wholes[n]["keys"].numel() for n in DIMS]
        bags = max(counts)
        lengths = torch.tensor([[1] * c + [0] * (bags - c) for c in counts]).flatten()
        offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
        rows = serving(torch.cat([wholes[n]["keys"] for n in DIMS]), offsets)
        want = torch.cat([wholes[n]["values"][:, :dim] for n, dim in DIMS.items()])
        assert torch.equal(rows, want), plan
        # load_from_model gathers the same rows (a column-wise table's slices joined).
        assert model_sizes == serving.sizes, plan
        assert torch.equal(model_rows, serving(*seen_keys())), plan
