"""What people read: the four-line charts (matplotlib), the overview `show` and the dashboard share (requests
against recommendations, per replica and times replicas, risks, totals) and `show`'s formats. It depends on the core
only, so the pipelines' reports, the service's routes and the CLI draw and count the same way."""
