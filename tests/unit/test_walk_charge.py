"""The walk keeps each job's charge on its record (partition_walk._charge): it must follow
the job (an update makes a new Job object) and the cluster (a reload makes a new one)."""

from __future__ import annotations

from dataclasses import replace

from gpufence.sched.jobs import JobRecord
from gpufence.sched.partition_walk import _charge
from gpufence.state.ledger import charge_milli
from gpufence.testing.builders import ClusterBuilder, job


def _cluster(gpus: int = 4):  # type: ignore[no-untyped-def]
    return ClusterBuilder().nodes("n", 1, gpus=gpus).partition("p", ["n"]).queue("q", "p").build()


def test_charge_is_kept_while_the_job_and_cluster_are_the_same() -> None:
    c = _cluster()
    rec = JobRecord(job("a").gpus(2).queue("q").build(), "p", "q")
    assert _charge(c, rec, "p") == 2000 == charge_milli(rec.job, c, "p")
    assert rec.charge is not None and rec.charge[3] == 2000


def test_charge_follows_an_updated_job() -> None:
    c = _cluster()
    rec = JobRecord(job("a").gpus(2).queue("q").build(), "p", "q")
    assert _charge(c, rec, "p") == 2000
    rec.job = job("a").gpus(3).queue("q").build()
    assert _charge(c, rec, "p") == 3000


def test_charge_follows_a_new_cluster() -> None:
    c = _cluster()
    rec = JobRecord(job("a").gpus(1).queue("q").build(), "p", "q")
    assert _charge(c, rec, "p") == 1000
    # a reloaded cluster is a new object: the charge is asked again (here: a kept value
    # planted under the old cluster would otherwise be returned)
    rec.charge = (rec.job, c, "p", 12345)
    assert _charge(c, rec, "p") == 12345
    c2 = replace(c)
    assert _charge(c2, rec, "p") == 1000
