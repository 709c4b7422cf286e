"""The Kubernetes API client both processes use: the service's watch caches (`kube_watch.py`) and the controllers
(`controllers/`), so neither imports the other for it."""

from __future__ import annotations

import json
from pathlib import Path

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from recommender.errors import KubernetesError


def api_client(kubeconfig: Path | None) -> client.ApiClient:
    """An API client from `kubeconfig`, else in-cluster credentials, else the default kubeconfig."""
    try:
        if kubeconfig is not None:
            api: client.ApiClient = config.new_client_from_config(config_file=str(kubeconfig))
            return api
        try:
            config.load_incluster_config()
            return client.ApiClient()
        except config.ConfigException:
            default: client.ApiClient = config.new_client_from_config()
            return default
    except (config.ConfigException, OSError) as error:
        raise KubernetesError(f"no Kubernetes credentials: {error}") from None


def api_message(error: ApiException) -> str:
    """The apiserver's own explanation (its Status message), else the HTTP reason."""
    try:
        message = json.loads(error.body or "{}").get("message")
    except (TypeError, ValueError):
        message = None
    return str(message or error.reason)
