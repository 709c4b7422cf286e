"""The training path's cluster executor: each phase of `pipelines.train` as one Dask task per partition, whose
state waits on the model store (which the workers share) between the phases.

A task that fails is retried (`scale.retries`); a worker that dies mid-task has its tasks rerun elsewhere (up to
Dask's `distributed.scheduler.allowed-failures`). Results are fetched as they come and released at once (a result
left on a worker that later dies would be recomputed for nothing); past `scale.timeout_seconds` from the
executor's start the unfinished tasks fail. What a failure means for the version is the training path's
(`pipelines.train`: the failure tolerance).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import dask.config
from distributed import Client, Future, LocalCluster

from pipelines.settings import ScaleSettings
from pipelines.train import peak_rss_mib
from recommender.errors import ConfigurationError
from recommender.progress import Step

#: Dask settings of the workers we start. Their statistical profiler calls `sys._current_frames()` every 10 ms, which
#: on CPython before 3.11.9 can deadlock the worker's process (CPython gh-106883: a garbage collection inside the
#: call frees a `threading.local` that takes the lock the call holds); a worker hung so mid-read stalled the run.
#: Workers of a cluster of your own (`scale.scheduler_address`) need the same: docs/kubernetes.md.
WORKER_CONFIG = {"distributed.worker.profile.enabled": False}


@contextmanager
def local_cluster(**options: Any) -> Iterator[LocalCluster]:
    """A `distributed.LocalCluster` with `options` whose workers run with `WORKER_CONFIG` (a nanny hands the
    configuration it was made under to its worker's process)."""
    with dask.config.set(WORKER_CONFIG), LocalCluster(**options) as cluster:
        yield cluster


@contextmanager
def dask_client(scale: ScaleSettings) -> Iterator[Client]:
    """A client of the scheduler at `scale.scheduler_address`, or of a local cluster of `scale.workers` processes
    on loopback (closed on exit)."""
    if scale.scheduler_address:
        with Client(scale.scheduler_address, timeout="30s") as client:
            yield client
        return
    if scale.workers < 1:
        raise ConfigurationError("distributed training needs a scheduler address or at least one local worker")
    with (
        local_cluster(
            n_workers=scale.workers,
            threads_per_worker=scale.threads_per_worker,
            processes=True,
            host="127.0.0.1",
            dashboard_address="127.0.0.1:0",
        ) as cluster,
        Client(cluster) as client,
    ):
        yield client


def _identity(value: Any) -> Any:
    return value


class DaskExecutor:
    """Runs the training phases on the cluster behind `client` (see the module's docstring)."""

    in_memory = False

    def __init__(self, client: Client, scale: ScaleSettings | None = None) -> None:
        self.client = client
        self.scale = scale or ScaleSettings()
        self.deadline = time.monotonic() + self.scale.timeout_seconds
        self.run_id = secrets.token_hex(4)

    def map(
        self,
        phase: str,
        function: Callable[..., Any],
        calls: dict[int, tuple[Any, ...]],
        keep: Callable[[Any], Any],
        step: Step,
    ) -> tuple[dict[int, Any], dict[int, BaseException]]:
        futures: dict[int, Future[Any]] = {
            index: self.client.submit(
                function, *args, retries=self.scale.retries, pure=False, key=f"{phase}-{self.run_id}-{index}"
            )
            for index, args in calls.items()
        }
        done: dict[int, Any] = {}
        failed: dict[int, BaseException] = {}
        for count, (index, future) in enumerate(futures.items(), 1):
            try:
                done[index] = keep(future.result(timeout=max(self.deadline - time.monotonic(), 0.001)))
                future.release()
            except TimeoutError:
                failed[index] = TimeoutError("not finished within the run's timeout (scale.timeout_seconds)")
                future.cancel()
            except Exception as error:
                failed[index] = error
            if len(futures) > 1:
                step(f"{phase}: {count} of {len(futures)} partitions")
        return done, failed

    def share(self, value: Any) -> Any:
        """A task that gives `value`: unlike scattered data, which is lost with the workers holding it, the task's
        input stays with the scheduler, so a value lost with a dying worker is made again."""
        return self.client.submit(_identity, value, pure=False, key=f"share-{self.run_id}-{secrets.token_hex(4)}")

    def workers(self) -> int:
        return len(self.client.scheduler_info()["workers"])

    def peak_memory_mib(self) -> dict[str, float]:
        peaks: dict[str, float] = self.client.run(peak_rss_mib)
        return peaks
