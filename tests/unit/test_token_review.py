"""The TokenReview cache's budgets: unknown tokens spend one per client address and one shared, tokens the API
server authenticated before spend their own and are refreshed before they expire, so no flood locks them out."""

from __future__ import annotations

import asyncio

import pytest

from recommender.errors import RateLimitedError
from serving.routes.auth import TokenBucket, TokenReviewer, Verdict
from serving.settings import AuthSettings

VALID, FORBIDDEN = "valid-token", "forbidden-token"


class Counting(TokenReviewer):
    """The reviewer with the API server's answer replaced (valid, forbidden, else unauthenticated); each answer
    still spends its budget as a call would."""

    def __init__(self, settings: AuthSettings) -> None:
        super().__init__(settings)
        self.asked: list[str] = []

    async def _decide(self, token: str, bucket: TokenBucket) -> Verdict:
        if not bucket.take():
            raise RateLimitedError("spent")
        self.asked.append(token)
        return {VALID: Verdict.ACCEPTED, FORBIDDEN: Verdict.FORBIDDEN}.get(token, Verdict.REFUSED)


def reviewer(**settings: float) -> Counting:
    return Counting(AuthSettings(token_review=True, **settings))  # type: ignore[arg-type]


async def flood(auth: TokenReviewer, source: str, count: int) -> list[str]:
    """`count` distinct bogus tokens from `source`: what each got."""
    outcomes = []
    for i in range(count):
        try:
            outcomes.append((await auth.judge(f"bogus-{source}-{i}", source)).value)
        except RateLimitedError:
            outcomes.append("429")
    return outcomes


def test_unknown_tokens_spend_a_budget_per_address_then_a_shared_one() -> None:
    async def run() -> None:
        auth = reviewer(token_review_rate_per_source=3, token_review_rate_per_second=5)
        assert await flood(auth, "10.0.0.1", 10) == ["refused"] * 3 + ["429"] * 7
        assert await flood(auth, "10.0.0.2", 3) == ["refused", "refused", "429"]  # the shared budget of 5 is spent
        assert await auth.judge("bogus-10.0.0.1-0", "10.0.0.1") is Verdict.REFUSED  # refusals are cached
        assert len(auth.asked) == 5

    asyncio.run(run())


def test_a_flood_never_locks_out_a_token_authenticated_before() -> None:
    async def run() -> None:
        auth = reviewer(token_review_rate_per_source=2, token_review_rate_per_second=2, token_review_cache_seconds=0.2)
        assert await auth.judge(VALID, "10.0.0.9") is Verdict.ACCEPTED
        assert await auth.judge(FORBIDDEN, "10.0.0.9") is Verdict.FORBIDDEN  # authenticated, not allowed: 403
        for _ in range(6):  # 0.6 s: its entry is refreshed at half its time, and would have expired three times
            assert (await flood(auth, "10.0.0.9", 20)).count("429") >= 18  # the unknown-token budgets are spent
            assert await auth.judge(VALID, "10.0.0.9") is Verdict.ACCEPTED  # same address, never 429
            await asyncio.sleep(0.1)
        assert auth.asked.count(VALID) >= 3  # refreshed before it expired, in the background

    asyncio.run(run())


def test_a_known_token_past_its_entry_is_reviewed_on_its_own_budget() -> None:
    async def run() -> None:
        auth = reviewer(token_review_rate_per_second=1, token_review_rate_per_source=1, token_review_cache_seconds=0.05)
        assert await auth.judge(VALID, "a") is Verdict.ACCEPTED
        await flood(auth, "a", 5)
        await asyncio.sleep(0.1)  # expired, no refresh started (not used meanwhile)
        assert await auth.judge(VALID, "a") is Verdict.ACCEPTED
        assert auth.asked.count(VALID) == 2

    asyncio.run(run())


def test_a_revoked_token_is_refused_once_its_refresh_says_so() -> None:
    async def run() -> None:
        auth = reviewer(token_review_cache_seconds=0.2)
        assert await auth.judge(VALID, "a") is Verdict.ACCEPTED
        auth._decide = lambda token, bucket: asyncio.sleep(0, Verdict.REFUSED)  # type: ignore[method-assign]
        await asyncio.sleep(0.11)
        assert await auth.judge(VALID, "a") is Verdict.ACCEPTED  # served from the cache while it is re-reviewed
        await asyncio.sleep(0.02)
        assert await auth.judge(VALID, "a") is Verdict.REFUSED

    asyncio.run(run())


@pytest.mark.parametrize("rate", [0.5, 3.0])
def test_bucket_bursts_at_least_one(rate: float) -> None:
    bucket = TokenBucket(rate)
    assert [bucket.take() for _ in range(4)].count(True) == max(1, int(rate))


def test_a_forbidden_token_past_its_entry_spends_the_unknown_budgets() -> None:
    """Valid but not allowed tokens are cheap to mint (any account): they get no budget of their own."""

    async def run() -> None:
        auth = reviewer(token_review_rate_per_source=1, token_review_failure_cache_seconds=0.05)
        assert await auth.judge(FORBIDDEN, "a") is Verdict.FORBIDDEN
        await asyncio.sleep(0.1)
        with pytest.raises(RateLimitedError):
            await auth.judge(FORBIDDEN, "a")

    asyncio.run(run())
