"""Writes and reads NVIDIA DynamicEmb checkpoint files by hand, from DYNAMICEMB_API.md §10
(not with dynemb's code): the oracle of the DynamicEmb-layout tests.

A table is given as ``{raw key: (row, state, score columns)}``; ``write_table`` splits
it over ``world_size`` rank files by DynamicEmb's routing (§6), storing local ids
under ``continuous``, and ``read_table`` inverts that.
"""

import json
from pathlib import Path

import numpy as np

M64 = 1 << 64


def owner(key: int, dist_type: str, world_size: int, num_embeddings: int) -> tuple[int, int]:
    """(rank, the id the rank stores) of a raw key under DynamicEmb's routing (k as uint64)."""
    k = key % M64
    if dist_type == "continuous":
        block = -(-num_embeddings // world_size)
        if k < block * world_size:
            return k // block, _signed(k % block)
        return k % world_size, _signed(k // world_size)
    if dist_type == "roundrobin":
        return k % world_size, key
    raise ValueError(dist_type)


def _signed(u: int) -> int:
    return u - M64 if u >= 1 << 63 else u


def write_table(directory: Path, table: str, rows: dict, world_size: int, opt_args: dict,
                num_embeddings: int = 0) -> None:  # fmt: skip
    """Writes the files of one table for ``world_size`` ranks, and its opt_args.json."""
    directory.mkdir(parents=True, exist_ok=True)
    dist_type = opt_args["dist_type"]
    per_rank = [[] for _ in range(world_size)]
    for key, entry in rows.items():
        rank, stored = owner(key, dist_type, world_size, num_embeddings)
        per_rank[rank].append((stored, *entry))
    for rank, entries in enumerate(per_rank):
        suffix = f".rank_{rank}.world_size_{world_size}"
        keys = np.array([e[0] for e in entries], dtype="<i8")
        keys.tofile(directory / f"{table}_emb_keys{suffix}")
        dim = len(next(iter(rows.values()))[0])
        np.array([e[1] for e in entries], dtype="<f4").reshape(-1, dim).tofile(
            directory / f"{table}_emb_values{suffix}"
        )
        np.array([e[2] for e in entries], dtype="<f4").tofile(
            directory / f"{table}_emb_opt_values{suffix}"
        )
        np.array([e[3] for e in entries], dtype="<i8").tofile(
            directory / f"{table}_emb_scores{suffix}"
        )
    (directory / f"{table}_opt_args.json").write_text(json.dumps(opt_args))


def read_table(directory: Path, table: str, dim: int, state: int, score_width: int,
               dist_type: str, num_embeddings: int = 0) -> dict:  # fmt: skip
    """``{raw key: (row, state, scores)}`` of every rank file of a table (lists of floats)."""
    out = {}
    files = sorted(directory.glob(f"{table}_emb_keys.rank_*"))
    for file in files:
        rank = int(file.name.split(".rank_")[1].split(".")[0])
        world = int(file.name.split("world_size_")[1])
        suffix = f".rank_{rank}.world_size_{world}"
        keys = np.fromfile(file, dtype="<i8")
        values = np.fromfile(directory / f"{table}_emb_values{suffix}", "<f4").reshape(-1, dim)
        scores = np.fromfile(directory / f"{table}_emb_scores{suffix}", "<i8")
        scores = scores.reshape(-1, score_width)
        opt = directory / f"{table}_emb_opt_values{suffix}"
        states = np.fromfile(opt, "<f4").reshape(-1, state) if state else None
        for i, stored in enumerate(keys.tolist()):
            key = stored
            if dist_type == "continuous":
                block = -(-num_embeddings // world)
                u = stored % M64
                key = _signed(rank * block + u if u < block else (u * world + rank) % M64)
            out[key] = (
                values[i].tolist(),
                states[i].tolist() if state else [],
                scores[i].tolist(),
            )
    return out
