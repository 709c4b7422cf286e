"""The model store: versioned, atomically published training results that training writes and serving reads.

Layout under the store root (a local directory, a mounted shared volume, or any fsspec URL such as s3://bucket/path
or memory://name; object stores need their fsspec package, e.g. s3fs):
    versions/<version>/manifest.json        what was trained on, with what, and checksums of the files below
    versions/<version>/recommendations.json the RecommendationSet at the end of the training window
    versions/<version>/model.joblib         the fitted WorkloadRecommender (for incremental training), or
    versions/<version>/models/part-*.joblib one per partition when the version was fitted in several partitions
    versions/<version>/nodes.joblib         the fitted NodeForecaster, when the usage said where pods ran
    latest                                  the name of the newest published version
    live/latest                             the newest light update of the live loop (`LiveUpdate`, small JSON)
    live/<version>-<sequence>.json.gz       its recommendations: the version's, re-issued from newer samples
    live/checkpoint.joblib                  the live loop's state, for a restart or a failover to resume from
    .publish.lock, .publishing               (local) the lock every publish and cleanup holds; the version being published
    versions/.incoming-<version>.lock       (local) held by the run writing that version for as long as it runs
The `.joblib` files are in `MODEL_COMPRESSION` (LZ4); zlib ones written before load as they did.

A version is written under `versions/.incoming-*` (workers of a distributed run write their partitions' files
there too), and moved into place only when complete; only then does `latest` move. On a local or mounted file
system each file is written to a temporary name, flushed and renamed, and the directory rename is atomic; on an
object store a single object PUT is atomic and the move is a copy, so readers rely on the order instead: a version
is complete before `latest` names it, and every file is checked against the manifest's checksums on load. A crash
at any point leaves the previous version as it was. It lives in `models/` because both the training pipeline
(writer) and the service (reader) use it.

Leftovers of a killed or failed run are removed when the next run begins (docs/input-validation.md): on a local or
mounted file system each writer holds an exclusive lock (flock) on its incoming version's lock file, which the
kernel releases when the writer dies however it dies, so an incoming version whose lock can be taken is a dead
run's and goes, and a running writer's is never touched. The move into place and the `latest` write happen under
the store's publish lock with the version's name in `.publishing`: a version still named there when the next run
takes the lock was complete but never published, and is removed, as are `latest`'s temporary files. On an object
store, which has no locks, unfinished versions older than STALE_INCOMING_SECONDS are removed instead.
"""

from __future__ import annotations

import fcntl
import gzip
import hashlib
import io
import logging
import os
import posixpath
import secrets
import socket
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, TypeVar

import fsspec
import joblib
import orjson
from fsspec.implementations.local import LocalFileSystem
from isal import isal_zlib
from pydantic import BaseModel, Field, ValidationError

from recommender import __version__
from recommender.atomic import atomic_write_bytes, fsync_directory
from recommender.errors import ModelStoreError
from recommender.resources import RecommendationSet, WorkloadRecommendation, recommendation_set_chunks

if TYPE_CHECKING:  # the estimators (scikit-learn, pandas) are imported only where a model file is read: serving never
    from models.nodes import NodeForecaster  # does, and its image leaves them out
    from models.workload import WorkloadRecommender

SCHEMA_VERSION = 1
MANIFEST = "manifest.json"
RECOMMENDATIONS = "recommendations.json"
MODEL = "model.joblib"
NODE_MODEL = "nodes.joblib"
PARTITION_MODELS = "models"
#: Scratch files of a distributed run inside its incoming version (partition inputs, intermediate models), removed
#: at the commit.
WORK = "work"
INCOMING_PREFIX = ".incoming-"
LOCK_SUFFIX = ".lock"
PUBLISH_LOCK = ".publish.lock"
PUBLISHING = ".publishing"
#: On an object store (no locks), an unfinished publish older than this is a crashed run's leftover and is removed.
STALE_INCOMING_SECONDS = 3600
LIVE = "live"
LIVE_POINTER = "latest"
LIVE_CHECKPOINT = "checkpoint.joblib"
LIVE_SCHEMA_VERSION = 1
#: joblib's codec for every model file (versions' models, partition models, the node model, the live checkpoint).
#: LZ4 at level 1: measured on the 4 partition models and the node model of a 1,000-container fit (issue 17), 45 MB
#: in 0.43 CPU s against zlib level 3's 29 MB in 1.86 s (uncompressed: 129 MB in 0.21 s, but 4.5x the bytes to write
#: and sync). `joblib.load` tells the codec by the file's first bytes, so zlib files written before still load.
MODEL_COMPRESSION = ("lz4", 1)

