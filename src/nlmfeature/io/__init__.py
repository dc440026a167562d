"""The one text reader and the one atomic writer."""
