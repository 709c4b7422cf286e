"""The pieces of serving.isolation that need no server: finding a review's uid in the start of a body, and the
worker pool's bound."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from recommender.errors import OverloadedError
from serving.isolation import WorkPool, review_uid
from tests import k8s


@given(padding=st.integers(0, 5000), cut=st.integers(0, 6000))
def test_the_uid_is_found_in_the_start_of_a_review_as_the_api_server_writes_it(padding: int, cut: int) -> None:
    pod = k8s.pod("deployment", "web", [k8s.container("main", None)])
    pod["metadata"]["uid"] = "the-pod-uid"  # the object's own uid comes later and must not be taken
    pod["metadata"]["annotations"] = {"padding": "x" * padding}
    review = k8s.review(pod, "ns")
    body = json.dumps(review).encode()
    uid = review["request"]["uid"]
    end = body.index(uid.encode()) + len(uid) + 1  # through the closing quote
    assert review_uid(body[:cut]) == (uid if cut >= end else None)


@pytest.mark.parametrize(
    ("prefix", "uid"),
    [
        (b'{"request": {"uid": "u-1", "object": {"metadata": {"uid": "pod"}}}}', "u-1"),
        (
            b'{"request": {"object": {"metadata": {"uid": "pod"}}, "uid": "u-1"}}',
            None,
        ),  # only the object's uid in reach
        (b'{"uid": "outside"}', None),
        (b'{"request": {"uid": 5}}', None),
        (b'\xff\xfe{"request": {"uid": "\xff"}}', None),
        (b"", None),
    ],
)
def test_no_uid_is_made_up(prefix: bytes, uid: str | None) -> None:
    assert review_uid(prefix) == uid


@given(st.binary(max_size=300))
def test_review_uid_never_raises(prefix: bytes) -> None:
    found = review_uid(prefix)
    assert found is None or isinstance(found, str)


def test_a_full_pool_answers_overloaded_at_once() -> None:
    release = threading.Event()

    async def scenario() -> list[object]:
        pool = WorkPool(threads=1, max_queued=2)
        running = [asyncio.ensure_future(pool.run(lambda: release.wait(10))) for _ in range(2)]
        await asyncio.sleep(0.05)
        with pytest.raises(OverloadedError):
            await pool.run(lambda: True)
        release.set()
        done = await asyncio.gather(*running)
        after = await pool.run(lambda: "free again")
        pool.close()
        return [*done, after]

    assert asyncio.run(scenario()) == [True, True, "free again"]


def test_settling_the_heap_collects_the_old_model_and_exempts_the_new_one() -> None:
    import gc
    import weakref

    from serving.app import settle_heap

    class Node:
        def __init__(self) -> None:
            self.me = self  # a cycle: only the cyclic collector frees it

    old = Node()
    gone = weakref.ref(old)
    del old
    try:
        settle_heap()
        # A full collection would walk every object of a loaded model; frozen ones are skipped.
        assert gone() is None and gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
