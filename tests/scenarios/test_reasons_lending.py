"""Pending reasons where lending is the blocker (issue 31, item 3): a borrower that does not fit
at home is told how many GPUs the lender lends of its idle ones, the rule's cap, and what more
it may lend -- not only that its own partition is full."""

from __future__ import annotations

from scenario_harness import serve_and_train, sub

from gpufence.model.decisions import PendingReason, Reason
from gpufence.model.events import JobFinished
from gpufence.testing.builders import job


def test_a_borrower_past_the_lenders_cap_is_told_the_cap_and_the_idle_gpus() -> None:
    s = serve_and_train(lend=2)
    binds = s.step(sub(job("own").gpus(4).build(), job("ck1").gpus(2).checkpointable().build()), 0)
    assert [d.job_id for d in binds] == ["own", "ck1"]
    s.step(sub(job("ck2").gpus(1).checkpointable().build()), 10.0)
    assert s.why_pending("ck2") == PendingReason(
        Reason.NO_FIT,
        "needs 1 free GPU, partition train has 0 free; serve lends 2 of its 4 idle GPUs "
        "(cap 2) to train: no more may be lent, this job needs 1",
    )
    s.step([], 20.0)  # said once, not repeated on the next cycle
    again = s.why_pending("ck2")
    assert again is not None and again.message.count("serve lends") == 1, again


def test_a_borrower_larger_than_what_the_cap_leaves_is_told_both_numbers() -> None:
    s = serve_and_train(lend=3)
    s.step(sub(job("own").gpus(4).build(), job("ck1").gpus(2).checkpointable().build()), 0.0)
    s.step(sub(job("ck2").gpus(2).checkpointable().build()), 10.0)
    why = s.why_pending("ck2")
    assert why is not None and why.reason is Reason.NO_FIT
    assert why.message.endswith(
        "; serve lends 2 of its 4 idle GPUs (cap 3) to train: 1 more may be lent, this job needs 2"
    ), why.message


def test_a_changed_cap_note_replaces_the_old_one() -> None:
    """ck1 ends: serve lends 0 of its 4, ck2 (3 GPUs) is still over the cap of 2 -- the new
    numbers replace the old, they are not appended to them."""
    s = serve_and_train(lend=2)
    s.step(sub(job("own").gpus(4).build(), job("ck1").gpus(2).checkpointable().build()), 0.0)
    s.step(sub(job("ck2").gpus(3).checkpointable().build()), 10.0)
    first = s.why_pending("ck2")
    assert first is not None and "serve lends 2 of its 4 idle GPUs (cap 2)" in first.message
    s.step([JobFinished("ck1", succeeded=True)], 20.0)
    why = s.why_pending("ck2")
    assert why is not None
    assert why.message.count("serve lends") == 1, why.message
    assert "serve lends 0 of its 4 idle GPUs (cap 2) to train: 2 more may be lent" in why.message


def test_a_job_that_does_not_checkpoint_is_told_so_even_when_the_cap_is_reached() -> None:
    s = serve_and_train(lend=2)
    s.step(sub(job("own").gpus(4).build(), job("ck1").gpus(2).checkpointable().build()), 0.0)
    s.step(sub(job("nc").gpus(1).build()), 10.0)
    assert s.why_pending("nc") == PendingReason(
        Reason.NO_FIT,
        "needs 1 free GPU, partition train has 0 free; serve lends 0 idle GPUs to "
        "checkpointable jobs only",
    )
