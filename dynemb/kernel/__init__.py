"""The compute kernel: BatchedDynamicEmbeddingTables and its autograd function."""
