"""The fleet's memory forecasts in a process beside CPU's (forked once the rows are read, inheriting their grids), the
estimators imported when first needed, and the end of a finished command (issue 17: a training pass's wall time)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import BrokenExecutor, Executor, Future, ProcessPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import pipelines.train as t
from models.workload import (
    FleetForecaster,
    ForecastsElsewhere,
    ResourceForecast,
    WorkloadRecommender,
    fit_fleet_forecasts,
    fit_resource_forecasts,
)
from pipelines.partitions import MemoryWorkspace
from pipelines.settings import TrainingSettings
from pipelines.train import FleetReduction, InProcessExecutor, _Run, fork_side_process
from recommender import __version__
from recommender.progress import quiet
from recommender.settings import ForecastSettings
from tests.unit.test_selection_blocks import fleet_usage

REPO = Path(__file__).resolve().parents[2]


def partitions() -> list[WorkloadRecommender]:
    usage = fleet_usage()
    settings = ForecastSettings(group_min_containers=2)
    data_end = int(usage["timestamp"].max())
    return [
        WorkloadRecommender(forecast=FleetForecaster.from_settings(settings)).fit(
            usage[usage["workload"].isin(names)], data_end=data_end, fit_forecasts=False
        )
        for names in (["w0", "w1", "w2"], ["w3", "w4", "w5"], ["x0", "x1", "x2"])
    ]


def elsewhere(side: Executor, models: list[WorkloadRecommender]) -> ForecastsElsewhere:
    """Memory's choice sent to `side` with its grids."""

    def choose(settings: ForecastSettings, grid_end: int) -> Future[list[ResourceForecast]]:
        return side.submit(fit_resource_forecasts, [m.memory_grid_ for m in models], settings, grid_end)

    return choose


def test_memory_forecasts_chosen_in_another_process_equal_those_of_a_thread() -> None:
    threaded, beside = partitions(), partitions()
    fit_fleet_forecasts(threaded)
    # Spawned, not forked: the test process may run other threads (`fork_side_process` forks only without them).
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as side:
        assert side.submit(os.getpid).result() != os.getpid()
        fit_fleet_forecasts(beside, elsewhere(side, beside))
    for a, b in zip(threaded, beside):
        assert a.memory_forecasts_.keys() == b.memory_forecasts_.keys() == a.cpu_forecasts_.keys()
        for key in a.memory_forecasts_:
            for line in ("short_term", "request", "long_term"):
                for resource in ("memory_forecasts_", "cpu_forecasts_"):
                    ours, theirs = getattr(getattr(a, resource)[key], line), getattr(getattr(b, resource)[key], line)
                    np.testing.assert_array_equal(ours.choice_, theirs.choice_)
                    np.testing.assert_array_equal(ours.factors_, theirs.factors_)
        assert a.predict().model_dump() == b.predict().model_dump()


def test_no_fork_while_another_thread_runs() -> None:
    release = threading.Event()
    other = threading.Thread(target=release.wait, daemon=True)
    other.start()
    try:
        with ExitStack() as stack:
            assert fork_side_process(stack, {}) is None
    finally:
        release.set()
        other.join()


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        check=False,
    )


def assert_passes(code: str) -> None:
    """`code`, run in a fresh interpreter, ends by printing ok."""
    done = run_python(code + "\nprint('ok')")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_a_single_threaded_process_forks_a_worker_that_runs_tasks_and_is_joined_with_the_stack() -> None:
    assert_passes(
        "import os; from contextlib import ExitStack; from pipelines.train import fork_side_process\n"
        "with ExitStack() as stack:\n"
        "    side = fork_side_process(stack, {})\n"
        "    child = side.submit(os.getpid).result()\n"
        "    assert child != os.getpid(), child\n"
        "    processes = list(side._processes.values())\n"
        "assert processes and not any(p.is_alive() for p in processes)"
    )