log = logging.getLogger(__name__)


def partition_model(index: int) -> str:
    """The file of partition `index`'s model in a version fitted in several partitions."""
    return f"{PARTITION_MODELS}/part-{index:05d}.joblib"


class FileEntry(BaseModel):
    sha256: str
    bytes: int


class DataWindow(BaseModel):
    first_sample: int = Field(description="Oldest sample used, Unix seconds.")
    last_sample: int = Field(description="Newest sample used, Unix seconds.")
    as_of: int = Field(description="Decision time of the stored recommendations, Unix seconds.")


class Manifest(BaseModel):
    """Everything needed to trust, reproduce and compare a version."""

    schema_version: int
    version: str
    created_at: str
    package_version: str
    source: str = Field(description="Where the usage came from (file path or Prometheus URL).")
    data_window: DataWindow
    parameters: dict[str, Any] = Field(description="The settings the models were fitted with.")
    row_counts: dict[str, int]
    fit_metrics: dict[str, float]
    parent_version: str | None = Field(None, description="Version this one continued from (incremental training).")
    read_metrics: dict[str, float] = Field(
        default_factory=dict, description="Cost of reading the data (queries, bytes)."
    )
    skipped: dict[str, str] = Field(
        default_factory=dict, description="Workload groups that could not be read, and why."
    )
    quarantined: dict[str, str] = Field(
        default_factory=dict,
        description="Workload containers left out because a sample broke the physical bounds, and why.",
    )
    partition_starts: list[tuple[str, str]] = Field(
        default_factory=list,
        description="The training plan: each partition's first (namespace, workload) in label order, when the "
        "version was fitted in several (its models are then models/part-*.joblib, one per partition); incremental "
        "training continues each partition's model.",
    )
    files: dict[str, FileEntry]


class LiveUpdate(BaseModel):
    """One light update of the live loop: which version it continues, its place in the sequence and its age. The
    pointer `live/latest` holds it (small, read every poll); its recommendations are in `file`."""

    schema_version: int = LIVE_SCHEMA_VERSION
    version: str = Field(description="The model version whose models the loop continued.")
    sequence: int = Field(ge=1, description="Number of this update; grows by one per publish.")
    written_at: float = Field(description="When it was published, Unix seconds.")
    as_of: int = Field(description="Decision time of its recommendations, Unix seconds.")
    last_sample: int = Field(description="Newest sample read, Unix seconds (the end of its last Prometheus read).")
    file: str = Field(description="Name of its recommendations file under live/.")
    entry: FileEntry = Field(description="Checksum and size of that file.")
    read_metrics: dict[str, float] = Field(default_factory=dict, description="Cost of the read behind it.")
    writer: str = Field("", description="Which loop replica wrote it (its Lease identity).")

    @property
    def revision(self) -> str:
        """The version and the update, e.g. `20261201T170000000000Z-1a2b3c+live.42` (an ETag, a cache key)."""
        return f"{self.version}+live.{self.sequence}"


_Schema = TypeVar("_Schema", Manifest, LiveUpdate)


@dataclass(frozen=True)
class LoadedVersion:
    manifest: Manifest
    recommendations: RecommendationSet
    path: str


class StoreFiles:
    """File operations on one fsspec file system, atomic per file where the file system allows it."""

    def __init__(self, url: str | Path) -> None:
        self.fs, self.root = fsspec.core.url_to_fs(str(url))
        self.local = isinstance(self.fs, LocalFileSystem)

    def url(self, path: str) -> str:
        """The URL of a path on this file system, for another process (a Dask worker) to open."""
        return path if self.local else str(self.fs.unstrip_protocol(path))

    def put(self, path: str, data: bytes, create_parents: bool = True) -> FileEntry:
        """Write a whole file (temporary name, fsync and rename locally; one PUT on an object store). Without
        `create_parents` a missing directory fails the write: a late task of an aborted run cannot recreate it."""
        if self.local:
            if not create_parents and not Path(path).parent.is_dir():
                raise FileNotFoundError(f"{Path(path).parent}: gone (the run was aborted)")
            atomic_write_bytes(Path(path), data)
        else:
            self.fs.pipe_file(path, data)
        return FileEntry(sha256=hashlib.sha256(data).hexdigest(), bytes=len(data))

    def put_chunks(self, path: str, chunks: Iterable[bytes]) -> FileEntry:
        """Write a file from chunks without holding it whole (checksummed on the way), then as `put` does."""
        digest, size = hashlib.sha256(), 0
        temporary = path + f".{secrets.token_hex(4)}.tmp"
        with self.fs.open(temporary, "wb") as handle:
            for chunk in chunks:
                handle.write(chunk)
                digest.update(chunk)
                size += len(chunk)
            if self.local:
                handle.flush()
                os.fsync(handle.fileno())
        self.fs.mv(temporary, path)
        return FileEntry(sha256=digest.hexdigest(), bytes=size)

    def put_model(
        self, path: str, model: Any, compress: int | tuple[str, int] = MODEL_COMPRESSION, create_parents: bool = True
    ) -> FileEntry:
        buffer = io.BytesIO()
        joblib.dump(model, buffer, compress=compress)
        return self.put(path, buffer.getvalue(), create_parents)

    def read(self, path: str) -> bytes:
        data: bytes = self.fs.cat_file(path)
        return data

    def remove(self, path: str) -> None:
        with suppress(FileNotFoundError):
            self.fs.rm(path, recursive=True)

    def sync_directory(self, path: str) -> None:
        if self.local:
            fsync_directory(Path(path))


