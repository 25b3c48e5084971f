"""apply_delta refuses what does not follow the serving state (a gap, a duplicate,
another base, a damaged delta) with an error naming it, and changes nothing then."""

import json

import pytest
import torch

from dynemb import BatchedDynamicEmbeddingTables
from dynemb.deltas import DeltaPublisher, DeltaVersionError, delta_path
from dynemb.deltas.format import write_delta
from dynemb.dump_files.format import CheckpointError
from dynemb.dump_files.manifest import checksum
from dynemb.inference.exportable_tables import InferenceEmbeddingCollection
from tests.support.delta_chains import OPTIONS, lookup, one_table_chain, serving_base

KEYS = torch.arange(-5, 40)


@pytest.fixture
def chain(tmp_path):
    """A base and deltas 1..3 of one table ``t``."""
    return one_table_chain(
        tmp_path / "chain", [(torch.arange(5 * v, 5 * v + 12), 5 * v) for v in range(3)]
    )


def test_a_gap_is_refused_naming_the_versions(chain):
    serving = serving_base(chain)
    before = lookup(serving, KEYS)
    with pytest.raises(
        DeltaVersionError, match=r"version 2 leaves a gap.*at version 0, version 1 is missing"
    ):
        serving.apply_delta(delta_path(chain.directory, 2))
    with pytest.raises(
        DeltaVersionError, match=r"version 3 leaves a gap.*versions 1\.\.2 are missing"
    ):
        serving.apply_delta(delta_path(chain.directory, 3))
    assert serving.delta_version == 0 and torch.equal(lookup(serving, KEYS), before)


def test_a_duplicate_is_refused_naming_the_versions(chain):
    serving = serving_base(chain)
    serving.apply_delta(delta_path(chain.directory, 1))
    serving.apply_delta(delta_path(chain.directory, 2))
    after = lookup(serving, KEYS)
    with pytest.raises(DeltaVersionError, match="version 1 is applied already.*at version 2"):
        serving.apply_delta(delta_path(chain.directory, 1))
    assert serving.delta_version == 2 and torch.equal(lookup(serving, KEYS), after)


def test_a_delta_of_another_base_is_refused(chain, tmp_path):
    other = DeltaPublisher(
        BatchedDynamicEmbeddingTables(OPTIONS, [0], table_names=["t"]), tmp_path / "other"
    )
    other.publish_base()
    serving = InferenceEmbeddingCollection(OPTIONS, table_names=["t"])
    serving.load_from_dynamicemb_file(other.base_path)
    with pytest.raises(DeltaVersionError, match="follows base checkpoint 'dump-"):
        serving.apply_delta(delta_path(chain.directory, 1))
    model_loaded = InferenceEmbeddingCollection(OPTIONS, table_names=["t"])
    with pytest.raises(DeltaVersionError, match="not loaded from a base checkpoint"):
        model_loaded.apply_delta(delta_path(chain.directory, 1))


@pytest.mark.parametrize("damage", ["values", "truncated", "manifest", "missing"])
def test_a_damaged_delta_raises_naming_the_file_and_changes_nothing(chain, damage):
    serving = serving_base(chain)
    serving.apply_delta(delta_path(chain.directory, 1))
    before = lookup(serving, KEYS)
    path = delta_path(chain.directory, 2)
    file = path / ("manifest.json" if damage == "manifest" else "t.values")
    if damage == "values":
        raw = bytearray(file.read_bytes())
        raw[5] ^= 0x40
        file.write_bytes(bytes(raw))
    elif damage == "truncated":
        file.write_bytes(file.read_bytes()[:-4])
    elif damage == "manifest":
        manifest = json.loads(file.read_text())
        manifest["tables"]["t"]["upserts"] += 1  # without fixing the checksum
        file.write_text(json.dumps(manifest))
    else:
        file.unlink()
    with pytest.raises(CheckpointError, match=str(file)):
        serving.apply_delta(path)
    assert serving.delta_version == 1 and torch.equal(lookup(serving, KEYS), before)


def test_a_hostile_manifest_with_a_recomputed_checksum_is_still_checked(chain):
    serving = serving_base(chain)
    path = delta_path(chain.directory, 1)
    file = path / "manifest.json"
    manifest = json.loads(file.read_text())
    manifest["tables"]["t"]["fields"]["keys"]["file"] = "../../etc/passwd"
    manifest["checksum"] = checksum(manifest)
    file.write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="plain file name"):
        serving.apply_delta(path)
    assert serving.delta_version == 0


def test_a_version_is_written_once(chain):
    with pytest.raises(FileExistsError, match="delta-00000002 exists already"):
        write_delta(chain.directory, 2, chain.base_dump_id, False, {})