def test_the_side_process_runs_what_it_inherited_without_pickling_it_and_this_process_lets_go() -> None:
    # A lambda over a big array: neither would go through the pipe (a lambda does not pickle at all).
    assert_passes(
        "import os, gc, weakref, numpy as np; from contextlib import ExitStack\n"
        "import pipelines.train as t\n"
        "class Big(np.ndarray): pass\n"
        "grid = np.arange(1_000_000, dtype=float).view(Big)\n"
        "alive = weakref.ref(grid)\n"
        "with ExitStack() as stack:\n"
        "    side = t.fork_side_process(stack, {'sum': lambda scale: float(grid.sum()) * scale, 'pid': os.getpid})\n"
        "    assert not t._INHERITED\n"
        "    del grid; gc.collect()\n"
        "    assert alive() is None  # this process holds nothing of what the child inherited\n"
        "    assert side.submit(t.inherited, 'sum', 2).result() == 2 * 499_999_500_000.0\n"
        "    assert side.submit(t.inherited, 'pid').result() != os.getpid()"
    )


def test_the_training_module_loads_without_the_estimators() -> None:
    assert_passes(
        "import sys, pipelines.train as t\n"
        "assert not {'sklearn', 'scipy', 'models.workload', 'models.nodes'} & set(sys.modules), sorted(sys.modules)\n"
        "t.import_estimators()\n"
        "assert {'sklearn', 'models.workload', 'models.nodes'} <= set(sys.modules)"
    )


@pytest.mark.parametrize(
    ("arguments", "code", "says"),
    [(["--version"], 0, __version__), (["train", "--input", "/nonexistent/usage.csv"], 2, "nonexistent")],
)
def test_the_console_entry_point_keeps_exit_codes_and_output(arguments: list[str], code: int, says: str) -> None:
    done = run_python(f"import sys; sys.argv = ['recommender', *{arguments!r}]; from cli.main import main; main()")
    assert done.returncode == code, done.stderr
    assert says in done.stdout + done.stderr


def test_a_command_ending_beside_a_running_thread_exits_the_usual_way() -> None:
    done = run_python(
        "import sys, threading, time\n"
        "from cli.main import _end\n"
        "def late():\n"
        "    time.sleep(0.5)\n"
        "    print('the thread finished', flush=True)\n"
        "threading.Thread(target=late).start()\n"
        "_end(SystemExit(3))"
    )
    assert done.returncode == 3
    assert "the thread finished" in done.stdout


def broken_pool() -> ProcessPoolExecutor:
    """A pool whose only worker was killed (as the kernel's OOM killer would)."""
    pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
    os.kill(pool.submit(os.getpid).result(), signal.SIGKILL)
    with pytest.raises(BrokenExecutor):  # the pool learns it when it next waits on the worker
        pool.submit(time.sleep, 0).result(timeout=60)
    return pool


class DyingExecutor(Executor):
    """A side whose process dies under every task it was given."""

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future[Any]:
        return broken_future()


@pytest.mark.parametrize("when", ["before", "while"])
def test_a_dead_side_process_leaves_the_memory_forecasts_to_this_one(when: str) -> None:
    threaded, beside = partitions(), partitions()
    fit_fleet_forecasts(threaded)
    side: Executor = broken_pool() if when == "before" else DyingExecutor()
    try:
        fit_fleet_forecasts(beside, elsewhere(side, beside))
    finally:
        side.shutdown()
    for a, b in zip(threaded, beside):
        assert a.predict().model_dump() == b.predict().model_dump()


def test_a_run_forgets_a_dead_side_process_and_fits_the_node_model_here() -> None:
    run = _Run(TrainingSettings(), InProcessExecutor(), None, "test", None, 86400, quiet)
    pool = broken_pool()
    run.side = pool
    try:
        assert run.beside(os.getpid) is None  # the dead process is forgotten,
        run._end_side()
        assert run.side is None and run.side_peak == {}  # and nothing more is sent to it
    finally:
        pool.shutdown()
    calls: list[str] = []

    def fit_here() -> Any:
        calls.append("here")
        return None, []

    run.node_call = fit_here
    run.node_fit = broken_future()  # it died while fitting the node model
    assert run.node_lines() == (None, [])
    assert calls == ["here"]


def broken_future() -> Future[Any]:
    future: Future[Any] = Future()
    future.set_exception(BrokenExecutor("the side process died"))
    return future


def test_output_to_a_closed_pipe_ends_with_pythons_status_not_a_traceback() -> None:
    code = (
        "import os, sys\n"
        "read, write = os.pipe()\n"
        "os.close(read)\n"
        "sys.stdout = os.fdopen(write, 'w')\n"
        "print('x' * 10)\n"
        "from cli.main import _end\n"
        "_end(SystemExit(0))"
    )
    done = run_python(code)
    assert done.returncode == 120
    assert "Traceback" not in done.stderr


