"""What tests share: oracles, rank workers, models and their helpers (no tests)."""
