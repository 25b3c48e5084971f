"""What dynemb's multi-process operations share: agreement among the ranks of a
collective operation with a bounded wait on a dead rank (``rank_faults``), the few
collectives of checkpoints, incremental dumps, deltas and inference modules
(``collectives``), and how TorchRec names dynemb's compute kernel and sharding types
(``sharding_names``)."""
