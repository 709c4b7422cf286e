"""Whether the admission webhook may change a pod, and within what bounds: the opt-in, as a pure function.

Nothing is changed unless someone asked (docs/webhook.md, "Opt-in modes"). The mode comes from, highest first:
the pod's own label or annotation `koord-recommender.io/mode` (its workload's pod template), a VerticalPodAutoscaler
whose `spec.recommenders` names us and whose targetRef is the pod's controller, the namespace's label of the same
key, then `webhook.default_mode` (`Off`). A VPA of another recommender (or of none: the default one) targeting the
pod's controller means the pod is that VPA's: we leave it alone whatever the labels say, so two writers never fight.

Modes: `Off` recommends only; `Initial` sets requests at pod creation; `Auto` is the same for an admission webhook,
which never evicts. VPA's evicting update modes (Recreate, Auto, InPlaceOrRecreate) therefore become `Auto`.
A HorizontalPodAutoscaler scaling the same controller on CPU or memory removes that resource from what we may change
(the VPA documents not to use both on one resource).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from recommender.owners import workload_refs
from recommender.units import cpu_cores_from_quantity, memory_bytes_from_quantity

MODE_KEY = "koord-recommender.io/mode"
Mode = Literal["Off", "Initial", "Auto"]
MODES: tuple[Mode, ...] = get_args(Mode)
#: VPA's updatePolicy.updateMode -> ours; VPA's default (unset) is Auto.
VPA_UPDATE_MODES: dict[str, Mode] = {
    "Off": "Off",
    "Initial": "Initial",
    "Recreate": "Auto",
    "Auto": "Auto",
    "InPlaceOrRecreate": "Auto",
}
RESOURCES = ("cpu", "memory")
_PARSE = {"cpu": cpu_cores_from_quantity, "memory": memory_bytes_from_quantity}


@dataclass(frozen=True)
class ContainerPolicy:
    """One entry of a VPA's resourcePolicy.containerPolicies, parsed (None: the webhook policy's value stands)."""

    mode: Literal["Auto", "Off"] = "Auto"
    controlled_resources: tuple[str, ...] | None = None
    controlled_values: Literal["RequestsOnly", "RequestsAndLimits"] | None = None
    #: minAllowed / maxAllowed, cores or bytes by resource
    min_allowed: Mapping[str, float] = field(default_factory=dict)
    max_allowed: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class OptIn:
    """The decision for one pod: its mode, who set it, the VPA's per-container policies and the resources an HPA
    scales on (which we must not change)."""

    mode: Mode
    source: str
    container_policies: Mapping[str, ContainerPolicy] = field(default_factory=dict)
    hpa_resources: frozenset[str] = frozenset()
    warnings: tuple[str, ...] = ()

    @property
    def sizes(self) -> bool:
        return self.mode != "Off"

    def container_policy(self, container: str) -> ContainerPolicy | None:
        """The VPA policy of this container: its own entry, else the `*` one."""
        return self.container_policies.get(container) or self.container_policies.get("*")


def parse_mode(value: object) -> Mode | None:
    """A mode from a label or annotation value, case-insensitively; None when it is not one."""
    if not isinstance(value, str):
        return None
    return next((mode for mode in MODES if mode.lower() == value.strip().lower()), None)


def _targets(ref: object, refs: Sequence[tuple[str, str]]) -> bool:
    return isinstance(ref, Mapping) and (ref.get("kind"), ref.get("name")) in refs


def _quantities(values: object, where: str) -> dict[str, float]:
    if values is None:
        return {}
    if not isinstance(values, Mapping):
        raise ValueError(f"{where} is not a map")
    found = {}
    for name, text in values.items():
        if name in _PARSE:
            try:
                found[name] = _PARSE[name](text)
            except (ValueError, TypeError, ArithmeticError):
                raise ValueError(f"{where}.{name}: {text!r} is not a quantity") from None
    return found


def container_policies(vpa: Mapping[str, Any]) -> dict[str, ContainerPolicy]:
    """A VPA's containerPolicies by container name (`*` for the default); raises ValueError naming a bad field."""
    policy = (vpa.get("spec") or {}).get("resourcePolicy") or {}
    found = {}
    for index, entry in enumerate(policy.get("containerPolicies") or []):
        where = f"containerPolicies[{index}]"
        if not isinstance(entry, Mapping):
            raise ValueError(f"{where} is not an object")
        mode = entry.get("mode", "Auto")
        values = entry.get("controlledValues")
        resources = entry.get("controlledResources")
        if mode not in ("Auto", "Off"):
            raise ValueError(f"{where}.mode: {mode!r} is not Auto or Off")
        if values not in (None, "RequestsOnly", "RequestsAndLimits"):
            raise ValueError(f"{where}.controlledValues: {values!r} is not RequestsOnly or RequestsAndLimits")
        if resources is not None and not (isinstance(resources, list) and all(isinstance(r, str) for r in resources)):
            raise ValueError(f"{where}.controlledResources is not a list of names")
        found[str(entry.get("containerName") or "*")] = ContainerPolicy(
            mode=mode,
            controlled_resources=None if resources is None else tuple(r for r in resources if r in RESOURCES),
            controlled_values=values,
            min_allowed=_quantities(entry.get("minAllowed"), f"{where}.minAllowed"),
            max_allowed=_quantities(entry.get("maxAllowed"), f"{where}.maxAllowed"),
        )
    return found


