"""The Helm chart in a real control plane (etcd + kube-apiserver with the VPA, Koordinator, cert-manager and
Prometheus Operator CRDs installed):

- every object of every value set is accepted by a server-side dry run (schemas, CRDs, defaulting, admission);
- `helm install` with the two values of the quick start (Prometheus URL, mode) is accepted whole;
- with the chart's own webhook configuration (only its clientConfig pointed at `recommender serve` on 127.0.0.1,
  through `webhook.url`, with the certificate the chart made) and the service run locally with a token of the chart's
  ServiceAccount, an opted-in pod gets our requests and others are left alone;
- `sync` and `cluster-files` do their work with tokens of the chart's accounts, and training's account can do nothing.
There is no kubelet: pods are stored, never run.
"""

from __future__ import annotations

import base64
import functools
import json
import ssl
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from kubernetes import client, config, dynamic
from kubernetes.client.exceptions import ApiException

from recommender.units import cpu_cores_from_quantity, memory_bytes_from_quantity
from tests.conftest import entry_point, make_usage
from tests.integration.server import free_port, serving
from tests.support import permissions
from tests.support.control_plane import ControlPlane
from tests.support.helm import CHART, PROMETHEUS, extra_crd_files, helm, render, values_args

pytestmark = pytest.mark.e2e
NAMESPACE = "koord-recommender"
RELEASE = "koord-recommender"
DAY = 86400
VPA = ("autoscaling.k8s.io", "v1", "verticalpodautoscalers")
#: Namespaces of the opt-in test: by namespace label, by VPA, by pod label, and not at all.
OPTED, BY_VPA, BY_LABEL, ELSEWHERE = "opted", "by-vpa", "by-label", "elsewhere"


@dataclass
class Installed:
    plane: ControlPlane
    home: Path
    work: Path
    install: subprocess.CompletedProcess[str]

    def helm(self, *args: str) -> subprocess.CompletedProcess[str]:
        return helm(*args, "--kubeconfig", str(self.plane.kubeconfig), home=self.home)


@pytest.fixture(scope="module")
def installed(plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """The chart installed as docs/kubernetes.md ("Install with Helm") says: two values."""
    plane.install_crds(extra_crd_files())
    work = tmp_path_factory.mktemp("chart")
    home = work / "helm-home"
    done = helm(
        "install",
        RELEASE,
        str(CHART),
        "--namespace",
        NAMESPACE,
        "--create-namespace",
        "--kubeconfig",
        str(plane.kubeconfig),
        "--set",
        f"prometheus.url={PROMETHEUS}",
        "--set",
        "webhook.mode=Off",
        home=home,
        timeout=180,
    )
    return Installed(plane, home, work, done)


def account_token(plane: ControlPlane, account: str) -> str:
    """A TokenRequest token of `account` in the release namespace: what a pod of it would mount."""
    core = client.CoreV1Api(plane.api())
    token: str = core.create_namespaced_service_account_token(
        account, NAMESPACE, {"spec": {"expirationSeconds": 3600}}
    ).status.token
    return token


def token_kubeconfig(plane: ControlPlane, account: str, path: Path) -> Path:
    """A kubeconfig with a TokenRequest token of `account` in the release namespace: what the pod would mount."""
    token = account_token(plane, account)
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "sa",
                "clusters": [
                    {"name": "e2e", "cluster": {"server": plane.url, "certificate-authority": str(plane.ca.cert_path)}}
                ],
                "users": [{"name": account, "user": {"token": token}}],
                "contexts": [{"name": "sa", "context": {"cluster": "e2e", "user": account}}],
            }
        )
    )
    return path


