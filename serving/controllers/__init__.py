"""Kubernetes controllers, each run as its own process (`recommender sync`, `recommender cluster-files`): they read
the loaded model version (`serving.state`) and write into the cluster or for the extender. The HTTP app
(`serving.app`, `serving.routes`) knows nothing of them, and they nothing of it (import-linter contracts)."""
