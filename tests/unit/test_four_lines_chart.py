"""The four-line chart (`presentation.charts`): value axes ticked at round steps, in one unit per axis."""

from __future__ import annotations

import itertools
import math

import matplotlib.pyplot as plt
import pytest

from presentation.charts import four_lines_figure
from recommender.resources import CurrentResources, History
from recommender.units import GIB
from tests.recs import recommendation


def round_step(values: list[float]) -> bool:
    """Ticks one step apart, the step 1, 2 or 5 times a power of ten (matplotlib's default also allows 2.5)."""
    step = values[1] - values[0]
    mantissa = step / 10 ** math.floor(math.log10(step) + 1e-9)
    return any(math.isclose(mantissa, m) for m in (1, 2, 5, 10)) and all(
        math.isclose(b - a, step) for a, b in itertools.pairwise(values)
    )


@pytest.mark.parametrize(
    ("cpu_cores", "memory_bytes"), [(2.08, 13.29 * GIB), (1.61, 9.0 * GIB), (0.695, 4.43 * GIB), (0.0162, 0.3 * GIB)]
)
def test_value_axes_tick_at_round_steps(cpu_cores: float, memory_bytes: float) -> None:
    """Issue 39: ticks at 695m / 1.39 / 2.08 cores and 4.43 / 8.86 / 13.29 Gi (a range cut in four). The CPU axis is
    in cores and the memory axis in GiB, each ticked at 1, 2 or 5 x 10^k."""
    rec = recommendation("ns", "w", "main", cpu_cores * 0.8, memory_bytes * 0.8).model_copy(
        update={
            "current": CurrentResources(cpu_limit_cores=cpu_cores, memory_limit_bytes=memory_bytes),
            "history": History(
                first_sample=0,
                last_sample=0,
                pods=1,
                samples=3,
                recent_cpu_cores=[cpu_cores / 2] * 3,
                recent_memory_bytes=[memory_bytes / 2] * 3,
            ),
        }
    )
    figure = four_lines_figure([rec], 300)
    try:
        cpu, memory = figure.axes[:2]
        assert cpu.get_ylabel() == "cores" and memory.get_ylabel() == "GiB"
        for axes, top in ((cpu, cpu_cores), (memory, memory_bytes / GIB)):
            ticks = [t for t in axes.get_yticks().tolist() if axes.get_ylim()[0] <= t <= axes.get_ylim()[1]]
            assert ticks[0] == 0 and ticks[-1] >= top * 0.5 and round_step(ticks), ticks
    finally:
        plt.close(figure)
