"""Units at the edges and settings from the environment."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cli.settings import Settings
from recommender.settings import ColocationSettings
from recommender.units import (
    cpu_cores_from_quantity,
    cpu_millicores,
    cpu_quantity,
    memory_bytes_from_quantity,
    memory_quantity,
    parse_duration_seconds,
)


@pytest.mark.parametrize(
    ("text", "seconds"), [("24h", 86400), ("90m", 5400), ("7d", 604800), ("300", 300), ("1w", 604800)]
)
def test_durations(text: str, seconds: int) -> None:
    assert parse_duration_seconds(text) == seconds


@pytest.mark.parametrize("text", ["", "h", "-1h", "1.5s", "tomorrow", "0s"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration_seconds(text)


def test_kubernetes_quantities() -> None:
    assert cpu_cores_from_quantity("250m") == 0.25
    assert memory_bytes_from_quantity("512Mi") == 512 * 1024**2
    assert cpu_quantity(0.2501) == "251m"
    assert cpu_quantity(2.0) == "2"
    assert memory_quantity(1024**3) == "1Gi"
    assert memory_quantity(1.5 * 1024**2 + 1) == "2Mi"
    assert cpu_millicores(0.5) == 500


@given(st.floats(min_value=0.001, max_value=1000, allow_nan=False))
def test_cpu_quantity_never_rounds_down(cores: float) -> None:
    assert cpu_cores_from_quantity(cpu_quantity(cores)) >= cores - 1e-12


@given(st.floats(min_value=2 * 1024**2, max_value=1e13, allow_nan=False))
def test_memory_quantity_never_rounds_down(value: float) -> None:
    assert memory_bytes_from_quantity(memory_quantity(value)) >= value


def test_settings_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KOORD_RECOMMENDER_POLICY__SAFETY_MARGIN_FRACTION", "0.3")
    monkeypatch.setenv("KOORD_RECOMMENDER_STORE__RETENTION_VERSIONS", "3")
    settings = Settings()
    assert settings.policy.safety_margin_fraction == 0.3
    assert settings.store.retention_versions == 3
    assert settings.histogram.cpu_half_life_seconds == 86400


def test_the_root_settings_are_each_layers_group(monkeypatch: pytest.MonkeyPatch) -> None:
    """One object from the environment serves every layer, and a group split between the core and serving (the
    webhook's mutation rules and its watches) still reads both halves from the same variables."""
    from models.settings import ModelSettings
    from pipelines.settings import TrainingSettings
    from recommender.settings import MutationSettings
    from serving.settings import ServingSettings

    monkeypatch.setenv("KOORD_RECOMMENDER_WEBHOOK__DRY_RUN", "true")
    monkeypatch.setenv("KOORD_RECOMMENDER_WEBHOOK__RESYNC_SECONDS", "7")
    monkeypatch.setenv("KOORD_RECOMMENDER_EXTENDER__NEUTRAL_SCORE", "3")
    settings = Settings()
    assert isinstance(settings, TrainingSettings) and isinstance(settings, ServingSettings)
    assert isinstance(settings, ModelSettings) and isinstance(settings.webhook, MutationSettings)
    assert settings.webhook.dry_run and settings.webhook.resync_seconds == 7
    assert settings.extender.neutral_score == 3


def test_settings_reject_bad_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KOORD_RECOMMENDER_POLICY__TARGET_PERCENTILE", "1.5")
    with pytest.raises(ValueError):
        Settings()


def test_configuration_doc_is_generated_from_the_settings() -> None:
    from pathlib import Path

    from cli.settings import markdown_reference

    text = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    assert text == markdown_reference(), "docs/configuration.md is stale: run `make docs`"
    assert "KOORD_RECOMMENDER_PROMETHEUS__URL" in text


def test_colocation_settings_of_one_resource() -> None:
    col = ColocationSettings(cpu_margin_fraction=0.03, memory_margin_fraction=0.07, memory_jump_quantile=0.9)
    assert col.of("cpu").margin_fraction == 0.03
    assert col.of("memory").margin_fraction == 0.07
    assert col.of("memory").jump_quantile == 0.9
    assert col.of("memory").koordinator_reclaim_percent == col.koordinator_memory_reclaim_percent
    with pytest.raises(ValueError, match="gpu"):
        col.of("gpu")
