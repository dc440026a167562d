"""Model files, vocabularies, models and the native scorer's Python wrappers."""