def _try_lock(path: str) -> int | None:
    """An open descriptor holding an exclusive flock on the existing file `path`, or None when a live process holds
    it (or the file is gone: its writer finished)."""
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _new_lock(path: str) -> int | None:
    """A new lock file at `path`, created and held, naming its holder for people; None in the rare case a cleaner
    removed it between its creation and our lock (the caller then picks another name)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    if os.fstat(fd).st_nlink == 0:
        os.close(fd)
        return None
    os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode())
    return fd


class IncomingVersion:
    """A version being written: files go under `versions/.incoming-<name>/`, `ModelStore.commit` publishes it. On a
    local file system the writer holds `versions/.incoming-<name>.lock` until the version is committed or aborted."""

    def __init__(self, files: StoreFiles, versions_dir: str, name: str, lock: int | None = None) -> None:
        self.files = files
        self.name = name
        self.path = posixpath.join(versions_dir, INCOMING_PREFIX + name)
        self.entries: dict[str, FileEntry] = {}
        self.lock = lock

    def release(self) -> None:
        """Give up the writer's lock (after the version is published or removed)."""
        if self.lock is not None:
            Path(self.path + LOCK_SUFFIX).unlink(missing_ok=True)
            os.close(self.lock)
            self.lock = None

    def path_of(self, filename: str) -> str:
        return posixpath.join(self.path, filename)

    def url_of(self, filename: str) -> str:
        return self.files.url(self.path_of(filename))

    def put(self, filename: str, data: bytes) -> None:
        self.entries[filename] = self.files.put(self.path_of(filename), data)

    def put_chunks(self, filename: str, chunks: Iterable[bytes]) -> None:
        self.entries[filename] = self.files.put_chunks(self.path_of(filename), chunks)

    def put_model(self, filename: str, model: Any) -> None:
        self.entries[filename] = self.files.put_model(self.path_of(filename), model)


@dataclass(frozen=True)
class PartitionFiles:
    """Where one partition's task reads and writes inside a version being written: URLs, so a worker on another
    machine reaches them. Tasks use these methods; the layout stays the store's."""

    input: str
    fitted: str
    recommendations: str
    model: str

    def open_input(self, mode: str) -> IO[bytes]:
        """The partition's input rows (written by the driver, read by the fit task)."""
        files = StoreFiles(self.input)
        handle: IO[bytes] = files.fs.open(files.root, mode)
        return handle

    def write_fitted(self, model: Any) -> None:
        """The model between the two phases (uncompressed: it is read back once, soon)."""
        files = StoreFiles(self.fitted)
        files.put_model(files.root, model, compress=0, create_parents=False)

    def take_fitted(self) -> Any:
        """The model between the phases, removed from the store as it is read."""
        files = StoreFiles(self.fitted)
        model = joblib.load(io.BytesIO(files.read(files.root)))
        files.remove(files.root)
        return model

    def write_results(self, fragment: bytes, model: Any) -> tuple[FileEntry, FileEntry]:
        """The partition's recommendations (a fragment of the version's JSON) and its final model, with their
        checksums for the driver to check at the commit."""
        out, final = StoreFiles(self.recommendations), StoreFiles(self.model)
        return out.put(out.root, fragment, create_parents=False), final.put_model(
            final.root, model, create_parents=False
        )


