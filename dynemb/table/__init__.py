"""Table state: buffers, growth, the ScoredHashTable."""
