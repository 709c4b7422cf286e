"""Our error types, one family per boundary, each mapped once to an HTTP status and a CLI exit code.

Callers catch `RecommenderError` at the edge (the CLI, the HTTP app) and show `str(error)`, which always says
what was wrong and where.
"""

from __future__ import annotations

from pathlib import Path


class RecommenderError(Exception):
    """Base of every error we raise on purpose; anything else is a bug."""

    http_status = 500
    exit_code = 1


class InputFileError(RecommenderError):
    """A usage file that cannot be read as tidy usage: names the file, the line (1-based, header = 1) and the problem."""

    http_status = 422
    exit_code = 2

    def __init__(self, path: Path | str, problem: str, line: int | None = None, column: str | None = None):
        self.path = str(path)
        self.problem = problem
        self.line = line
        self.column = column
        where = self.path
        if line is not None:
            where += f", line {line}"
        if column is not None:
            where += f", column '{column}'"
        super().__init__(f"{where}: {problem}")

    def __reduce__(self) -> tuple[type[InputFileError], tuple[str, str, int | None, str | None]]:
        """Pickled by its fields: a Dask task's error reaches the driver intact."""
        return type(self), (self.path, self.problem, self.line, self.column)


class ModelStoreError(RecommenderError):
    """The model store has no usable version, or one that is corrupt or partial."""

    http_status = 503
    exit_code = 3


class UnknownWorkloadError(RecommenderError):
    """A recommendation was asked for a workload the loaded version has not learned."""

    http_status = 404
    exit_code = 4


class UnknownNodeError(RecommenderError):
    """A node was asked for that the service's cluster view does not hold."""

    http_status = 404
    exit_code = 4


class ConfigurationError(RecommenderError):
    """Settings or command-line values that cannot work together."""

    http_status = 400
    exit_code = 2


class PrometheusError(RecommenderError):
    """Prometheus could not be reached, refused a query, or answered with something that is not PromQL data."""

    http_status = 502
    exit_code = 5


class PartialDataError(RecommenderError):
    """Some workloads could not be read; names them and why. Nothing was published."""

    http_status = 502
    exit_code = 6

    def __init__(self, skipped: dict[str, str]):
        self.skipped = skipped
        super().__init__(
            f"{len(skipped)} workload group(s) could not be read from Prometheus, nothing was published "
            f"(use --allow-partial to publish the rest): {_first_ten(skipped)}"
        )

    def __reduce__(self) -> tuple[type[PartialDataError], tuple[dict[str, str]]]:
        return type(self), (self.skipped,)


class KubernetesError(RecommenderError):
    """The Kubernetes API could not be reached or refused a request we needed."""

    http_status = 502
    exit_code = 7


class DistributedTrainingError(RecommenderError):
    """Partitions of a training run (on a Dask cluster or in this process) failed beyond the tolerated share; names
    them. Nothing was published: the store's `latest` is as it was."""

    http_status = 502
    exit_code = 8

    def __init__(self, failed: dict[str, str], partitions: int, tolerance: float):
        self.failed = failed
        self.partitions = partitions
        self.tolerance = tolerance
        super().__init__(
            f"{len(failed)} of {partitions} partition(s) failed after retries, more than the tolerated "
            f"{tolerance:.0%}; nothing was published: {_first_ten(failed)}"
        )

    def __reduce__(self) -> tuple[type[DistributedTrainingError], tuple[dict[str, str], int, float]]:
        return type(self), (self.failed, self.partitions, self.tolerance)


class TrainingMemoryError(RecommenderError):
    """A training run needed more memory than its process may have: names the fleet and what to do instead (train
    in partitions on workers, or give the process more memory). Nothing was published."""

    http_status = 507
    exit_code = 10

    def __init__(self, source: str, containers: int, partitions: int, detail: str):
        self.source = source
        self.containers = containers
        self.partitions = partitions
        self.detail = detail
        where = f"{containers:,} workload containers" + (f" in {partitions} partitions" if partitions > 1 else "")
        super().__init__(
            f"{source}: training {where} ran out of memory ({detail}); nothing was published. Train in partitions on "
            "worker processes (--workers 2 or more, or --dask-scheduler), or give the process more memory"
        )

    def __reduce__(self) -> tuple[type[TrainingMemoryError], tuple[str, int, int, str]]:
        return type(self), (self.source, self.containers, self.partitions, self.detail)


