"""The Helm chart, rendered by a real helm (scripts/build-helm.sh): lint, every object of every value set valid
against the Kubernetes schemas or its CRD's published schema, and what each value does to the objects."""

from __future__ import annotations

import base64
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import padding

from tests.support import permissions
from tests.support.control_plane import K8S_VERSION, crd_files
from tests.support.helm import CHART, REPO, extra_crd_files, helm, helm_binary, render, values_args

VALUE_SETS = sorted((CHART / "ci").glob("*-values.yaml"))


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def one(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in by_kind(objects, kind) if name is None or o["metadata"]["name"] == name]
    assert len(found) == 1, f"{len(found)} {kind} {name or ''}"
    return found[0]


def pod_specs(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every pod template, by the name of the object holding it."""
    specs = {}
    for o in objects:
        spec = o.get("spec", {})
        template = spec.get("template") or spec.get("jobTemplate", {}).get("spec", {}).get("template")
        if template:
            specs[o["metadata"]["name"]] = template["spec"]
    return specs


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) -> openAPIV3Schema, from the CRDs the control plane and helm caches hold."""
    schemas = {}
    for path in [*crd_files(), *extra_crd_files()]:
        for crd in yaml.safe_load_all(path.read_text()):
            if crd and crd.get("kind") == "CustomResourceDefinition":
                for version in crd["spec"]["versions"]:
                    key = (f"{crd['spec']['group']}/{version['name']}", crd["spec"]["names"]["kind"])
                    schemas[key] = version["schema"]["openAPIV3Schema"]
    return schemas


@pytest.fixture(scope="module")
def default() -> list[dict[str, Any]]:
    return render()


def test_helm_lint_passes_for_the_defaults_and_every_value_set() -> None:
    for files in [[], *[[path] for path in VALUE_SETS]]:
        linted = helm("lint", "--strict", str(CHART), *values_args(*files))
        assert linted.returncode == 0, f"{files}: {linted.stdout}{linted.stderr}"


@pytest.mark.parametrize("values", [None, *VALUE_SETS], ids=["default", *[p.stem for p in VALUE_SETS]])
def test_every_rendered_object_is_valid(values: Path | None) -> None:
    objects = render(*([values] if values else []))
    schemas = crd_schemas()
    for o in objects:
        if (o["apiVersion"], o["kind"]) in schemas:  # cert-manager, Prometheus Operator: their published CRDs
            jsonschema.validate(o, schemas[(o["apiVersion"], o["kind"])])
        else:
            kubernetes_validate.validate(o, K8S_VERSION, strict=True)


def test_a_missing_prometheus_url_is_an_error_naming_it() -> None:
    rendered = helm("template", "kr", str(CHART))
    assert rendered.returncode != 0
    assert "prometheus.url is required" in rendered.stderr.splitlines()[0]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"tls.mode": "letsencrypt"}, "at '/tls/mode': value must be one of 'selfSigned', 'certManager', 'secret'"),
        ({"webhook.mode": "On"}, "at '/webhook/mode': value must be one of 'Off', 'Initial', 'Auto'"),
        ({"webhok.mode": "Off"}, "additional properties 'webhok' not allowed"),
        ({"webhook.url": "http://10.0.0.1/mutate"}, "at '/webhook/url'"),
    ],
)
def test_bad_values_are_refused_naming_the_value(values: dict[str, Any], message: str) -> None:
    rendered = helm("template", "kr", str(CHART), *values_args(values=values))
    assert rendered.returncode != 0 and message in rendered.stderr, rendered.stderr


def test_the_webhook_fails_open_and_skips_system_and_own_namespaces(default: list[dict[str, Any]]) -> None:
    webhook = one(default, "MutatingWebhookConfiguration")["webhooks"][0]
    assert webhook["failurePolicy"] == "Ignore" and webhook["sideEffects"] == "None"
    assert webhook["rules"] == [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["CREATE"],
            "resources": ["pods"],
            "scope": "Namespaced",
        }
    ]
    (expression,) = webhook["namespaceSelector"]["matchExpressions"]
    assert expression["key"] == "kubernetes.io/metadata.name" and expression["operator"] == "NotIn"
    assert set(expression["values"]) == {"kube-system", "kube-node-lease", "koord-recommender"}
    assert webhook["clientConfig"]["service"] == {
        "name": "koord-recommender",
        "namespace": "koord-recommender",
        "path": "/mutate",
        "port": 443,
    }
    custom = render(
        values={
            "webhook.namespaceSelector": {"matchLabels": {"team": "a"}},
            "webhook.url": "https://10.1.2.3:8443/mutate",
        }
    )
    webhook = one(custom, "MutatingWebhookConfiguration")["webhooks"][0]
    assert webhook["namespaceSelector"] == {"matchLabels": {"team": "a"}}
    assert webhook["clientConfig"]["url"] == "https://10.1.2.3:8443/mutate" and "service" not in webhook["clientConfig"]


