"""List-then-watch caches of Kubernetes objects, the one way our processes read the cluster: the webhook's opt-in
sources (namespaces, VerticalPodAutoscalers, HorizontalPodAutoscalers), the extender sidecar's pods and nodes, and the
objects `recommender sync` writes (VPAs, Koordinator Recommendations; nodes and pods for the node writer).

An `Informer` lists its kind once, then watches from the list's resourceVersion (with bookmarks, so the version stays
fresh on a quiet kind), applying ADDED / MODIFIED / DELETED to its map. A 410 Gone (the version fell out of etcd's
window) re-lists at once; the resync period re-lists too; any other failure backs off, doubling with jitter up to
a bound, then re-lists. Objects are kept as the API's JSON (camelCase dicts). `lists` counts the list calls.
The client is blocking, so each informer runs in a thread of its own; readers take a snapshot of the map.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import orjson
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from recommender.errors import KubernetesError
from serving.kube import api_message
from serving.settings import WebhookSettings

log = logging.getLogger(__name__)
Key = tuple[str, str]
#: A watch is re-opened at least this often, seconds, so a stop request is seen and a silent connection is replaced.
WATCH_SECONDS = 60


def _key(obj: Mapping[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


class Informer:
    """One kind's objects, kept current by list + watch in `run` until its stop event is set."""

    def __init__(
        self,
        name: str,
        list_call: Callable[..., Any],
        *args: Any,
        resync_seconds: float,
        backoff_max_seconds: float,
        on_change: Callable[[], None] = lambda: None,
        on_event: Callable[[str, dict[str, Any]], None] = lambda kind, obj: None,
        missing_ok: bool = False,
        **kwargs: Any,
    ) -> None:
        """`list_call(*args, **kwargs)` lists the kind (a kubernetes client method); `on_change` is called after
        every list and event, `on_event(type, object)` after each ADDED, MODIFIED or DELETED the watch applied;
        `missing_ok`: a 404 (the CRD is not installed) counts as synced and empty instead of an error, and is asked
        again after the longest backoff (a CRD installed after us is seen within that)."""
        self.name = name
        self._call, self._args, self._kwargs = list_call, args, kwargs
        self.resync_seconds = resync_seconds
        self.backoff_max_seconds = backoff_max_seconds
        self.on_change = on_change
        self.on_event = on_event
        self.missing_ok = missing_ok
        self.items: dict[Key, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self.synced = threading.Event()
        self.lists = 0
        self.resource_version: str | None = None
        self.problem: str | None = "not listed yet"
        self._watch: watch.Watch | None = None
        self._interrupted = False

    def values(self, namespace: str | None = None) -> list[dict[str, Any]]:
        """The objects now held (of one namespace when given)."""
        with self._lock:
            return [obj for (ns, _), obj in self.items.items() if namespace is None or ns == namespace]

    def __len__(self) -> int:
        return len(self.items)

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            return self.items.get((namespace, name))

    def list_now(self) -> None:
        """List once outside `run` (a one-shot pass): a kind that is not installed counts as empty when `missing_ok`;
        any other failure is a KubernetesError naming the kind."""
        try:
            self.list_once()
        except ApiException as error:
            if error.status == 404 and self.missing_ok:
                log.warning("%s: not installed in this cluster; taken as none", self.name)
                self._missing()
                return
            raise KubernetesError(f"listing {self.name}: HTTP {error.status}: {api_message(error)}") from None

    def _missing(self) -> None:
        with self._lock:
            self.items = {}
        self.problem = None
        self.synced.set()

    def list_once(self) -> None:
        """Replace the map with a fresh list and remember its resourceVersion."""
        self.lists += 1
        response = self._call(*self._args, _preload_content=False, **self._kwargs)
        document = orjson.loads(response.data)
        items = {_key(obj): obj for obj in document.get("items") or []}
        with self._lock:
            self.items = items
        self.resource_version = str((document.get("metadata") or {}).get("resourceVersion") or "") or None
        self.problem = None
        self.synced.set()
        log.info("%s: listed %d", self.name, len(self.items))
        self.on_change()

    def watch_once(self, stop: threading.Event, seconds: float) -> None:
        """Apply watch events from the current resourceVersion for up to `seconds`."""
        self._watch = watch.Watch(return_type="object")
        stream = self._watch.stream(
            self._call,
            *self._args,
            resource_version=self.resource_version,
            timeout_seconds=max(1, int(seconds)),
            allow_watch_bookmarks=True,
            **self._kwargs,
        )
        for event in stream:
            if stop.is_set():
                self._watch.stop()
                return
            obj = event["raw_object"]
            version = (obj.get("metadata") or {}).get("resourceVersion")
            with self._lock:
                if event["type"] == "DELETED":
                    self.items.pop(_key(obj), None)
                elif event["type"] in ("ADDED", "MODIFIED"):
                    self.items[_key(obj)] = obj
            if version:
                self.resource_version = str(version)
            if event["type"] != "BOOKMARK":
                self.on_event(event["type"], obj)
                self.on_change()

    def interrupt(self) -> None:
        """End the watch in progress: the run loop then stops (when its stop event is set) or opens a new watch from
        the resourceVersion it holds, without a re-list."""
        self._interrupted = True
        if self._watch is not None:
            self._watch.stop()

    def run(self, stop: threading.Event) -> None:
        """List, then watch, re-listing every `resync_seconds`, on 410 Gone and after failures, until `stop`."""
        failures = 0
        listed_at = -float("inf")
        while not stop.is_set():
            try:
                if self.resource_version is None or time.monotonic() - listed_at >= self.resync_seconds:
                    self.list_once()
                    listed_at = time.monotonic()
                remaining = self.resync_seconds - (time.monotonic() - listed_at)
                self.watch_once(stop, min(remaining, WATCH_SECONDS))
                failures, self._interrupted = 0, False
                continue
            except ApiException as error:
                if error.status == 410:
                    log.info("%s: resourceVersion %s is gone; re-listing", self.name, self.resource_version)
                    self.resource_version = None
                    continue
                if error.status == 404 and self.missing_ok:
                    self._missing()
                    log.warning(
                        "%s: not installed in this cluster; taken as none, asked again in %.0f s",
                        self.name,
                        self.backoff_max_seconds,
                    )
                    stop.wait(self.backoff_max_seconds)
                    continue
                self.problem = f"HTTP {error.status}: {api_message(error)}"
            except (HTTPError, OSError, ValueError) as error:
                if stop.is_set():
                    return  # our own stop cut the watch's connection
                if self._interrupted:
                    self._interrupted = False
                    continue
                self.problem = f"{type(error).__name__}: {error}"
            failures += 1
            self.resource_version = None
            delay = min(self.backoff_max_seconds, 2.0**failures) * random.uniform(0.5, 1.0)
            log.warning("%s: list or watch failed (%s); retrying in %.1f s", self.name, self.problem, delay)
            stop.wait(delay)


class Informers:
    """Informers run in daemon threads, started together and stopped together."""

    def __init__(self, informers: list[Informer]) -> None:
        self.informers = informers
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for informer in self.informers:
            thread = threading.Thread(
                target=informer.run, args=(self._stop,), name=f"watch-{informer.name}", daemon=True
            )
            thread.start()
            self._threads.append(thread)

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        for informer in self.informers:
            informer.interrupt()
        for thread in self._threads:
            thread.join(timeout)

    def problem(self) -> str | None:
        """Why the caches cannot be trusted yet (the first informer not synced), or None."""
        for informer in self.informers:
            if not informer.synced.is_set():
                return f"{informer.name} not synced yet ({informer.problem})"
        return None


class OptInSources(Informers):
    """What the webhook's opt-in reads from the cluster: namespace labels, VPAs and HPAs by namespace."""

    def __init__(self, api: client.ApiClient, settings: WebhookSettings) -> None:
        resync, backoff = settings.resync_seconds, settings.backoff_max_seconds
        custom = client.CustomObjectsApi(api)
        self.namespaces = Informer(
            "namespaces", client.CoreV1Api(api).list_namespace, resync_seconds=resync, backoff_max_seconds=backoff
        )
        self.vpas = Informer(
            "verticalpodautoscalers",
            custom.list_cluster_custom_object,
            "autoscaling.k8s.io",
            "v1",
            "verticalpodautoscalers",
            resync_seconds=resync,
            backoff_max_seconds=backoff,
            missing_ok=True,
        )
        self.hpas = Informer(
            "horizontalpodautoscalers",
            client.AutoscalingV2Api(api).list_horizontal_pod_autoscaler_for_all_namespaces,
            resync_seconds=resync,
            backoff_max_seconds=backoff,
        )
        super().__init__([self.namespaces, self.vpas, self.hpas])

    def namespace_labels(self, namespace: str) -> dict[str, str]:
        found = self.namespaces.get("", namespace) or {}
        return dict((found.get("metadata") or {}).get("labels") or {})
