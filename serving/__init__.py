"""The HTTP service: recommendations REST API (and, later, the admission webhook and scheduler extender)."""