@pytest.mark.parametrize(
    ("values", "mode", "dry_run"),
    [({}, "Off", "false"), ({"webhook.mode": "Initial", "webhook.dryRun": True}, "Initial", "true")],
)
def test_the_webhook_mode_reaches_the_server(values: dict[str, Any], mode: str, dry_run: str) -> None:
    serve = pod_specs(render(values=values))["koord-recommender"]["containers"][0]
    env = env_of(serve)
    assert (
        env["KOORD_RECOMMENDER_WEBHOOK__DEFAULT_MODE"] == mode and env["KOORD_RECOMMENDER_WEBHOOK__DRY_RUN"] == dry_run
    )


#: The values that switch a role's permissions on or off (docs/security.md's "when" column).
FEATURES = (
    "auth.tokenReview",
    "webhook.enabled",
    "extender.enabled",
    "sync.enabled",
    "sync.writeVpaCheckpoints",
    "live.enabled",
    "serviceMonitor.enabled",
)


def feature_combinations() -> list[dict[str, bool]]:
    """The defaults, each feature flipped from them, all on, all off."""
    defaults = {f: bool(permissions.value_at(permissions.chart_defaults(), f)) for f in FEATURES}
    flipped = [{**defaults, f: not defaults[f]} for f in FEATURES]
    return [defaults, *flipped, dict.fromkeys(FEATURES, True), dict.fromkeys(FEATURES, False)]


@pytest.mark.parametrize(
    "features", feature_combinations(), ids=lambda f: "+".join(k for k, v in f.items() if v) or "none"
)
def test_every_account_gets_exactly_the_documented_permissions(features: dict[str, bool]) -> None:
    objects = render(values=dict(features))
    assert permissions.rendered(objects) == permissions.documented(features)
    train = one(objects, "ServiceAccount", "koord-recommender-train")
    assert train["automountServiceAccountToken"] is False
    if features["serviceMonitor.enabled"]:
        assert one(objects, "ServiceAccount", "koord-recommender-metrics")["automountServiceAccountToken"] is False


def test_the_reader_role_is_bound_to_the_named_readers_and_checked_by_the_server() -> None:
    readers = [{"kind": "Group", "name": "sre", "apiGroup": "rbac.authorization.k8s.io"}]
    objects = render(values={"auth.readers": readers, "serviceMonitor.enabled": True})
    path = "/koord-recommender.io/koord-recommender/koord-recommender"
    assert one(objects, "ClusterRole", "koord-recommender-reader")["rules"] == [
        {"nonResourceURLs": [path], "verbs": ["get"]}
    ]
    binding = one(objects, "ClusterRoleBinding", "koord-recommender-reader")
    assert binding["subjects"] == [
        *readers,
        {"kind": "ServiceAccount", "name": "koord-recommender-metrics", "namespace": "koord-recommender"},
    ]
    env = env_of(pod_specs(objects)["koord-recommender"]["containers"][0])
    assert env["KOORD_RECOMMENDER_AUTH__TOKEN_REVIEW"] == "true"
    assert env["KOORD_RECOMMENDER_AUTH__AUTHORIZATION_PATH"] == path
    monitor = one(objects, "ServiceMonitor")["spec"]["endpoints"][0]
    assert monitor["authorization"]["credentials"] == {"name": "koord-recommender-metrics-token", "key": "token"}
    token = one(objects, "Secret", "koord-recommender-metrics-token")
    assert token["type"] == "kubernetes.io/service-account-token"
    assert token["metadata"]["annotations"]["kubernetes.io/service-account.name"] == "koord-recommender-metrics"
    bound = {b["metadata"]["name"] for b in by_kind(render(), "ClusterRoleBinding")}
    assert "koord-recommender-reader" not in bound  # by default nobody reads until bound


