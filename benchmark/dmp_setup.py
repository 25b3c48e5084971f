"""Process groups and sharding-planner inputs shared by the DMP benchmarks.

``single_process_group`` opens a world of one process on localhost (gloo; NCCL on
cuda), for benchmarks that run DMP in this process; multi-process benchmarks give
each rank a ``free_port`` to meet on. ``planner_inputs`` is the topology and storage
reservation every planner gets, TorchRec's and dynemb's alike.
"""

import socket
from collections.abc import Iterator
from contextlib import contextmanager


def free_port() -> int:
    """A TCP port free on localhost right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def single_process_group(device: str = "cpu") -> Iterator[None]:
    """A process group of world size 1 on localhost, gloo (NCCL on cuda); reused if one exists."""
    import torch.distributed as dist

    created = not dist.is_initialized()
    if created:
        dist.init_process_group(
            "nccl" if device == "cuda" else "gloo",
            init_method=f"tcp://127.0.0.1:{free_port()}",
            rank=0,
            world_size=1,
        )
    try:
        yield
    finally:
        if created:
            dist.destroy_process_group()


def planner_inputs(world_size: int, device: str) -> dict:
    """``topology`` and ``storage_reservation`` for a TorchRec (or dynemb) planner.

    Built the way TorchRec asks, so that planning prints no warning: the topology
    through ``TopologyFactory`` (default HBM / DDR capacities), and a fixed share of
    memory (15%) kept for dense tensors, since the modules are on the meta device and
    TorchRec's default reservation would size them from unmaterialised parameters.
    """
    from torchrec.distributed.planner.storage_reservations import (
        FixedPercentageStorageReservation,
    )
    from torchrec.distributed.planner.types import KernelConfig, TopologyFactory, TrainerConfig

    topology = TopologyFactory.create_topology(
        trainer_config=TrainerConfig(world_size=world_size, local_world_size=world_size),
        kernel_config=KernelConfig(compute_device=device),
    )
    return {
        "topology": topology,
        "storage_reservation": FixedPercentageStorageReservation(percentage=0.15),
    }
