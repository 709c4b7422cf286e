"""Leader election on a coordination.k8s.io/v1 Lease, as client-go's leaderelection does it: the holder renews
`renewTime` every third of `leaseDurationSeconds`; another candidate takes the Lease only once it has gone that long
unrenewed; every write carries the resourceVersion it read, so two candidates never both win (the apiserver answers
409 to the second). The holder stops saying it leads as soon as a renewal is overdue, before anyone else may take
over, so two replicas never both write.

(The kubernetes package's own elector runs the protected work in a thread it owns and exits when leadership is
lost; the live loop instead asks `leading()` before each pass and each write.)"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from serving.kube import api_message

log = logging.getLogger(__name__)
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def own_namespace() -> str:
    """The pod's namespace (its service account says), else `default`."""
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or "default"
    except OSError:
        return "default"


def identity() -> str:
    """A candidate's name: the pod's (hostname) and a random suffix, so a restarted pod is a new candidate."""
    return f"{socket.gethostname()}_{os.getpid()}_{uuid.uuid4().hex[:6]}"


class LeaseElector:
    """Competes for one Lease in a background thread; `leading()` is True while this candidate holds it."""

    def __init__(
        self, api: client.ApiClient, name: str, namespace: str, duration_seconds: int, holder: str | None = None
    ) -> None:
        self.api = client.CoordinationV1Api(api)
        self.name = name
        self.namespace = namespace
        self.duration = duration_seconds
        self.holder = holder or identity()
        self._renewed_at: float | None = None  # monotonic time of our last successful write
        self._lock = threading.Lock()

    def leading(self) -> bool:
        """Whether we hold the Lease and renewed it within two thirds of its duration (client-go's renew deadline)."""
        with self._lock:
            return self._renewed_at is not None and time.monotonic() - self._renewed_at < self.duration * 2 / 3

    def try_acquire_or_renew(self) -> bool:
        """One attempt: create the Lease, renew ours, or take one left unrenewed for its duration. True if held."""
        now = datetime.now(UTC)
        started = time.monotonic()
        try:
            lease = self.api.read_namespaced_lease(self.name, self.namespace)
        except ApiException as error:
            if error.status != 404:
                log.warning("Lease %s/%s unreadable: %s", self.namespace, self.name, api_message(error))
                return False
            body = client.V1Lease(
                metadata=client.V1ObjectMeta(name=self.name, namespace=self.namespace),
                spec=self._spec(now, now, 0),
            )
            return self._write(lambda: self.api.create_namespaced_lease(self.namespace, body), started)
        spec = lease.spec or client.V1LeaseSpec()
        ours = spec.holder_identity == self.holder
        renewed = spec.renew_time or spec.acquire_time
        expired = renewed is None or now > renewed + timedelta(seconds=spec.lease_duration_seconds or self.duration)
        if not ours and spec.holder_identity and not expired:
            return False
        transitions = (spec.lease_transitions or 0) + (0 if ours else 1)
        lease.spec = self._spec(spec.acquire_time if ours and spec.acquire_time else now, now, transitions)
        if not ours:
            log.info("taking the Lease %s/%s from %s", self.namespace, self.name, spec.holder_identity or "nobody")
        return self._write(lambda: self.api.replace_namespaced_lease(self.name, self.namespace, lease), started)

    def _spec(self, acquired: datetime, renewed: datetime, transitions: int) -> client.V1LeaseSpec:
        return client.V1LeaseSpec(
            holder_identity=self.holder,
            lease_duration_seconds=self.duration,
            acquire_time=acquired,
            renew_time=renewed,
            lease_transitions=transitions,
        )

    def _write(self, call: Callable[[], object], started: float) -> bool:
        """Make one write; a failed one keeps the last renewal, so `leading()` turns False once that is overdue."""
        try:
            call()
        except ApiException as error:
            if error.status != 409:  # 409: another candidate wrote first, which is the election working
                log.warning("Lease %s/%s not written: %s", self.namespace, self.name, api_message(error))
            return False
        with self._lock:
            self._renewed_at = started
        return True

    def run(self, stop: threading.Event) -> None:
        """Try every third of the duration until `stop`, then give the Lease up so a successor need not wait."""
        while not stop.is_set():
            try:
                self.try_acquire_or_renew()
            except Exception as error:
                log.warning("Lease %s/%s: %s", self.namespace, self.name, error)
            stop.wait(self.duration / 3)
        self.release()

    def start(self, stop: threading.Event) -> threading.Thread:
        thread = threading.Thread(target=self.run, args=(stop,), name="lease", daemon=True)
        thread.start()
        return thread

    def release(self) -> None:
        """Give the Lease up if we hold it (its holder emptied), so another replica takes it at once."""
        if not self.leading():
            return
        with self._lock:
            self._renewed_at = None
        try:
            lease = self.api.read_namespaced_lease(self.name, self.namespace)
            if lease.spec and lease.spec.holder_identity == self.holder:
                lease.spec.holder_identity = None
                lease.spec.renew_time = None
                lease.spec.acquire_time = None
                self.api.replace_namespaced_lease(self.name, self.namespace, lease)
        except ApiException as error:
            log.info(
                "Lease %s/%s not released (it expires by itself): %s", self.namespace, self.name, api_message(error)
            )