def test_every_rendered_object_is_accepted_by_the_apiserver(installed: Installed) -> None:
    api = installed.plane.api()
    resources = dynamic.DynamicClient(api).resources
    client.CoreV1Api(api).create_namespace({"metadata": {"name": "chart-dry-run"}})
    kinds: set[str] = set()
    for values in [None, *sorted((CHART / "ci").glob("*-values.yaml"))]:
        for document in render(*([values] if values else []), release="dry-run", namespace="chart-dry-run"):
            resource = resources.get(api_version=document["apiVersion"], kind=document["kind"])
            namespace = document["metadata"].get("namespace") if resource.namespaced else None
            created = resource.create(body=document, namespace=namespace, dry_run="All")
            assert created.metadata.name == document["metadata"]["name"], (values, document["kind"])
            kinds.add(document["kind"])
    assert {
        "Deployment",
        "CronJob",
        "Job",
        "MutatingWebhookConfiguration",
        "Certificate",
        "Issuer",
        "ServiceMonitor",
        "NetworkPolicy",
        "PodDisruptionBudget",
        "PersistentVolumeClaim",
        "Secret",
    } <= kinds


def test_helm_install_with_two_values_is_accepted_whole(installed: Installed) -> None:
    assert installed.install.returncode == 0, installed.install.stderr
    status = json.loads(installed.helm("status", RELEASE, "--namespace", NAMESPACE, "--output", "json").stdout)
    assert status["info"]["status"] == "deployed"
    manifest = [
        d for d in yaml.safe_load_all(installed.helm("get", "manifest", RELEASE, "--namespace", NAMESPACE).stdout) if d
    ]
    resources = dynamic.DynamicClient(installed.plane.api()).resources
    for document in manifest:  # every object of the release is stored in the API server as rendered
        resource = resources.get(api_version=document["apiVersion"], kind=document["kind"])
        stored = resource.get(name=document["metadata"]["name"], namespace=NAMESPACE if resource.namespaced else None)
        assert stored.metadata.labels["app.kubernetes.io/instance"] == RELEASE
    assert {d["kind"] for d in manifest} >= {
        "Deployment",
        "CronJob",
        "Job",
        "MutatingWebhookConfiguration",
        "Secret",
        "ClusterRole",
    }
    serve = next(d for d in manifest if d["kind"] == "Deployment" and d["metadata"]["name"] == RELEASE)
    env = {e["name"]: e.get("value") for e in serve["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["KOORD_RECOMMENDER_WEBHOOK__DEFAULT_MODE"] == "Off"
    assert f"kubectl -n {NAMESPACE} logs -f job/{RELEASE}-first-train" in installed.install.stdout  # NOTES
    assert f"ClusterRole\n{RELEASE}-reader" in installed.install.stdout  # how to get read access


def test_the_training_account_can_do_nothing_in_the_cluster(installed: Installed) -> None:
    assert installed.install.returncode == 0, installed.install.stderr
    kubeconfig = token_kubeconfig(installed.plane, f"{RELEASE}-train", installed.work / "train.kubeconfig")
    core = client.CoreV1Api(config.new_client_from_config(config_file=str(kubeconfig)))
    for call in (
        lambda: core.list_pod_for_all_namespaces(limit=1),
        lambda: core.list_namespaced_secret(NAMESPACE, limit=1),
    ):
        with pytest.raises(ApiException) as refused:
            call()
        assert refused.value.status == 403


@dataclass
class Service:
    installed: Installed
    store: Path
    core: client.CoreV1Api
    custom: client.CustomObjectsApi
    base: str
    verify: ssl.SSLContext


#: What the upgrade of the `service` fixture sets besides the defaults: accounts that read, the ServiceMonitor (its
#: own reader account) and the extender (the cluster-files permissions).
READER, STRANGER = "reader", "stranger"
SECURITY_VALUES: dict[str, Any] = {
    "auth.readers": [{"kind": "ServiceAccount", "name": READER, "namespace": NAMESPACE}],
    "serviceMonitor.enabled": True,
    "extender.enabled": True,
}


def usage(now: int) -> Any:
    """Three days of a workload `web` (container `app`) in each test namespace, ending now."""
    frames = [
        make_usage(workloads=1, pods=2, days=3, start=now - 3 * DAY).assign(
            namespace=ns, workload="web", container="app"
        )
        for ns in (OPTED, BY_VPA, BY_LABEL, ELSEWHERE)
    ]
    import pandas as pd

    return pd.concat(frames, ignore_index=True)


@pytest.fixture(scope="module")
def service(installed: Installed) -> Iterator[Service]:
    """The release upgraded to call a local `recommender serve` (webhook.url, the chart's certificate made valid for
    127.0.0.1), the service started with the chart's Deployment settings and a token of its ServiceAccount."""
    assert installed.install.returncode == 0, installed.install.stderr
    work = installed.work
    now = int(time.time()) // 300 * 300
    usage(now).to_csv(work / "usage.csv", index=False)
    trained = subprocess.run(
        [entry_point(), "train", "--input", str(work / "usage.csv"), "--store", str(work / "store")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert trained.returncode == 0, trained.stderr
    port = free_port()
    upgraded = installed.helm(
        "upgrade",
        RELEASE,
        str(CHART),
        "--namespace",
        NAMESPACE,
        *values_args(
            values={
                "webhook.mode": "Off",
                "webhook.url": f"https://127.0.0.1:{port}/mutate",
                "tls.selfSigned.ipAddresses": ["127.0.0.1"],
                **SECURITY_VALUES,
            }
        ),
    )
    assert upgraded.returncode == 0, upgraded.stderr
    api = installed.plane.api()
    core = client.CoreV1Api(api)
    secret = core.read_namespaced_secret(f"{RELEASE}-tls", NAMESPACE).data
    for name in ("tls.crt", "tls.key", "ca.crt"):
        (work / name).write_bytes(base64.b64decode(secret[name]))
    webhook = client.AdmissionregistrationV1Api(api).read_mutating_webhook_configuration(RELEASE).webhooks[0]
    assert webhook.client_config.url == f"https://127.0.0.1:{port}/mutate" and webhook.client_config.service is None
    assert webhook.client_config.ca_bundle == secret["ca.crt"]  # the chart's CA, as the chart injected it
    deployment = client.AppsV1Api(api).read_namespaced_deployment(RELEASE, NAMESPACE)
    env = {
        e.name: e.value
        for e in deployment.spec.template.spec.containers[0].env
        if e.value is not None and e.name.startswith("KOORD_")
    }
    env = {k: v for k, v in env.items() if not k.startswith("KOORD_RECOMMENDER_EXTENDER__")}  # the sidecar's files
    kubeconfig = token_kubeconfig(installed.plane, RELEASE, work / "serve.kubeconfig")
    env["KOORD_RECOMMENDER_WEBHOOK__KUBECONFIG"] = str(kubeconfig)  # what the pod's mounted token would give it
    # The chart's TokenReview and SubjectAccessReview, asked of this API server with the serving account's token.
    (work / "serve.token").write_text(account_token(installed.plane, RELEASE))
    env["KOORD_RECOMMENDER_AUTH__API_SERVER_URL"] = installed.plane.url
    env["KOORD_RECOMMENDER_AUTH__API_SERVER_CA_FILE"] = str(installed.plane.ca.cert_path)
    env["KOORD_RECOMMENDER_AUTH__SERVICE_ACCOUNT_TOKEN_FILE"] = str(work / "serve.token")
    for account in (READER, STRANGER):
        core.create_namespaced_service_account(NAMESPACE, {"metadata": {"name": account}})
    for namespace, labels in (
        (OPTED, {"koord-recommender.io/mode": "Initial"}),
        (BY_VPA, {}),
        (BY_LABEL, {}),
        (ELSEWHERE, {}),
    ):
        core.create_namespace({"metadata": {"name": namespace, "labels": labels}})
        core.create_namespaced_service_account(
            namespace, {"metadata": {"name": "default"}}
        )  # no controller-manager here
    custom = client.CustomObjectsApi(api)
    custom.create_namespaced_custom_object(
        *VPA[:2],
        BY_VPA,
        VPA[2],
        {
            "apiVersion": "autoscaling.k8s.io/v1",
            "kind": "VerticalPodAutoscaler",
            "metadata": {"name": "web", "namespace": BY_VPA},
            "spec": {
                "targetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
                "recommenders": [{"name": "koord-recommender"}],
                "updatePolicy": {"updateMode": "Initial"},
            },
        },
    )
    verify = ssl.create_default_context(cafile=str(work / "ca.crt"))
    with serving(
        work / "store", work, tls=(work / "tls.crt", work / "tls.key"), verify=verify, env=env, port=port
    ) as base:
        time.sleep(2)  # the webhook configuration's new clientConfig reaches the apiserver's informer
        yield Service(installed, work / "store", core, custom, base, verify)


def deployment_pod(namespace: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A pod as the ReplicaSet of Deployment `web` creates it (stored only: nothing runs it)."""
    return {
        "metadata": {
            "generateName": "web-5d8f7c9b4-",
            "labels": {"pod-template-hash": "5d8f7c9b4", "app": "web", **(labels or {})},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": "web-5d8f7c9b4",
                    "uid": str(uuid.uuid4()),
                    "controller": True,
                }
            ],
        },
        "spec": {
            "containers": [
                {
                    "name": "app",
                    "image": "registry.example/app:1",
                    "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "2Gi"}},
                }
            ]
        },
    }


@functools.cache
def shown(store: Path) -> list[dict[str, Any]]:
    """`recommender show --format json` of the store (it is trained once)."""
    done = subprocess.run(
        [entry_point(), "show", "--store", str(store), "--format", "json"], capture_output=True, text=True, timeout=60
    )
    recommendations: list[dict[str, Any]] = json.loads(done.stdout)["recommendations"]
    return recommendations


def target(store: Path, namespace: str) -> dict[str, Any]:
    return next(r for r in shown(store) if r["namespace"] == namespace)


def test_opted_in_pods_get_our_requests_and_others_are_left_alone(service: Service) -> None:
    for namespace, labels in ((OPTED, None), (BY_VPA, None), (BY_LABEL, {"koord-recommender.io/mode": "Initial"})):
        pod = service.core.create_namespaced_pod(namespace, deployment_pod(namespace, labels))
        rec = target(service.store, namespace)
        requests = pod.spec.containers[0].resources.requests
        assert cpu_cores_from_quantity(requests["cpu"]) == pytest.approx(rec["cpu"]["target"], abs=0.001), namespace
        assert memory_bytes_from_quantity(requests["memory"]) == pytest.approx(rec["memory"]["target"], rel=0.01), (
            namespace
        )
        applied = json.loads(pod.metadata.annotations["koord-recommender.io/applied"])  # the audit annotation
        assert applied["mode"] == "Initial", (namespace, applied)
    untouched = service.core.create_namespaced_pod(ELSEWHERE, deployment_pod(ELSEWHERE))
    assert untouched.spec.containers[0].resources.requests == {"cpu": "1", "memory": "1Gi"}
    assert not {"koord-recommender.io/applied", "koord-recommender.io/changes"} & set(
        untouched.metadata.annotations or {}
    )


def test_sync_writes_vpa_status_with_the_sync_account(service: Service) -> None:
    kubeconfig = token_kubeconfig(
        service.installed.plane, f"{RELEASE}-sync", service.installed.work / "sync.kubeconfig"
    )
    synced = subprocess.run(
        [entry_point(), "sync", "--once", "--store", str(service.store), "--kubeconfig", str(kubeconfig)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert synced.returncode == 0, synced.stderr
    vpa = service.custom.get_namespaced_custom_object(*VPA[:2], BY_VPA, VPA[2], "web")
    (container,) = vpa["status"]["recommendation"]["containerRecommendations"]
    assert container["containerName"] == "app"
    assert cpu_cores_from_quantity(container["target"]["cpu"]) == pytest.approx(
        target(service.store, BY_VPA)["cpu"]["target"], abs=0.001
    )


def test_cluster_files_lists_pods_and_nodes_with_the_serving_account(service: Service) -> None:
    kubeconfig = token_kubeconfig(service.installed.plane, RELEASE, service.installed.work / "serve-2.kubeconfig")
    pods, nodes = service.installed.work / "pods.json", service.installed.work / "nodes.json"
    listed = subprocess.run(
        [
            entry_point(),
            "cluster-files",
            "--once",
            "--kubeconfig",
            str(kubeconfig),
            "--pods-file",
            str(pods),
            "--nodes-file",
            str(nodes),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert listed.returncode == 0, listed.stderr
    assert json.loads(nodes.read_text())["items"] == []  # no nodes in this control plane, but the list was allowed
    assert isinstance(json.loads(pods.read_text())["items"], list)


def test_the_api_answers_only_the_reader_role(service: Service) -> None:
    """The chart's defaults: no token 401, an account bound to the reader role (auth.readers) 200, an account
    without it 403; the ServiceMonitor's account scrapes /metrics; probes stay open."""
    plane = service.installed.plane
    with httpx.Client(base_url=service.base, verify=service.verify, timeout=30) as http:

        def get(path: str, account: str | None = None) -> int:
            headers = {"Authorization": f"Bearer {account_token(plane, account)}"} if account else {}
            return http.get(path, headers=headers).status_code

        assert get("/api/v1/recommendations") == 401 and get("/metrics") == 401
        assert get("/api/v1/recommendations", READER) == 200
        assert get("/api/v1/recommendations", STRANGER) == 403
        assert get("/metrics", f"{RELEASE}-metrics") == 200  # the ServiceMonitor's identity
        assert get("/healthz") == 200 and get("/readyz") == 200


def test_every_account_may_do_exactly_what_the_docs_say(service: Service) -> None:
    """What the API server says each of the release's accounts may do (SelfSubjectRulesReview with its own token,
    as `kubectl auth can-i --list`), beyond what any account may, is docs/security.md's table for these values."""
    installed = service.installed

    def allowed(account: str) -> set[tuple[str, str]]:
        kubeconfig = token_kubeconfig(installed.plane, account, installed.work / f"{account}-rules.kubeconfig")
        api = config.new_client_from_config(config_file=str(kubeconfig))
        review = client.AuthorizationV1Api(api).create_self_subject_rules_review({"spec": {"namespace": NAMESPACE}})
        status = api.sanitize_for_serialization(review.status)
        rules = [*status.get("resourceRules", []), *status.get("nonResourceRules", [])]
        return {grant for rule in rules for grant in permissions.rule_grants(rule)}

    baseline = allowed(STRANGER)  # discovery, self-reviews: what every authenticated account may
    documented = permissions.documented({key: value for key, value in SECURITY_VALUES.items() if "." in key})
    accounts = [RELEASE, f"{RELEASE}-sync", f"{RELEASE}-live", f"{RELEASE}-train", f"{RELEASE}-metrics"]
    found = {account: allowed(account) - baseline for account in accounts}
    assert {a: g for a, g in found.items() if g} == documented
    assert found[f"{RELEASE}-train"] == set()


def test_uninstall_keeps_the_store_and_a_reinstall_adopts_it(service: Service) -> None:
    """Last in this module: the release goes away (the store's claim and the first training's Job stay, on purpose),
    and installing again takes them back."""
    installed = service.installed
    removed = installed.helm("uninstall", RELEASE, "--namespace", NAMESPACE)
    assert removed.returncode == 0, removed.stderr
    api = installed.plane.api()
    assert client.CoreV1Api(api).read_namespaced_persistent_volume_claim(f"{RELEASE}-store", NAMESPACE)
    assert client.BatchV1Api(api).read_namespaced_job(f"{RELEASE}-first-train", NAMESPACE)
    with pytest.raises(ApiException) as gone:
        client.AdmissionregistrationV1Api(api).read_mutating_webhook_configuration(RELEASE)
    assert gone.value.status == 404
    again = installed.helm("install", RELEASE, str(CHART), "--namespace", NAMESPACE, *values_args())
    assert again.returncode == 0, again.stderr
    assert client.AdmissionregistrationV1Api(api).read_mutating_webhook_configuration(RELEASE)
