"""Table state: buffers, placement, growth, the ScoredHashTable and the Table protocol."""