def test_a_token_file_and_a_client_ca_are_mounted_where_the_server_reads_them() -> None:
    objects = render(
        values={
            "auth.tokenSecret.name": "api-token",
            "auth.clientCA.configMapName": "control-plane-ca",
            "auth.clientCA.names": ["kube-apiserver", "kube-scheduler"],
        }
    )
    serve = pod_specs(objects)["koord-recommender"]
    env = env_of(serve["containers"][0])
    assert env["KOORD_RECOMMENDER_AUTH__TOKEN_FILE"] == "/etc/koord-recommender/auth/token"
    assert env["KOORD_RECOMMENDER_SERVE__CLIENT_CA_FILE"] == "/etc/koord-recommender/client-ca/ca.crt"
    assert env["KOORD_RECOMMENDER_SERVE__CLIENT_NAMES"] == '["kube-apiserver","kube-scheduler"]'
    volumes = {v["name"]: v for v in serve["volumes"]}
    assert volumes["auth-token"]["secret"] == {"secretName": "api-token", "items": [{"key": "token", "path": "token"}]}
    assert volumes["client-ca"]["configMap"] == {
        "name": "control-plane-ca",
        "items": [{"key": "ca.crt", "path": "ca.crt"}],
    }
    mounts = {m["name"]: m["mountPath"] for m in serve["containers"][0]["volumeMounts"]}
    assert (
        mounts["auth-token"] == "/etc/koord-recommender/auth"
        and mounts["client-ca"] == "/etc/koord-recommender/client-ca"
    )
    default_env = env_of(pod_specs(render())["koord-recommender"]["containers"][0])
    assert not {"KOORD_RECOMMENDER_AUTH__TOKEN_FILE", "KOORD_RECOMMENDER_SERVE__CLIENT_CA_FILE"} & set(default_env)
    off = env_of(pod_specs(render(values={"webhook.enabled": False}))["koord-recommender"]["containers"][0])
    assert off["KOORD_RECOMMENDER_WEBHOOK__WATCH_API"] == "off"  # no opt-in watches without their permission


