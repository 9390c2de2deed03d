"""What every other package shares: the progress callback type and byte counts."""
