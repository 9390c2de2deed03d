"""What every other package shares: the progress callback type, byte counts, the names users
type, the ranks of a distributed run, the declared options and the solvers' settings, device peak readings, the host allocator's setting, package attributes loaded
when used and model-folder JSON read with a located error."""
