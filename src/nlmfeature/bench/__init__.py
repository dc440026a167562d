"""Benchmarks that print figures (`nlmfeature bench ...`)."""