class VersionWriter:
    """The one way to write a model version (`with store.writer() as w: ...; w.commit(...)`): files go in through
    these methods, `commit` publishes; leaving the block without a commit, or with an error, removes what was written
    and leaves `latest` as it was."""

    def __init__(self, store: ModelStore, incoming: IncomingVersion) -> None:
        self._store = store
        self._incoming = incoming
        self._partitioned = False
        self.done = False

    @property
    def name(self) -> str:
        return self._incoming.name

    def _open(self) -> IncomingVersion:
        if self.done:
            raise ModelStoreError(f"version {self.name} is already committed or abandoned: nothing more can be written")
        return self._incoming

    def write_recommendations(self, recommendations: RecommendationSet) -> None:
        """The version's recommendations, written one recommendation at a time (10,000 containers' JSON is 100 MB,
        and twice that as one str and bytes)."""
        self._open().put_chunks(RECOMMENDATIONS, _set_chunks(recommendations))

    def write_model(self, model: WorkloadRecommender) -> None:
        self._open().put_model(MODEL, model)

    def write_partition_model(self, index: int, model: WorkloadRecommender) -> None:
        """Partition `index`'s fitted model, written by the driver (a task writes its own with `write_results`)."""
        self._open().put_model(partition_model(index), model)

    def write_node_model(self, model: NodeForecaster) -> None:
        self._open().put_model(NODE_MODEL, model)

    def partition(self, index: int) -> PartitionFiles:
        """The files of partition `index` of a distributed run (its scratch files are removed at the commit)."""
        incoming = self._open()
        if not self._partitioned:
            for directory in (WORK, PARTITION_MODELS):
                incoming.files.fs.makedirs(incoming.path_of(directory), exist_ok=True)
            self._partitioned = True
        stem = f"part-{index:05d}"
        return PartitionFiles(
            input=incoming.url_of(f"{WORK}/{stem}.parquet"),
            fitted=incoming.url_of(f"{WORK}/{stem}.joblib"),
            recommendations=incoming.url_of(f"{WORK}/{stem}.json"),
            model=incoming.url_of(f"{PARTITION_MODELS}/{stem}.joblib"),
        )

    def collect_partitions(self, header: RecommendationSet, written: Mapping[int, tuple[FileEntry, FileEntry]]) -> None:
        """The partitions' recommendations, in index order, streamed into the version's one file under `header`'s
        fields, and their models recorded; each file is checked against what its task reported writing."""
        incoming = self._open()

        def fragments() -> Iterator[bytes]:
            for index in sorted(written):
                data = incoming.files.read(incoming.path_of(f"{WORK}/part-{index:05d}.json"))
                if FileEntry(sha256=hashlib.sha256(data).hexdigest(), bytes=len(data)) != written[index][0]:
                    raise ModelStoreError(f"{self.partition(index).recommendations}: changed after its task wrote it")
                yield data

        incoming.put_chunks(RECOMMENDATIONS, recommendation_set_chunks(header, fragments()))
        for index in sorted(written):
            incoming.entries[partition_model(index)] = written[index][1]

    def commit(self, **manifest_fields: Any) -> Manifest:
        """Publish the version (the fields are the manifest's: source, parameters, row_counts, fit_metrics,
        data_window and the optional ones of `Manifest`)."""
        incoming = self._open()
        if self._partitioned:
            incoming.files.remove(incoming.path_of(WORK))
        self.done = True
        return self._store._commit(incoming, **manifest_fields)