def test_a_single_node_store_keeps_its_pods_beside_serve_and_drops_the_budget(default: list[dict[str, Any]]) -> None:
    claim = one(default, "PersistentVolumeClaim")
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert claim["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    for name, spec in pod_specs(default).items():
        term = spec["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
        assert term["topologyKey"] == "kubernetes.io/hostname", name
        assert term["labelSelector"]["matchLabels"]["app.kubernetes.io/component"] == "serve", name
    assert set(pod_specs(default)) == {
        "koord-recommender",
        "koord-recommender-sync",
        "koord-recommender-live",
        "koord-recommender-train",
        "koord-recommender-first-train",
    }
    assert not by_kind(default, "PodDisruptionBudget")
    shared = render(values={"store.pvc.accessMode": "ReadWriteMany"})
    assert all("affinity" not in spec for spec in pod_specs(shared).values())
    assert one(shared, "PodDisruptionBudget")["spec"]["minAvailable"] == 1


def test_an_object_store_replaces_the_volume() -> None:
    objects = render(CHART / "ci" / "object-store-values.yaml")
    assert not by_kind(objects, "PersistentVolumeClaim")
    for name, spec in pod_specs(objects).items():
        container = spec["containers"][0]
        assert "--store=s3://models/koord-recommender" in container["args"], name
        assert container["envFrom"] == [{"secretRef": {"name": "koord-recommender-s3"}}], name
        assert all(v["name"] != "store" for v in spec["volumes"]), name
    train = pod_specs(objects)["koord-recommender-train"]["containers"][0]
    assert "--bearer-token-file=/etc/koord-recommender/prometheus/token/token" in train["args"]
    assert "--ca-file=/etc/koord-recommender/prometheus/ca/ca.crt" in train["args"]
    env = env_of(train)
    assert yaml.safe_load(env["KOORD_RECOMMENDER_PROMETHEUS__HEADERS"]) == {"X-Scope-OrgID": "team-a"}
    assert yaml.safe_load(env["KOORD_RECOMMENDER_PROMETHEUS__EXTRA_LABELS"]) == {"cluster": "prod"}


def test_training_runs_at_install_and_on_schedule(default: list[dict[str, Any]]) -> None:
    cron = one(default, "CronJob")
    first = one(default, "Job", "koord-recommender-first-train")
    assert first["spec"]["template"] == cron["spec"]["jobTemplate"]["spec"]["template"]
    assert first["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    args = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:3] == [
        "train",
        "--prometheus-url=http://prometheus-operated.monitoring.svc:9090",
        "--store=/var/lib/koord-recommender/store",
    ]
    assert "--incremental" in args and "--history=14d" in args
    assert cron["spec"]["schedule"] == "17 3 * * *" and cron["spec"]["concurrencyPolicy"] == "Forbid"
    upgraded = helm("template", "koord-recommender", str(CHART), "--is-upgrade", *values_args())
    assert upgraded.returncode == 0 and "first-train" not in upgraded.stdout.replace("logs -f job/", "")
    assert not by_kind(render(values={"train.firstRun": False}), "Job")


def test_basic_auth_and_the_extender() -> None:
    objects = render(CHART / "ci" / "extender-values.yaml")
    serve = pod_specs(objects)["koord-recommender"]
    assert [c["name"] for c in serve["containers"]] == ["serve", "cluster-files"]
    assert (
        env_of(serve["containers"][0])["KOORD_RECOMMENDER_EXTENDER__PODS_FILE"]
        == "/var/run/koord-recommender/cluster/pods.json"
    )
    train = pod_specs(objects)["koord-recommender-train"]
    env = env_of(train["containers"][0])
    assert env["KOORD_RECOMMENDER_PROMETHEUS__BASIC_AUTH_USERNAME"] == {
        "secretKeyRef": {"name": "prometheus-basic-auth", "key": "username"}
    }
    assert (
        env["KOORD_RECOMMENDER_PROMETHEUS__BASIC_AUTH_PASSWORD_FILE"]
        == "/etc/koord-recommender/prometheus/basic-auth/password"
    )
    volumes = {v["name"]: v for v in train["volumes"]}
    assert volumes["prometheus-ca"]["secret"] == {
        "secretName": "prometheus-tls",
        "items": [{"key": "ca.pem", "path": "ca.crt"}],
    }
    assert [c["name"] for c in pod_specs(render())["koord-recommender"]["containers"]] == ["serve"]


def test_the_service_monitor_carries_the_selected_release_label() -> None:
    objects = render(CHART / "ci" / "servicemonitor-values.yaml")
    monitor = one(objects, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["spec"]["endpoints"][0]["authorization"]["credentials"] == {
        "name": "koord-recommender-metrics-token",
        "key": "token",
    }
    policy = one(objects, "NetworkPolicy")
    assert policy["spec"]["ingress"][0]["from"][0] == {"ipBlock": {"cidr": "10.0.0.0/24"}}
    assert not by_kind(render(), "ServiceMonitor") and not by_kind(render(), "NetworkPolicy")


def test_cert_manager_issues_and_injects_the_certificate() -> None:
    objects = render(CHART / "ci" / "cert-manager-values.yaml")
    certificate = one(objects, "Certificate")
    assert certificate["spec"]["secretName"] == "koord-recommender-tls"
    assert certificate["spec"]["dnsNames"][0] == "koord-recommender.koord-recommender.svc"
    assert certificate["spec"]["issuerRef"] == {"kind": "Issuer", "name": "koord-recommender-selfsigned"}
    assert one(objects, "Issuer")["spec"] == {"selfSigned": {}}
    webhook = one(objects, "MutatingWebhookConfiguration")
    assert webhook["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == "koord-recommender/koord-recommender"
    assert "caBundle" not in webhook["webhooks"][0]["clientConfig"] and not by_kind(objects, "Secret")
    own = render(CHART / "ci" / "issuer-values.yaml")
    assert not by_kind(own, "Issuer") and one(own, "Certificate")["spec"]["issuerRef"]["kind"] == "ClusterIssuer"


def test_the_self_signed_certificate_is_for_the_service_and_signed_by_the_webhook_ca(
    default: list[dict[str, Any]],
) -> None:
    secret = one(default, "Secret", "koord-recommender-tls")
    assert secret["type"] == "kubernetes.io/tls"
    leaf = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    ca_bundle = one(default, "MutatingWebhookConfiguration")["webhooks"][0]["clientConfig"]["caBundle"]
    ca = x509.load_pem_x509_certificate(base64.b64decode(ca_bundle))
    assert ca_bundle == secret["data"]["ca.crt"]
    names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert "koord-recommender.koord-recommender.svc" in names
    public_key = ca.public_key()
    public_key.verify(leaf.signature, leaf.tbs_certificate_bytes, padding.PKCS1v15(), leaf.signature_hash_algorithm)  # type: ignore[union-attr,arg-type]


def test_workloads_run_hardened_with_requests_and_memory_limits(default: list[dict[str, Any]]) -> None:
    for name, spec in pod_specs(render(CHART / "ci" / "extender-values.yaml")).items():
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        for container in spec["containers"]:
            context = container["securityContext"]
            assert context["readOnlyRootFilesystem"] is True and context["allowPrivilegeEscalation"] is False, name
            assert container["resources"]["requests"] and container["resources"]["limits"]["memory"], name
    assert all(o["metadata"].get("namespace", "koord-recommender") == "koord-recommender" for o in default)


def test_the_kustomize_base_is_the_chart_rendered() -> None:
    checked = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "render-base.py"), "--check", "--helm", str(helm_binary())],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert checked.returncode == 0, checked.stderr


def test_without_go_the_helm_build_says_so_and_exits_3(tmp_path: Path) -> None:
    """make test tolerates exit 3 (no Go here); the chart tests then skip with that reason."""
    if shutil.which("go", path="/usr/bin:/bin"):
        pytest.skip("Go is installed in /usr/bin here: no PATH without it to try")
    built = subprocess.run(
        ["bash", str(REPO / "scripts" / "build-helm.sh")],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "KOORD_E2E_CACHE": str(tmp_path / "cache")},
    )
    assert built.returncode == 3, built.stderr
    assert built.stderr.strip().splitlines() == [
        "Go is missing: install Go >= 1.26 from https://go.dev/dl/ (Debian bookworm's golang is 1.19, too old; any Go "
        ">= 1.21 fetches the newer toolchain itself) to build helm"
    ]


def test_the_live_loop_runs_leader_elected_with_its_lease_and_the_prometheus_access_of_training() -> None:
    objects = render(
        values={
            "live.replicas": 2,
            "live.interval": "30s",
            "prometheus.bearerToken.secretName": "prom-token",
            "prometheus.headers": {"X-Scope-OrgID": "team-a"},
        }
    )
    live = one(objects, "Deployment", "koord-recommender-live")
    assert live["spec"]["replicas"] == 2
    pod = live["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["image"].endswith("-train")  # it fits: the training libraries
    assert container["args"] == ["live", "--store=/var/lib/koord-recommender/store", "--interval=30s"]
    env = env_of(container)
    assert env["KOORD_RECOMMENDER_PROMETHEUS__URL"] == "http://prometheus-operated.monitoring.svc:9090"
    assert env["KOORD_RECOMMENDER_PROMETHEUS__BEARER_TOKEN_FILE"] == "/etc/koord-recommender/prometheus/token/token"
    assert yaml.safe_load(env["KOORD_RECOMMENDER_PROMETHEUS__HEADERS"]) == {"X-Scope-OrgID": "team-a"}
    assert env["KOORD_RECOMMENDER_LIVE__LEASE_NAME"] == "koord-recommender-live"
    store = next(m for m in container["volumeMounts"] if m["name"] == "store")
    assert not store.get("readOnly"), "the loop writes its updates and checkpoint into the store"
    assert {v["name"] for v in pod["volumes"]} >= {"store", "tmp", "prometheus-token"}
    assert pod["serviceAccountName"] == "koord-recommender-live"
    role = one(objects, "Role", "koord-recommender-live")
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": ["koord-recommender-live"],
            "verbs": ["get", "update"],
        },
    ]
    binding = one(objects, "RoleBinding", "koord-recommender-live")
    assert binding["subjects"][0]["name"] == "koord-recommender-live"
    assert not [o for o in render(values={"live.enabled": False}) if o["metadata"]["name"] == "koord-recommender-live"]


def test_more_than_two_live_replicas_are_refused() -> None:
    rendered = helm("template", "kr", str(CHART), *values_args(values={"live.replicas": 3}))
    assert rendered.returncode != 0 and "at '/live/replicas'" in rendered.stderr, rendered.stderr
