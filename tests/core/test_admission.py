"""``sim.core.admission``: a fresh attempt record starts from the documented defaults."""

from __future__ import annotations

from support.kv import make_manager, make_request

from sim.core.admission import AdmissionAttempt, AttemptEnd


def test_a_fresh_attempt_has_not_asked_decided_or_ended():
    kv = make_manager(["full_attention"], num_blocks=8)
    request = make_request("r", ("doc", 32))
    attempt = AdmissionAttempt(request=request, kind="first", hits=(0,), blocks=kv.empty_kv_cache_blocks)
    assert (attempt.asked_at, attempt.answer) == (-1, -1)  # the connector was not asked
    assert (attempt.local, attempt.ext, attempt.computed, attempt.num_new_tokens, attempt.lookup_seq) == (0, 0, 0, 0, 0)
    assert attempt.lookup is None and not attempt.hit_diverged
    assert not (attempt.load_async or attempt.fallback)
    assert attempt.end is None
    assert (attempt.outcome, attempt.reason, attempt.crash_reason, attempt.taint_origin, attempt.tokens_lost) == (
        "",
        "",
        "",
        "",
        0,
    )
    attempt.stop(AttemptEnd.STOPPED, "no_blocks")
    assert (attempt.end, attempt.outcome, attempt.reason) == (AttemptEnd.STOPPED, "not_admitted", "no_blocks")
