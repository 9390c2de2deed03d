"""llmc-trace: make large models traceable for memory-efficient compression."""
