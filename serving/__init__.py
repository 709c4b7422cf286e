"""The HTTP service every consumer calls (REST API, dashboard, admission webhook, scheduler extender, metrics) and,
beside it, the controllers that write what we learned into the cluster (status and node writers, the cluster view)."""
