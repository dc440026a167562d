"""What decoders load: the C API build, query logs, the persistent cache."""
