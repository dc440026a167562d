"""The one text reader, the one atomic writer, strict JSON output and the one size rule."""
