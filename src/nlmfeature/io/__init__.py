"""The one text reader, the one atomic writer and the one size rule."""
