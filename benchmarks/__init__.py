"""pytest-benchmark suites and the models they time (see README.md here)."""
