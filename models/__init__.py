"""Estimators trained on usage. Pure math: they take arrays and frames, never clients; they import only the core."""
