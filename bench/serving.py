"""Benchmarks of the three consumers over TLS on loopback, each next to a bare endpoint in the same run.

A rig trains a model version on the bundled Google 2019 trace, makes a CA and a server certificate (trustme),
writes a cluster of `--nodes` nodes with 4 pods each for the extender, and starts two servers with the same
uvicorn, certificate and log level: `recommender serve` and `bench.echo` (a bare ASGI app that echoes the body).
The load generator (`bench.load`) runs as a separate process against each in turn, with the same body.

- webhook: realistic AdmissionReviews (a Deployment's pod as the API server sends it, two containers with env,
  probes and mounts, about 5 KB); throughput
  closed loop, and latency at a fixed 500 reviews/s (open loop).
- extender: prioritize with 1,000 and 5,000 candidate node names (nodeCacheCapable), one call at a time: latency
  and each server's CPU per call with the names in a new order each call, as kube-scheduler's parallel filter sends
  them (the headline), and with the same list each call (`same`: a list the extender remembers).
- rest: GET of one workload container's recommendation (the 288-step lines), against a GET of as many bytes.
- isolation: 500 small reviews/s and /healthz probes while a 1 MB review (200 containers with env, or 4,300 bare
  containers) arrives every second; the p99 of the small reviews and of the probes, against the bare endpoint under the same load.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from models.store import ModelStore  # noqa: E402
from recommender.optin import MODE_KEY  # noqa: E402
from tests import k8s  # noqa: E402
from tests.integration.server import free_port, started, tls_files  # noqa: E402

BUNDLED = REPO / "data" / "google-2019" / "usage.csv.gz"
#: The opt-in label of the reviews' pod templates: the webhook's default is Off, and what it costs an opted-in pod
#: (a patch) is what is measured.
OPT_IN = {MODE_KEY: "Auto"}


@dataclass
class Rig:
    ours: str
    echo: str
    ca_file: Path
    workdir: Path
    recommendations: list[Any]


def _cluster(workdir: Path, recommendations: list[Any], nodes: int) -> dict[str, str]:
    """Nodes and pods files: `nodes` nodes of 64 cores, 4 pods each from the learned workloads."""
    node_items = [k8s.node(f"node-{i:05d}", cpu="64", memory="256Gi") for i in range(nodes)]
    pods = []
    for i in range(nodes * 4):
        rec = recommendations[i % len(recommendations)]
        pod = k8s.pod(
            "deployment", rec.workload, [k8s.container(rec.container, {"requests": {"cpu": "1", "memory": "1Gi"}})]
        )
        pods.append(k8s.running(pod, rec.namespace, f"node-{i % nodes:05d}", f"{rec.workload}-{i}"))
    (workdir / "nodes.json").write_text(json.dumps(k8s.listing("NodeList", node_items)))
    (workdir / "pods.json").write_text(json.dumps(k8s.listing("PodList", pods)))
    return {
        "KOORD_RECOMMENDER_EXTENDER__NODES_FILE": str(workdir / "nodes.json"),
        "KOORD_RECOMMENDER_EXTENDER__PODS_FILE": str(workdir / "pods.json"),
    }


@contextmanager
def rig(nodes: int = 5000) -> Iterator[Rig]:
    with tempfile.TemporaryDirectory() as scratch, ExitStack() as stack:
        workdir = Path(scratch)
        script = str(Path(sys.executable).parent / "recommender")
        subprocess.run(
            [script, "train", "--input", str(BUNDLED), "--store", str(workdir / "store")],
            check=True,
            capture_output=True,
            timeout=600,
        )
        recommendations = ModelStore(workdir / "store").load().recommendations.recommendations
        _, cert, key, ca_file = tls_files(workdir)
        env = {
            "KOORD_RECOMMENDER_WEBHOOK__MAX_MODEL_AGE_SECONDS": str(10**10),
            **_cluster(workdir, recommendations, nodes),
        }
        ours_port, echo_port = free_port(), free_port()
        ours, echo = f"https://127.0.0.1:{ours_port}", f"https://127.0.0.1:{echo_port}"
        tls = ["--tls-cert-file", str(cert), "--tls-key-file", str(key)]
        serve = [script, "serve", "--store", str(workdir / "store"), "--port", str(ours_port), *tls]
        stack.enter_context(started(serve, ours, cwd=REPO, verify=str(ca_file), env=env))
        echo_command = [
            sys.executable,
            "-m",
            "uvicorn",
            "bench.echo:app",
            "--port",
            str(echo_port),
            "--log-level",
            "info",
            "--ssl-certfile",
            str(cert),
            "--ssl-keyfile",
            str(key),
        ]
        stack.enter_context(started(echo_command, echo, cwd=REPO, verify=str(ca_file), ready_path="/"))
        yield Rig(ours, echo, ca_file, workdir, recommendations)


def load(
    rig: Rig,
    url: str,
    body: bytes | list[bytes] | None,
    *,
    method: str = "POST",
    requests: int,
    concurrency: int,
    rate: float = 0,
    time_cap: float = 30,
    headers: tuple[str, ...] = (),
) -> dict[str, Any]:
    """One run of the load generator in its own process; a list of bodies is sent one a request, in turn."""
    command = [
        sys.executable,
        "-m",
        "bench.load",
        "--url",
        url,
        "--method",
        method,
        "--ca",
        str(rig.ca_file),
        "--requests",
        str(requests),
        "--concurrency",
        str(concurrency),
        "--rate",
        str(rate),
        "--time-cap",
        str(time_cap),
    ]
    if body is not None:
        path = rig.workdir / f"body-{time.monotonic_ns()}.json"
        path.write_bytes(b"\n".join(body) if isinstance(body, list) else body)
        command += ["--bodies" if isinstance(body, list) else "--body", str(path)]
    for header in headers:
        command += ["--header", header]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=time_cap + 60, check=True)
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def _pair(rig: Rig, path: str, body: bytes | list[bytes], **kwargs: Any) -> dict[str, Any]:
    ours = load(rig, rig.ours + path, body, **kwargs)
    reference = load(rig, rig.echo + "/echo", body, **kwargs)
    return {"ours": ours, "reference": reference}


def _realistic(container: dict[str, Any]) -> dict[str, Any]:
    """What a production container spec carries besides resources: env, ports, probes, mounts."""
    probe = {
        "httpGet": {"path": "/healthz", "port": 8080, "scheme": "HTTP"},
        "periodSeconds": 10,
        "timeoutSeconds": 1,
        "successThreshold": 1,
        "failureThreshold": 3,
    }
    return {
        **container,
        "env": [{"name": f"SETTING_{i}", "value": f"value-{i}"} for i in range(8)]
        + [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}}],
        "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
        "livenessProbe": probe,
        "readinessProbe": probe,
        "volumeMounts": [
            {
                "name": "kube-api-access-abcde",
                "readOnly": True,
                "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
            }
        ],
    }


def histogram(rig: Rig, route: str) -> dict[float, float]:
    """Cumulative counts per bucket edge of our app's own latency histogram for `route`."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(rig.ours + "/metrics", verify=str(rig.ca_file)).text
    buckets: dict[float, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name == "koord_recommender_http_request_duration_seconds":
            for sample in family.samples:
                if sample.name.endswith("_bucket") and sample.labels.get("route") == route:
                    edge = float(sample.labels["le"])
                    buckets[edge] = buckets.get(edge, 0.0) + sample.value
    return buckets


def server_side(after: dict[float, float], before: dict[float, float]) -> dict[str, Any]:
    """p50/p99 of the time spent inside our app between two histogram readings (no queueing in the kernel or the
    event loop): the upper edge of the bucket where the share is reached."""
    counts = {edge: after[edge] - before.get(edge, 0.0) for edge in after}
    edges = sorted(counts)
    total = counts[edges[-1]] if edges else 0.0

    def quantile(q: float) -> float:
        return next(edge for edge in edges if counts[edge] >= q * total) * 1000

    return {"requests": int(total), "p50_ms_at_most": quantile(0.5), "p99_ms_at_most": quantile(0.99)}


def realistic_review(rig: Rig) -> bytes:
    """The AdmissionReview of a Deployment's pod as the API server sends it (about 5 KB), for a learned workload."""
    rec = next(r for r in rig.recommendations if r.cpu is not None and r.memory is not None)
    resources = {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"cpu": "2", "memory": "4Gi"}}
    containers = [k8s.container(rec.container, resources), k8s.container("log-shipper", {"requests": {"cpu": "50m"}})]
    pod = k8s.pod("deployment", rec.workload, [_realistic(c) for c in containers], labels=OPT_IN)
    pod["spec"]["volumes"] = [
        {
            "name": "kube-api-access-abcde",
            "projected": {
                "defaultMode": 420,
                "sources": [
                    {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                    {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                    {
                        "downwardAPI": {
                            "items": [
                                {
                                    "path": "namespace",
                                    "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"},
                                }
                            ]
                        }
                    },
                ],
            },
        }
    ]
    return json.dumps(k8s.review(pod, rec.namespace)).encode()


def bench_webhook(rig: Rig, requests: int) -> dict[str, Any]:
    body = realistic_review(rig)
    check = httpx.post(rig.ours + "/mutate", content=body, verify=str(rig.ca_file)).json()["response"]
    assert "patch" in check, check  # the benchmark measures real patches
    throughput = _pair(rig, "/mutate", body, requests=requests, concurrency=8)
    before = histogram(rig, "/mutate")
    latency = _pair(rig, "/mutate", body, requests=min(requests, 2500), concurrency=8, rate=500)
    return {
        "body_bytes": len(body),
        "throughput": throughput,
        "throughput_ratio": round(
            throughput["ours"]["requests_per_second"] / throughput["reference"]["requests_per_second"], 2
        ),
        "at_500_per_second": latency,
        "p99_ratio_at_500": round(latency["ours"]["p99_ms"] / latency["reference"]["p99_ms"], 2),
        "server_side_at_500": server_side(histogram(rig, "/mutate"), before),
    }


def server_pid(url: str) -> int:
    """The process serving `url`: the one started with `--port` and its port."""
    port = url.rsplit(":", 1)[1].encode()
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().split(b"\0")
        except OSError:  # gone meanwhile
            continue
        if b"--port" in args[:-1] and args[args.index(b"--port") + 1] == port:
            return int(cmdline.parent.name)
    raise SystemExit(f"no process serves {url}")


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of a process so far (/proc/PID/stat, fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench_extender(rig: Rig, requests: int, orders: tuple[str, ...] = ("new", "same")) -> dict[str, Any]:
    """Latency of one call at a time, and each server's CPU per call, for each of `orders`: `new`, every call
    naming the nodes in a new order, so that the extender never sees a list again (kube-scheduler's case: its
    parallel filter returns the feasible nodes in the order they pass), and `same`, one list every call. On a
    shared machine the CPU a call costs is what waits for a core, so it says where the time goes whatever the load."""
    processes = {"ours": server_pid(rig.ours), "reference": server_pid(rig.echo)}
    rec = rig.recommendations[0]
    pod = k8s.pod("deployment", rec.workload, [k8s.container(rec.container, {"requests": {"cpu": "1"}})])
    pod["metadata"]["namespace"] = rec.namespace
    results = {}
    for nodes in (1000, 5000):
        names = [f"node-{i:05d}" for i in range(nodes)]
        shuffler = random.Random(nodes)
        for order in orders:
            # `new`: one list for each timed call, one to open the connection and one to check the answer with.
            lists = [shuffler.sample(names, nodes) for _ in range(requests + 2)] if order == "new" else [names]
            bodies = [json.dumps({"Pod": pod, "NodeNames": each}).encode() for each in lists]
            scores = httpx.post(rig.ours + "/scheduler/prioritize", content=bodies[-1], verify=str(rig.ca_file)).json()
            assert [s["Host"] for s in scores] == lists[-1], "the answer names the candidates in call order"
            before = histogram(rig, "/scheduler/prioritize")
            cpu = {name: cpu_seconds(process) for name, process in processes.items()}
            pair = _pair(
                rig, "/scheduler/prioritize", bodies if order == "new" else bodies[0], requests=requests, concurrency=1
            )
            for name, process in processes.items():
                pair[name]["server_cpu_ms_per_call"] = round((cpu_seconds(process) - cpu[name]) * 1000 / requests, 2)
            pair["server_side"] = server_side(histogram(rig, "/scheduler/prioritize"), before)
            pair["p50_ratio"] = round(pair["ours"]["p50_ms"] / pair["reference"]["p50_ms"], 2)
            pair["p99_ratio"] = round(pair["ours"]["p99_ms"] / pair["reference"]["p99_ms"], 2)
            results[f"prioritize_{nodes}_nodes" + ("" if order == "new" else f"_{order}_list")] = pair
    return results


def bench_rest(rig: Rig, requests: int) -> dict[str, Any]:
    rec = rig.recommendations[0]
    path = f"/api/v1/recommendations/{rec.namespace}/{rec.workload}/{rec.container}"
    size = len(httpx.get(rig.ours + path, verify=str(rig.ca_file)).content)
    ours = load(rig, rig.ours + path, None, method="GET", requests=requests, concurrency=8)
    reference = load(rig, rig.echo + f"/get?bytes={size}", None, method="GET", requests=requests, concurrency=8)
    return {
        "path": path,
        "response_bytes": size,
        "ours": ours,
        "reference": reference,
        "throughput_ratio": round(ours["requests_per_second"] / reference["requests_per_second"], 2),
    }


def big_review(rig: Rig, shape: str, size: int = 1024 * 1024) -> bytes:
    """An AdmissionReview of about `size` bytes: `env`, 200 containers (below serve.max_review_containers, so each is
    looked up and sized) with about 5 KB of environment each; `containers`, about 4,300 small containers (the
    hostile kind: without a cap, each is looked up, sized and diffed)."""
    rec = rig.recommendations[0]
    resources = {"requests": {"cpu": "1", "memory": "1Gi"}}
    if shape == "env":
        env = [{"name": f"CONFIG_{j}", "value": "v" * 230} for j in range(size // 200 // 260)]
        containers = [k8s.container(f"{rec.container}-{i}", resources, env=env) for i in range(200)]
    else:
        containers = [k8s.container(f"{rec.container}-{i}", resources) for i in range(size // 245)]
    body = json.dumps(
        k8s.review(k8s.pod("deployment", rec.workload, containers, labels=OPT_IN), rec.namespace)
    ).encode()
    assert 0.9 * size < len(body) < 1.1 * size, len(body)
    return body


def concurrently(rig: Rig, runs: dict[str, dict[str, Any]], time_cap: float) -> dict[str, Any]:
    """Several load generators at once, each in its own process: {name: summary}."""
    processes = {}
    for name, run in runs.items():
        command = [
            sys.executable,
            "-m",
            "bench.load",
            "--url",
            run["url"],
            "--method",
            run.get("method", "POST"),
            "--ca",
            str(rig.ca_file),
            "--requests",
            str(run["requests"]),
            "--concurrency",
            str(run["concurrency"]),
            "--rate",
            str(run["rate"]),
            "--time-cap",
            str(time_cap),
        ]
        if run.get("body") is not None:
            path = rig.workdir / f"body-{name}-{time.monotonic_ns()}.json"
            path.write_bytes(run["body"])
            command += ["--body", str(path)]
        processes[name] = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, text=True)
    results = {}
    for name, process in processes.items():
        out, _ = process.communicate(timeout=time_cap + 60)
        if process.returncode != 0:
            raise SystemExit(f"load generator {name} failed")
        results[name] = json.loads(out)
    return results


def bench_isolation(rig: Rig, seconds: int, rate: int = 500, shape: str = "env") -> dict[str, Any]:
    """`rate` small reviews/s and 20 /healthz probes/s over TLS with a 1 MB review every second, against ours and
    against the bare endpoint (same bodies, same rates, same run); and ours without the big reviews for context."""
    small, big = realistic_review(rig), big_review(rig, shape)
    assert "patch" in httpx.post(rig.ours + "/mutate", content=small, verify=str(rig.ca_file)).json()["response"]
    started = time.perf_counter()
    httpx.post(rig.ours + "/mutate", content=big, verify=str(rig.ca_file), timeout=30).raise_for_status()
    big_alone = time.perf_counter() - started

    def runs_of(review_url: str, probe_url: str, with_big: bool) -> dict[str, dict[str, Any]]:
        runs = {
            "small_reviews": {
                "url": review_url,
                "body": small,
                "rate": rate,
                "requests": rate * seconds,
                "concurrency": 16,
            },
            "healthz": {"url": probe_url, "method": "GET", "rate": 20, "requests": 20 * seconds, "concurrency": 2},
        }
        if with_big:
            runs["big_reviews"] = {"url": review_url, "body": big, "rate": 1, "requests": seconds, "concurrency": 1}
        return runs

    cap = seconds + 15
    result: dict[str, Any] = {
        "small_reviews_per_second": rate,
        "big_review_shape": shape,
        "small_body_bytes": len(small),
        "big_body_bytes": len(big),
        "big_review_alone_ms": round(big_alone * 1000, 1),
        "seconds": seconds,
    }
    result["ours"] = concurrently(rig, runs_of(rig.ours + "/mutate", rig.ours + "/healthz", True), cap)
    result["reference"] = concurrently(rig, runs_of(rig.echo + "/echo", rig.echo + "/get?bytes=15", True), cap)
    result["ours_without_big"] = concurrently(rig, runs_of(rig.ours + "/mutate", rig.ours + "/healthz", False), cap)
    return result
