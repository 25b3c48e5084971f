"""The table-batched embedding (TBE) module: BatchedDynamicEmbeddingTables, its forward and
backward passes and its autograd function with the fused optimizer. TorchRec's compute
kernel over it is ``dynemb.shard.compute_kernel``."""
