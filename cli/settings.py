"""The root settings, assembled at the composition root from each layer's group.

`Settings` *is* a `TrainingSettings` and a `ServingSettings` (pydantic model inheritance), so a command hands the
one object it read to whichever layer it calls, and each layer sees only its own groups. Values come from (highest
first) explicit arguments, environment variables `KOORD_RECOMMENDER_<GROUP>__<FIELD>` (for example
`KOORD_RECOMMENDER_POLICY__SAFETY_MARGIN_FRACTION=0.2`), then the defaults of the groups.
"""

from __future__ import annotations

from pydantic import BaseModel
from pydantic_settings import BaseSettings, SettingsConfigDict

from pipelines.settings import TrainingSettings
from serving.settings import ServingSettings


class Settings(ServingSettings, TrainingSettings, BaseSettings):
    """All settings, one group per concern: the model's, the pipelines', then the service's."""

    model_config = SettingsConfigDict(env_prefix="KOORD_RECOMMENDER_", env_nested_delimiter="__", extra="forbid")


def _where(model: type[BaseModel]) -> str:
    """The module and class of a group, and of the core group it extends, if any."""
    names = [f"`{cls.__module__.replace('.', '/')}.py` (`{cls.__name__}`)" for cls in model.__mro__[:2]]
    return names[0] if model.__mro__[1] is BaseModel else f"{names[0]}, extending {names[1]}"


def markdown_reference() -> str:
    """docs/configuration.md, generated from the groups' fields so the two cannot drift (`make docs`)."""
    lines = [
        "# Configuration",
        "",
        "Generated from the settings groups (each beside its layer, assembled in `cli/settings.py`) by `make docs`; do",
        "not edit by hand.",
        "",
        "Every setting has a default (VPA's or Koordinator's where one exists) and can be overridden by an environment",
        "variable `KOORD_RECOMMENDER_<GROUP>__<FIELD>` (upper case), for example",
        "`KOORD_RECOMMENDER_POLICY__SAFETY_MARGIN_FRACTION=0.2`; dictionaries and lists are given as JSON. Command-line",
        "flags win over the environment. Invalid values stop the command with a clear message (exit code 2). The",
        "parameters a model version was trained with are recorded in its `manifest.json`.",
        "",
    ]
    for group, field in Settings.model_fields.items():
        model = field.annotation
        assert isinstance(model, type) and issubclass(model, BaseModel)
        lines += [f"## `{group}`: {(model.__doc__ or '').strip().splitlines()[0]}", ""]
        lines += [f"Defined in {_where(model)}.", ""]
        lines += ["| environment variable | default | meaning |", "|---|---|---|"]
        for name, info in model.model_fields.items():
            default = info.get_default(call_default_factory=True)
            lines.append(f"| `KOORD_RECOMMENDER_{group.upper()}__{name.upper()}` | `{default}` | {info.description} |")
        lines.append("")
    return "\n".join(lines)