class ModelStore:
    """Publish and load model versions (and the live loop's light updates beside them) under one directory or
    fsspec URL."""

    def __init__(self, root: str | Path, retention_versions: int = 10) -> None:
        if retention_versions < 1:
            raise ValueError("retention_versions must be at least 1")
        self.files = StoreFiles(root)
        self.root = self.files.root
        self.retention_versions = retention_versions

    def __str__(self) -> str:
        return self.files.url(self.root)

    @property
    def versions_dir(self) -> str:
        return posixpath.join(self.root, "versions")

    def versions(self) -> list[str]:
        """Published version names, oldest first (names sort by creation time)."""
        try:
            entries = self.files.fs.ls(self.versions_dir, detail=True)
        except FileNotFoundError:
            return []
        names = (posixpath.basename(e["name"].rstrip("/")) for e in entries if e["type"] == "directory")
        return sorted(n for n in names if not n.startswith("."))

    def latest_name(self) -> str | None:
        try:
            name = self.files.read(posixpath.join(self.root, "latest")).decode("utf-8").strip()
        except (FileNotFoundError, IsADirectoryError):
            return None
        return name or None

    def _begin(self) -> IncomingVersion:
        """Start a version (name sorting by creation time), after removing what killed runs left."""
        self.files.fs.makedirs(self.versions_dir, exist_ok=True)
        if not self.files.local:
            self._remove_stale_incoming()
            incoming = IncomingVersion(self.files, self.versions_dir, self._new_name())
        else:
            self._remove_leftovers()
            lock = None
            while lock is None:
                name = self._new_name()
                lock = _new_lock(posixpath.join(self.versions_dir, INCOMING_PREFIX + name + LOCK_SUFFIX))
            incoming = IncomingVersion(self.files, self.versions_dir, name, lock)
        self.files.fs.makedirs(incoming.path, exist_ok=True)
        return incoming

    @staticmethod
    def _new_name() -> str:
        return datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ") + "-" + secrets.token_hex(3)

    def _abort(self, incoming: IncomingVersion) -> None:
        self.files.remove(incoming.path)
        incoming.release()

    @contextmanager
    def _publish_lock(self) -> Iterator[None]:
        """The store's publish lock (local file systems; a no-op elsewhere), held while a version moves into place
        and `latest` moves, and while a new run removes leftovers: neither sees the other half done."""
        if not self.files.local:
            yield
            return
        fd = os.open(posixpath.join(self.root, PUBLISH_LOCK), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _remove_leftovers(self) -> None:
        """Remove what stopped runs left on a local store: `latest`'s temporary files, a complete version whose run
        died while publishing it, and every incoming version whose writer's lock is free (its process is gone)."""
        with self._publish_lock():
            for temporary in [*Path(self.root).glob(".latest.*.tmp"), *Path(self.root).glob(PUBLISHING + ".*.tmp")]:
                log.warning("removing %s: a temporary file of a run that stopped while publishing", temporary)
                temporary.unlink(missing_ok=True)
            publishing = Path(self.root) / PUBLISHING
            if publishing.is_file():
                name = publishing.read_text().strip()
                if name and name != self.latest_name() and Path(self.versions_dir, name).is_dir():
                    log.warning(
                        "removing version %s: complete but never published (its run stopped before moving latest)", name
                    )
                    self.files.remove(posixpath.join(self.versions_dir, name))
                publishing.unlink()
        for path in sorted(
            {
                p.removesuffix(LOCK_SUFFIX)
                for p in self.files.fs.glob(posixpath.join(self.versions_dir, INCOMING_PREFIX + "*"))
            }
        ):
            lock_path = path + LOCK_SUFFIX
            fd = _try_lock(lock_path)
            if fd is None and Path(lock_path).exists():
                continue
            if Path(path).exists():
                log.warning("removing %s: left by a run that stopped before publishing it", path)
                self.files.remove(path)
            if fd is not None:
                Path(lock_path).unlink(missing_ok=True)
                os.close(fd)

    def _commit(
        self,
        incoming: IncomingVersion,
        *,
        source: str,
        parameters: dict[str, Any],
        row_counts: dict[str, int],
        fit_metrics: dict[str, float],
        data_window: DataWindow,
        parent_version: str | None = None,
        read_metrics: dict[str, float] | None = None,
        skipped: dict[str, str] | None = None,
        quarantined: dict[str, str] | None = None,
        partition_starts: list[tuple[str, str]] | None = None,
    ) -> Manifest:
        """Write the manifest of a complete incoming version, move it into place, then move `latest` to it; old
        versions beyond retention go. Any failure removes the incoming version and leaves `latest` as it was."""
        try:
            manifest = Manifest(
                schema_version=SCHEMA_VERSION,
                version=incoming.name,
                created_at=datetime.now(UTC).isoformat(timespec="seconds"),
                package_version=__version__,
                source=source,
                data_window=data_window,
                parameters=parameters,
                row_counts=row_counts,
                fit_metrics=fit_metrics,
                parent_version=parent_version,
                read_metrics=read_metrics or {},
                skipped=skipped or {},
                quarantined=quarantined or {},
                partition_starts=partition_starts or [],
                files=dict(sorted(incoming.entries.items())),
            )
            self.files.put(incoming.path_of(MANIFEST), manifest.model_dump_json(indent=2).encode())
            self.files.sync_directory(incoming.path)
        except BaseException:
            self._abort(incoming)
            raise
        try:
            with self._publish_lock():
                self._move_into_place(incoming)
        finally:
            incoming.release()
        self._prune(keep=incoming.name)
        return manifest

    def _move_into_place(self, incoming: IncomingVersion) -> None:
        """Rename the complete version into `versions/` and point `latest` at it; locally, with its name in
        `.publishing` meanwhile, so a run killed between the two leaves a version the next run knows to remove."""
        final = posixpath.join(self.versions_dir, incoming.name)
        publishing = posixpath.join(self.root, PUBLISHING)
        try:
            if self.files.local:
                self.files.put(publishing, incoming.name.encode())
                os.rename(incoming.path, final)
            else:
                self.files.fs.mv(incoming.path, final, recursive=True)
            self.files.sync_directory(self.versions_dir)
        except BaseException:
            self._abort(incoming)
            raise
        self.files.put(posixpath.join(self.root, "latest"), (incoming.name + "\n").encode())
        if self.files.local:
            self.files.remove(publishing)

    @contextmanager
    def writer(self) -> Iterator[VersionWriter]:
        """A new version to write (see `VersionWriter`); removed unless committed inside the block."""
        writer = VersionWriter(self, self._begin())
        try:
            yield writer
        finally:
            if not writer.done:
                writer.done = True
                self._abort(writer._incoming)

    def publish(
        self,
        recommendations: RecommendationSet,
        model: WorkloadRecommender,
        node_model: NodeForecaster | None = None,
        **manifest_fields: Any,
    ) -> Manifest:
        """A single-process version in one call: the recommendations, the model and (when the usage said where pods
        ran) the node model, committed with the manifest's fields."""
        with self.writer() as writer:
            writer.write_recommendations(recommendations)
            writer.write_model(model)
            if node_model is not None:
                writer.write_node_model(node_model)
            return writer.commit(**manifest_fields)

    def _prune(self, keep: str) -> None:
        names = self.versions()
        for old in names[: max(0, len(names) - self.retention_versions)]:
            if old != keep:
                self.files.remove(posixpath.join(self.versions_dir, old))

    def _remove_stale_incoming(self) -> None:
        now = time.time()
        for path in self.files.fs.glob(posixpath.join(self.versions_dir, INCOMING_PREFIX + "*")):
            try:
                modified = self.files.fs.modified(path).timestamp()
            except (NotImplementedError, FileNotFoundError, OSError):
                continue
            if now - modified > STALE_INCOMING_SECONDS:
                self.files.remove(path)

    def _version_path(self, name: str | None) -> str:
        if name is None:
            name = self.latest_name()
            if name is None:
                raise ModelStoreError(f"{self}: no model version published yet (run `recommender train`)")
        if "/" in name or name.startswith("."):
            raise ModelStoreError(f"{self}: {name!r} is not a version name")
        path = posixpath.join(self.versions_dir, name)
        if not self.files.fs.isdir(path):
            raise ModelStoreError(f"{self.files.url(path)}: version {name} does not exist")
        return path

    def manifest(self, name: str | None = None) -> Manifest:
        """The verified manifest of a version (latest by default)."""
        path = self._version_path(name)
        manifest_path = posixpath.join(path, MANIFEST)
        try:
            data = self.files.read(manifest_path)
        except FileNotFoundError:
            raise ModelStoreError(f"{self.files.url(manifest_path)}: missing; the version is partial") from None
        return self._parsed(Manifest, data, manifest_path, "a valid manifest", SCHEMA_VERSION)

    def _parsed(self, model: type[_Schema], data: bytes, path: str, what: str, schema: int) -> _Schema:
        """`data` as `model`, refused naming the file when it is not one or has another schema version."""
        try:
            parsed = model.model_validate_json(data)
        except ValidationError as error:
            raise ModelStoreError(f"{self.files.url(path)}: not {what}: {error.errors()[0]['msg']}") from None
        if parsed.schema_version != schema:
            raise ModelStoreError(
                f"{self.files.url(path)}: schema version {parsed.schema_version}, this release reads {schema}"
            )
        return parsed

    def _verified_bytes(self, path: str, manifest: Manifest, filename: str) -> bytes:
        entry = manifest.files.get(filename)
        if entry is None:
            raise ModelStoreError(f"{self.files.url(path)}: the manifest lists no {filename}")
        file_path = posixpath.join(path, filename)
        try:
            data = self.files.read(file_path)
        except FileNotFoundError:
            raise ModelStoreError(f"{self.files.url(file_path)}: missing; the version is partial") from None
        if len(data) != entry.bytes or hashlib.sha256(data).hexdigest() != entry.sha256:
            raise ModelStoreError(
                f"{self.files.url(file_path)}: checksum does not match the manifest; the file is corrupt"
            )
        return data

    def load(self, name: str | None = None) -> LoadedVersion:
        """Load and verify one version's recommendations (latest by default)."""
        path = self._version_path(name)
        manifest = self.manifest(posixpath.basename(path))
        data = self._verified_bytes(path, manifest, RECOMMENDATIONS)
        try:
            recommendations = RecommendationSet.model_validate_json(data)
        except ValidationError as error:
            raise ModelStoreError(
                f"{self.files.url(path)}/{RECOMMENDATIONS}: not a valid recommendation set: {error}"
            ) from None
        return LoadedVersion(manifest=manifest, recommendations=recommendations, path=self.files.url(path))

    def load_latest_valid(self) -> tuple[LoadedVersion, list[str]]:
        """The newest version that verifies, and the problems of any newer ones skipped on the way."""
        problems: list[str] = []
        latest = self.latest_name()
        candidates = [latest] if latest else []
        candidates += [n for n in reversed(self.versions()) if n != latest]
        for name in candidates:
            try:
                return self.load(name), problems
            except ModelStoreError as error:
                problems.append(str(error))
        raise ModelStoreError(
            "; ".join(problems) or f"{self}: no model version published yet (run `recommender train`)"
        )

    def load_model(self, name: str | None = None, partition: int | None = None) -> WorkloadRecommender:
        """The fitted estimator of a version, after its checksum is verified (for incremental training); of one
        partition of its plan when `partition` is given (partition 0 of a version fitted in one is its model)."""
        path = self._version_path(name)
        manifest = self.manifest(posixpath.basename(path))
        filename = MODEL
        if MODEL not in manifest.files:
            if partition is None:
                raise ModelStoreError(
                    f"{self.files.url(path)}: version {manifest.version} was trained in "
                    f"{len(manifest.partition_starts) or 'several'} partitions; its models are one per partition"
                )
            filename = partition_model(partition)
        elif partition not in (None, 0):
            raise ModelStoreError(
                f"{self.files.url(path)}: version {manifest.version} has one partition, not {partition + 1}"
            )
        from models.workload import WorkloadRecommender

        model = joblib.load(io.BytesIO(self._verified_bytes(path, manifest, filename)))
        if not isinstance(model, WorkloadRecommender):
            raise ModelStoreError(
                f"{self.files.url(path)}/{filename}: holds a {type(model).__name__}, not a WorkloadRecommender"
            )
        return model

    # -- the live loop's light updates ------------------------------------------------------------------------
    def _live(self, name: str) -> str:
        return posixpath.join(self.root, LIVE, name)

    def publish_live(
        self,
        recommendations: RecommendationSet,
        *,
        version: str,
        last_sample: int,
        read_metrics: dict[str, float] | None = None,
        retained: int = 3,
        writer: str = "",
    ) -> LiveUpdate:
        """Publish a light update beside `version`: its recommendations file first (gzip-compressed JSON, atomic),
        then the pointer naming it with its checksum (atomic), so a reader sees the previous update or this one
        whole. Updates beyond `retained` go. One writer at a time (the loop's Lease): the sequence is the
        pointer's plus one."""
        self.files.fs.makedirs(posixpath.join(self.root, LIVE), exist_ok=True)
        previous = self.live_update()
        sequence = previous.sequence + 1 if previous is not None else 1
        name = f"{version}-{sequence:012d}.json.gz"
        data = _gzip_fast(_set_chunks(recommendations))
        entry = self.files.put(self._live(name), data)
        update = LiveUpdate(
            version=version,
            sequence=sequence,
            written_at=time.time(),
            as_of=recommendations.as_of,
            last_sample=last_sample,
            file=name,
            entry=entry,
            read_metrics=read_metrics or {},
            writer=writer,
        )
        self.files.put(self._live(LIVE_POINTER), update.model_dump_json().encode())
        self._prune_live(retained)
        return update

    def live_update(self) -> LiveUpdate | None:
        """The newest light update (one small read), or None when there is none; an unreadable pointer is an error."""
        path = self._live(LIVE_POINTER)
        try:
            data = self.files.read(path)
        except (FileNotFoundError, IsADirectoryError):
            return None
        return self._parsed(LiveUpdate, data, path, "a live update pointer", LIVE_SCHEMA_VERSION)

    def load_live(self, update: LiveUpdate) -> RecommendationSet:
        """The recommendations of a light update, checked against the pointer's checksum."""
        if "/" in update.file or update.file.startswith("."):
            raise ModelStoreError(f"{self}: {update.file!r} is not a live update file name")
        path = self._live(update.file)
        try:
            data = self.files.read(path)
        except FileNotFoundError:
            raise ModelStoreError(f"{self.files.url(path)}: missing (pruned by a newer update?)") from None
        if len(data) != update.entry.bytes or hashlib.sha256(data).hexdigest() != update.entry.sha256:
            raise ModelStoreError(f"{self.files.url(path)}: checksum does not match live/latest; the file is corrupt")
        try:
            return RecommendationSet.model_validate_json(gzip.decompress(data))
        except (ValidationError, OSError, EOFError) as error:
            raise ModelStoreError(f"{self.files.url(path)}: not a valid recommendation set: {error}") from None

    def _prune_live(self, retained: int) -> None:
        """Keep the newest `retained` update files (names sort by version, then sequence)."""
        files = sorted(posixpath.basename(p) for p in self.files.fs.glob(posixpath.join(self.root, LIVE, "*.json.gz")))
        updates = sorted(files, key=lambda n: int(n.removesuffix(".json.gz").rsplit("-", 1)[1]))
        for old in updates[: max(0, len(updates) - retained)]:
            self.files.remove(self._live(old))

    def write_live_checkpoint(self, state: Any) -> FileEntry:
        """The live loop's state (atomic: a crash mid-write leaves the previous checkpoint), in `MODEL_COMPRESSION`
        (its usage grids are most of it: 36 MB at 1,000 containers)."""
        self.files.fs.makedirs(posixpath.join(self.root, LIVE), exist_ok=True)
        return self.files.put_model(self._live(LIVE_CHECKPOINT), state)

    def load_live_checkpoint(self) -> Any | None:
        """The live loop's last checkpoint, or None when there is none or it cannot be read (logged: the loop then
        starts from the latest version, losing nothing the store or Prometheus still has)."""
        path = self._live(LIVE_CHECKPOINT)
        try:
            data = self.files.read(path)
        except FileNotFoundError:
            return None
        try:
            return joblib.load(io.BytesIO(data))
        except Exception as error:
            log.warning(
                "%s: unreadable live checkpoint (%s); starting from the latest version", self.files.url(path), error
            )
            return None

    def load_node_model(self, name: str | None = None) -> NodeForecaster | None:
        """The fitted node model of a version (None when it has none), after its checksum is verified."""
        path = self._version_path(name)
        manifest = self.manifest(posixpath.basename(path))
        if NODE_MODEL not in manifest.files:
            return None
        from models.nodes import NodeForecaster

        model = joblib.load(io.BytesIO(self._verified_bytes(path, manifest, NODE_MODEL)))
        if not isinstance(model, NodeForecaster):
            raise ModelStoreError(
                f"{self.files.url(path)}/{NODE_MODEL}: holds a {type(model).__name__}, not a NodeForecaster"
            )
        return model


def recommendation_fragments(recommendations: Iterable[WorkloadRecommendation]) -> Iterator[bytes]:
    """Each recommendation's JSON, byte for byte what `model_dump_json` writes, by orjson from its fields (`_fields`)
    in 60 % of the time: every writer of recommendations (a version, a live update, a partition's results)."""
    return (orjson.dumps(r, default=_fields) for r in recommendations)


def _set_chunks(recommendations: RecommendationSet) -> Iterator[bytes]:
    """The set's JSON, one recommendation at a time."""
    return recommendation_set_chunks(recommendations, recommendation_fragments(recommendations.recommendations))


def _fields(value: object) -> dict[str, Any]:
    """A model's fields as orjson writes them: its `__dict__`, every field in its order, as `model_dump_json` writes
    a model without serializers or aliases (the recommendations' models have none), byte for byte (orjson's lists
    of floats are faster than pydantic's `float | None` ones)."""
    if isinstance(value, BaseModel):
        return value.__dict__
    raise TypeError(f"{type(value).__name__} is not a pydantic model")


def _gzip_fast(chunks: Iterable[bytes]) -> bytes:
    """`chunks` as one gzip member (mtime 0), compressed as they come by ISA-L at its level 1: a live pass at 10,000
    containers writes 230 MB of JSON a minute, which zlib's level 1 took 1.5 CPU s to compress and ISA-L takes a
    quarter of, in fewer bytes (any gzip reader reads it: `load_live` reads it with the standard library)."""
    compressor = isal_zlib.compressobj(1, isal_zlib.DEFLATED, 16 + isal_zlib.MAX_WBITS)
    return b"".join([*(compressor.compress(chunk) for chunk in chunks), compressor.flush()])