class RecordingExecutor(Executor):
    """A side that runs what it is given here, and counts it."""

    def __init__(self) -> None:
        self.tasks: list[tuple[str, ...]] = []

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future[Any]:
        self.tasks.append((fn.__name__, *(a for a in args if isinstance(a, str))))
        future: Future[Any] = Future()
        future.set_result(fn(*args, **kwargs))
        return future


@pytest.mark.parametrize(("bound_mib", "beside"), [(128, True), (0, False)])
def test_memory_grids_above_the_bound_are_chosen_in_threads_not_the_side_process(bound_mib: int, beside: bool) -> None:
    settings = TrainingSettings.model_validate({"scale": {"side_process_max_grid_mib": bound_mib}})
    run = _Run(settings, InProcessExecutor(), None, "test", None, 86400, quiet)
    parts = partitions()
    run.workspaces = {i: MemoryWorkspace(fitted=part) for i, part in enumerate(parts)}
    models = run._fleet_models(sorted(run.workspaces))
    work = run._side_work(models)
    assert ("memory" in work) is beside
    side = RecordingExecutor()
    run.side = side  # type: ignore[assignment]
    run.side_models = models if "memory" in work else []
    t._INHERITED.update(work)  # what the side process would have inherited at its fork
    try:
        run._fleet_forecasts(models, FleetReduction())
    finally:
        t._INHERITED.clear()
    assert (("inherited", "memory") in side.tasks) is beside
    assert all(part.memory_forecasts_ for part in parts)


@pytest.mark.parametrize("inherited_parts", [1, 2])
def test_a_partition_fitted_after_the_fork_sends_its_grid_and_gets_the_forecasts_of_one_fleet(
    inherited_parts: int,
) -> None:
    """A streamed read forks the side process before its last partition's fit: memory's choice there takes the grids
    it inherited and the later partitions' sent with the call, and chooses as on the whole fleet in one process."""
    threaded = partitions()
    fit_fleet_forecasts(threaded)
    run = _Run(TrainingSettings(), InProcessExecutor(), None, "test", None, 86400, quiet)
    parts = partitions()
    run.workspaces = {i: MemoryWorkspace(fitted=part) for i, part in enumerate(parts)}
    models = run._fleet_models(sorted(run.workspaces))
    run.side_models = models[:inherited_parts]
    side = RecordingExecutor()
    run.side = side  # type: ignore[assignment]
    t._INHERITED.update(run._side_work(run.side_models))  # inherited at the fork: the first partitions' grids only
    try:
        run._fleet_forecasts(models, FleetReduction())
    finally:
        t._INHERITED.clear()
    assert ("inherited", "memory") in side.tasks
    # Its work in, the side process was asked its peak and ended (issue 41: idle, it held
    # 200 MiB of its own to the run's end).
    assert side.tasks[-1] == ("peak_rss_mib",) and run.side is None and run.side_peak["side_peak_rss_mib"] > 0
    for a, b in zip(threaded, parts):
        assert a.predict().model_dump() == b.predict().model_dump()


def test_the_live_lines_are_fitted_while_the_forecasts_are_chosen() -> None:
    """Issue 41: the live lines read no forecast, so they are fitted while memory's are chosen elsewhere (the side
    process, which had the node model's to fit first), not after both choices are in."""
    threaded, beside = partitions(), partitions()
    fit_fleet_forecasts(threaded)
    fitted_before_waiting: list[bool] = []

    class Chosen(Future[list[ResourceForecast]]):
        def result(self, timeout: float | None = None) -> list[ResourceForecast]:
            fitted_before_waiting.append(all(hasattr(m, "memory_live_line_") for m in beside))
            return fit_resource_forecasts([m.memory_grid_ for m in beside], self.settings, self.grid_end)

        def __init__(self, settings: ForecastSettings, grid_end: int) -> None:
            super().__init__()
            self.settings, self.grid_end = settings, grid_end

    fit_fleet_forecasts(beside, Chosen)
    assert fitted_before_waiting and all(fitted_before_waiting)
    for a, b in zip(threaded, beside):
        assert a.predict().model_dump() == b.predict().model_dump()
