"""Tools the tests and benchmarks share: turning tidy usage into a real Prometheus to read from."""
