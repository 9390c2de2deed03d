"""What every other package shares: the progress callback type, byte counts, the names users
type, the ranks of a distributed run, device peak readings and the host allocator's setting."""