class ListenError(RecommenderError):
    """`serve` (or `demo`) cannot listen on its address: the port is taken, or not ours to bind. A code of its own:
    uvicorn exits 3 for it, which is the model store's."""

    http_status = 500
    exit_code = 9


class RequestTooLargeError(RecommenderError):
    """A request body above its route's limit (serve.*_max_body_bytes); reading stopped there."""

    http_status = 413
    exit_code = 2

    def __init__(self, limit: int, prefix: bytes = b""):
        self.limit = limit
        self.prefix = prefix
        super().__init__(f"request body larger than {limit} bytes")


class OverloadedError(RecommenderError):
    """Every worker thread is busy and the queue is full (serve.max_queued_work): try again shortly."""

    http_status = 503
    exit_code = 1


class RateLimitedError(RecommenderError):
    """Answering would take a TokenReview beyond its budget (auth.token_review_rate_per_second, _per_source, or
    _known_rate_per_second)."""

    http_status = 429
    exit_code = 1


class AccessDeniedError(RecommenderError):
    """A bearer token the API server authenticated, for a user auth.allowed_groups or the SubjectAccessReview on
    auth.authorization_path does not allow to read."""

    http_status = 403
    exit_code = 1

    def __init__(self, path: str | None):
        self.path = path
        needs = f"`get` on {path}, e.g. by the chart's reader ClusterRole" if path else "one of auth.allowed_groups"
        super().__init__(f"authenticated, but not allowed to read recommendations: the user needs {needs}")

    def __reduce__(self) -> tuple[type[AccessDeniedError], tuple[str | None]]:
        return type(self), (self.path,)


class ClientCertificateError(RecommenderError):
    """A webhook or extender call without a client certificate serve.client_ca_file signed (or with a name not allowed)."""

    http_status = 403
    exit_code = 1


def _first_ten(problems: dict[str, str]) -> str:
    """`name: why` of the first ten problems by name, and how many more there are."""
    listed = "; ".join(f"{name}: {why}" for name, why in sorted(problems.items())[:10])
    return listed + (f" (and {len(problems) - 10} more)" if len(problems) > 10 else "")


#: The optional extra (pyproject.toml) that brings each library only some roles install: the serving image has no
#: training, Dask or plotting libraries.
EXTRA_OF_MODULE = {
    "fastapi": "serve",
    "fastapi_offline": "serve",
    "uvicorn": "serve",
    "prometheus_client": "serve",
    "jsonpatch": "serve",
    "pandas": "train",
    "sklearn": "train",
    "scipy": "train",
    "pyarrow": "train",
    "tenacity": "train",
    "statsmodels": "stl",
    "dask": "dask",
    "distributed": "dask",
    "matplotlib": "charts",
}


class MissingExtraError(RecommenderError):
    """A command or route needs a library of an optional extra that this installation lacks; names both."""

    http_status = 501
    exit_code = 2

    def __init__(self, what: str, module: str, extra: str):
        self.what, self.module, self.extra = what, module, extra
        super().__init__(
            f"{what} needs {module}, which is not installed here: pip install 'koord-recommender[{extra}]'"
        )

    def __reduce__(self) -> tuple[type[MissingExtraError], tuple[str, str, str]]:
        return type(self), (self.what, self.module, self.extra)


def missing_extra(error: ModuleNotFoundError, what: str, extra: str | None = None) -> MissingExtraError | None:
    """The MissingExtraError for a failed import of an optional library (naming `extra` when `what` needs more than
    that library's extra), None for anything else (a bug)."""
    module = (error.name or "").split(".")[0]
    if module not in EXTRA_OF_MODULE:
        return None
    return MissingExtraError(what, module, extra or EXTRA_OF_MODULE[module])
