"""Units: every quantity inside the project is a float in cores or bytes; Kubernetes strings only at the edges."""

from __future__ import annotations

import math
from decimal import Decimal

SECONDS_PER_MINUTE = 60
SECONDS_PER_HOUR = 3600
SECONDS_PER_DAY = 86400
MIB = 1024**2
GIB = 1024**3

_DURATION_SUFFIXES = {
    "s": 1,
    "m": SECONDS_PER_MINUTE,
    "h": SECONDS_PER_HOUR,
    "d": SECONDS_PER_DAY,
    "w": 7 * SECONDS_PER_DAY,
}


def parse_duration_seconds(text: str) -> int:
    """Parse '24h', '90m', '7d', '300s' or a bare number of seconds into whole seconds (> 0)."""
    raw = text.strip().lower()
    if not raw:
        raise ValueError("empty duration")
    unit = raw[-1]
    if unit.isdigit():
        number, factor = raw, 1
    elif unit in _DURATION_SUFFIXES:
        number, factor = raw[:-1], _DURATION_SUFFIXES[unit]
    else:
        raise ValueError(f"duration {text!r} has an unknown unit (use s, m, h, d or w)")
    try:
        value = float(number) * factor
    except ValueError:
        raise ValueError(f"duration {text!r} is not a number followed by s, m, h, d or w") from None
    if not math.isfinite(value) or value <= 0 or value != int(value):
        raise ValueError(f"duration {text!r} must be a positive whole number of seconds")
    return int(value)


def _parse_quantity(quantity: str | int | float) -> float:
    # Imported here: `kubernetes` imports its whole client (0.2-0.3 s), which a command that parses no quantity
    # (training from a file or Prometheus) never needs.
    from kubernetes.utils.quantity import parse_quantity

    return float(parse_quantity(quantity))  # type: ignore[no-untyped-call]


def cpu_cores_from_quantity(quantity: str | int | float) -> float:
    """Kubernetes CPU quantity ('250m', '2', '0.5') to cores."""
    return _parse_quantity(quantity)


def memory_bytes_from_quantity(quantity: str | int | float) -> float:
    """Kubernetes memory quantity ('512Mi', '1G', '1e9') to bytes."""
    return _parse_quantity(quantity)


def cpu_on_grid(cpu_cores: float) -> float:
    """Cores rounded up to whole millicores, the only CPU rounding we do: what a surface shows is what is written.
    Float noise below a millionth of a millicore (2.8990000000000005) is not a millicore more."""
    return cpu_millicores(cpu_cores) / 1000


def memory_on_grid(memory_bytes: float) -> float:
    """Bytes rounded up to a whole MiB when above 1 MiB (else to whole bytes), the only memory rounding we do."""
    if memory_bytes >= MIB:
        return float(math.ceil(memory_bytes / MIB) * MIB)
    return float(math.ceil(memory_bytes))


def cpu_quantity(cpu_cores: float) -> str:
    """Cores to a Kubernetes CPU quantity in whole milli-cores, rounded up so a request never shrinks below the need."""
    millicores = round(cpu_on_grid(cpu_cores) * 1000)
    return f"{millicores}m" if millicores % 1000 else str(millicores // 1000)


def memory_quantity(memory_bytes: float) -> str:
    """Bytes to a Kubernetes memory quantity, rounded up to a whole MiB when above 1 MiB (else whole bytes)."""
    grid = int(memory_on_grid(memory_bytes))
    if grid >= MIB:
        mebibytes = grid // MIB
        return f"{mebibytes // 1024}Gi" if mebibytes % 1024 == 0 else f"{mebibytes}Mi"
    return str(grid)


def cpu_millicores(cpu_cores: float) -> int:
    """Cores to integer milli-cores, rounded up (Koordinator's batch-cpu / mid-cpu unit)."""
    return math.ceil(round(cpu_cores * 1000, 6))


_DECIMAL_SUFFIXES = ("", "k", "M", "G", "T", "P", "E")
_BINARY_SUFFIXES = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")


def vpa_cpu_quantity(cpu_cores: float) -> str:
    """Cores to the quantity VPA writes: whole milli-cores truncated (its ResourceAmount), in Kubernetes' canonical
    form (12m, 2, 100G)."""
    millicores = int(Decimal(str(cpu_cores)) * 1000)
    if millicores % 1000:
        return f"{millicores}m"
    return _canonical(millicores // 1000, 1000, _DECIMAL_SUFFIXES)


def vpa_memory_quantity(memory_bytes: float) -> str:
    """Bytes to the quantity VPA writes: whole bytes truncated, in canonical binary form (250Mi, 4066212754)."""
    return _canonical(int(memory_bytes), 1024, _BINARY_SUFFIXES)


def _canonical(value: int, base: int, suffixes: tuple[str, ...]) -> str:
    """The largest suffix that divides the value exactly (Kubernetes' canonical quantity string)."""
    index = 0
    while value and value % base == 0 and index < len(suffixes) - 1:
        value //= base
        index += 1
    return f"{value}{suffixes[index]}"