def hpa_resources(hpas: Sequence[Mapping[str, Any]], refs: Sequence[tuple[str, str]]) -> frozenset[str]:
    """CPU and memory that HorizontalPodAutoscalers (autoscaling/v2) of the pod's controller scale on; an HPA
    without metrics scales on CPU (its default, 80 % utilisation)."""
    found: set[str] = set()
    for hpa in hpas:
        spec = hpa.get("spec") or {}
        if not _targets(spec.get("scaleTargetRef"), refs):
            continue
        metrics = spec.get("metrics") or []
        if not metrics:
            found.add("cpu")
        for metric in metrics:
            if not isinstance(metric, Mapping):
                continue
            source = metric.get("resource") or metric.get("containerResource") or {}
            if isinstance(source, Mapping) and source.get("name") in RESOURCES:
                found.add(str(source["name"]))
    return frozenset(found)


def _name(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"


def _from_vpa(vpa: Mapping[str, Any], hpa: frozenset[str]) -> OptIn:
    spec = vpa.get("spec") or {}
    update_mode = str((spec.get("updatePolicy") or {}).get("updateMode") or "Auto")
    name = f"VerticalPodAutoscaler {_name(vpa)} (updateMode {update_mode})"
    mode = VPA_UPDATE_MODES.get(update_mode)
    if mode is None:
        return OptIn(
            "Off", name, hpa_resources=hpa, warnings=(f"koord-recommender: {name}: unknown updateMode, treated as Off",)
        )
    try:
        policies = container_policies(vpa)
    except ValueError as error:
        return OptIn("Off", name, hpa_resources=hpa, warnings=(f"koord-recommender: {name}: {error}; treated as Off",))
    return OptIn(mode, name, policies, hpa)


def decide(
    pod: Mapping[str, Any],
    namespace_labels: Mapping[str, str],
    vpas: Sequence[Mapping[str, Any]],
    hpas: Sequence[Mapping[str, Any]],
    default_mode: Mode,
    recommender_name: str,
) -> OptIn:
    """The opt-in of one pod from its labels and annotations, the VPAs and HPAs of its namespace and the namespace's
    labels. Never raises on odd objects: a malformed value is ignored (with a warning) or read as Off."""
    metadata = pod.get("metadata") or {}
    refs = workload_refs(pod)
    hpa = hpa_resources(hpas, refs)
    mine = []
    for vpa in vpas:
        spec = vpa.get("spec") or {}
        if not _targets(spec.get("targetRef"), refs):
            continue
        names = [r.get("name") for r in spec.get("recommenders") or [] if isinstance(r, Mapping)]
        if recommender_name not in names:
            owner = ", ".join(map(str, names)) or "the default recommender"
            return OptIn("Off", f"VerticalPodAutoscaler {_name(vpa)} of {owner}", hpa_resources=hpa)
        mine.append(vpa)
    warnings: list[str] = []
    for source in ("label", "annotation"):
        value = (metadata.get(f"{source}s") or {}).get(MODE_KEY)
        mode = parse_mode(value)
        if mode is not None:
            # The pod's own choice sets the mode; an own VPA's container policies still bound what is changed.
            policies = _from_vpa(mine[0], hpa).container_policies if mine else {}
            return OptIn(mode, f"pod {source} {MODE_KEY}={value}", policies, hpa)
        if value is not None:
            warnings.append(
                f"koord-recommender: pod {source} {MODE_KEY}={value!r} is not one of {', '.join(MODES)}; ignored"
            )
    if mine:
        chosen = _from_vpa(sorted(mine, key=_name)[0], hpa)
        if len(mine) > 1:
            warnings.append(
                f"koord-recommender: {len(mine)} VerticalPodAutoscalers target this pod; using {_name(sorted(mine, key=_name)[0])}"
            )
        return OptIn(chosen.mode, chosen.source, chosen.container_policies, hpa, (*warnings, *chosen.warnings))
    value = namespace_labels.get(MODE_KEY)
    mode = parse_mode(value)
    if mode is not None:
        return OptIn(mode, f"namespace label {MODE_KEY}={value}", hpa_resources=hpa, warnings=tuple(warnings))
    if value is not None:
        warnings.append(
            f"koord-recommender: namespace label {MODE_KEY}={value!r} is not one of {', '.join(MODES)}; ignored"
        )
    return OptIn(default_mode, "default (webhook.default_mode)", hpa_resources=hpa, warnings=tuple(warnings))
