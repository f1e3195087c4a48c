"""Trace loaders: real rows (tests/fixtures) and bad input (the full traces' counts are checked by
``bench/trace_counts.py``, a benchmark, never by a test)."""

from __future__ import annotations

import gzip
import math
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from gpufence.model.job import GpuRequest, RequestKind, WorkloadClass
from gpufence.sim.workloads.demand import LoadStats, ReplicaDemand, RequestDemand
from gpufence.sim.workloads.pai import JOB_COLUMNS, TASK_COLUMNS, load_pai, load_pai_machines
from gpufence.sim.workloads.philly import load_philly_jobs, philly_runtimes, sample_runtimes
from gpufence.sim.workloads.records import WorkItem
from gpufence.sim.workloads.serving_traces import (
    DECODE_S_PER_TOKEN,
    OVERHEAD_S,
    PREFILL_S_PER_TOKEN,
    load_azure_llm,
    load_dlrm_replicas,
    load_sd_requests,
    read_dlrm_instances,
)

FIX = Path(__file__).resolve().parents[1] / "fixtures"


def _gzip_copy(src: Path, dst: Path) -> Path:
    with open(src, "rb") as fin, gzip.open(dst, "wb") as fout:
        shutil.copyfileobj(fin, fout)
    return dst


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# --- demand types ------------------------------------------------------------------------------


def test_request_demand_at_scaled_resampled() -> None:
    d = RequestDemand("x", 10.0, np.array([1.0, 3.0, 0.0, 2.0]), 0.5, 1.0, "test")
    assert d.at(0) == 1.0 and d.at(9.99) == 1.0 and d.at(10) == 3.0 and d.at(35) == 2.0
    assert d.at(40) == 0.0 and d.at(-1) == 0.0 and d.at(math.nan) == 0.0
    assert d.peak_rate() == 3.0 and d.mean_rate() == 1.5 and d.total_requests() == 60.0
    s = d.scaled(2.0)
    assert s.peak_rate() == 6.0 and s.service_s_mean == 0.5 and d.peak_rate() == 3.0
    r = d.resampled(20.0)
    assert r.rate.tolist() == [2.0, 1.0] and r.total_requests() == pytest.approx(60.0)
    odd = d.resampled(15.0)  # 40 s -> 3 bins of 15 s, the last padded with zeros
    assert odd.rate.size == 3 and odd.total_requests() == pytest.approx(60.0)
    assert odd.rate[0] == pytest.approx((10 * 1 + 5 * 3) / 15)
    fine = d.resampled(5.0)
    assert fine.rate.tolist() == [1.0, 1.0, 3.0, 3.0, 0.0, 0.0, 2.0, 2.0]
    with pytest.raises(ValueError):
        d.rate[0] = 5.0  # read-only
    with pytest.raises(ValueError, match="scale"):
        d.scaled(-1.0)
    with pytest.raises(ValueError, match="bin_s"):
        d.resampled(0.0)
    with pytest.raises(ValueError, match="non-negative"):
        RequestDemand("bad", 1.0, np.array([-1.0]), 1.0, 0.0)


def test_request_demand_from_arrivals() -> None:
    d = RequestDemand.from_arrivals("a", [100.0, 100.5, 103.0, 161.0], [1.0, 3.0], 60.0)
    assert d.rate.tolist() == [3 / 60, 1 / 60] and d.total_requests() == pytest.approx(4)
    assert d.service_s_mean == 2.0 and d.service_s_cv == pytest.approx(0.5)


def test_replica_demand_intervals_and_combined() -> None:
    a = ReplicaDemand.from_intervals("a", [0.0, 0.0, 10.0], [5.0, math.inf, 20.0], 1)
    assert a.times.tolist() == [0.0, 5.0, 10.0, 20.0] and a.replicas.tolist() == [2, 1, 2, 1]
    assert a.at(-1) == 0 and a.at(0) == 2 and a.at(7) == 1 and a.at(15) == 2 and a.at(1e9) == 1
    assert a.peak() == 2 and a.peak_gpus() == 2
    b = ReplicaDemand.from_intervals("b", [12.0], [math.inf], 1)
    assert b.times.tolist() == [0.0, 12.0] and b.at(5) == 0 and b.at(12) == 1
    c = ReplicaDemand.combined([a, b], "all")
    assert [c.at(t) for t in (0, 7, 11, 12, 25)] == [2, 1, 2, 3, 2] and c.peak() == 3
    with pytest.raises(ValueError, match="gpus_per_replica"):
        ReplicaDemand.combined([a, ReplicaDemand.from_intervals("g", [0.0], [1.0], 2)], "x")
    with pytest.raises(ValueError, match="ends before"):
        ReplicaDemand.from_intervals("bad", [5.0], [1.0], 1)


# --- serving loaders on real rows --------------------------------------------------------------


def test_azure_llm_fixture_rows() -> None:
    d = load_azure_llm(FIX / "azure_llm_code_head.csv", bin_s=0.1)
    tokens = [(4808, 10), (3180, 8), (110, 27), (7433, 14), (34, 12), (374, 14)]
    service = [OVERHEAD_S + PREFILL_S_PER_TOKEN * c + DECODE_S_PER_TOKEN * g for c, g in tokens]
    assert d.total_requests() == pytest.approx(6)
    assert d.service_s_mean == pytest.approx(np.mean(service))
    assert d.service_s_cv == pytest.approx(np.std(service) / np.mean(service))
    # t = 0, 0.052, 0.098, 0.141, 0.445, 0.539 s after 18:17:03.97996 -> 0.1 s bins 3,1,0,0,1,1
    assert d.rate.tolist() == pytest.approx([30.0, 10.0, 0.0, 0.0, 10.0, 10.0])
    assert d.at(0.0) == pytest.approx(30.0) and d.at(0.25) == 0.0 and d.at(0.65) == 0.0
    assert d.name == "azure_llm_code_head" and "azure" in d.source
    plain = load_azure_llm(
        FIX / "azure_llm_code_head.csv", prefill_s_per_token=0, decode_s_per_token=0, overhead_s=1
    )
    assert plain.service_s_mean == 1.0 and plain.service_s_cv == 0.0


def test_sd_requests_fixture_rows(tmp_path: Path) -> None:
    ok = load_sd_requests(FIX / "sd_lora_requests_sample.csv", bin_s=3600.0)
    assert ok.total_requests() == pytest.approx(5)  # SUCCEED rows only
    assert ok.service_s_mean == pytest.approx(np.mean([32, 43, 36, 53, 51]))
    every = load_sd_requests(
        _gzip_copy(FIX / "sd_lora_requests_sample.csv", tmp_path / "sd.csv.gz"),
        bin_s=3600.0,
        only_succeeded=False,
    )
    assert every.total_requests() == pytest.approx(9)
    # the PENDING row (exec 0) arrives but has no service time
    assert every.service_s_mean == pytest.approx(np.mean([32, 43, 36, 53, 51, 3, 2, 43]))
    assert every.at(0) == pytest.approx(1 / 3600)


def test_dlrm_fixture_rows() -> None:
    path = FIX / "dlrm_sample.csv"
    insts = read_dlrm_instances(path)
    assert len(insts) == 11 and sum(i.role == "HN" for i in insts) == 9
    assert insts[0].creation_s == 0.0 and math.isinf(insts[0].deletion_s)
    curves = load_dlrm_replicas(path)
    assert [c.name for c in curves] == ["app_0", "app_1", "app_23", "app_28"]
    app0 = curves[0]
    assert app0.gpus_per_replica == 1 and app0.at(0) == 2 and app0.at(3973.5) == 3
    assert app0.at(4000) == 4 and app0.peak() == 4 and app0.at(5650) == 3 and app0.at(6000) == 2
    assert curves[1].at(0) == 2 and curves[1].at(915120.0) == 1
    assert curves[3].at(0) == 0 and curves[3].at(55612.0) == 1 and curves[3].at(1e9) == 1
    (one,) = load_dlrm_replicas(path, app="app_23")
    assert one.name == "app_23" and one.at(5000) == 2 and one.at(20000) == 1
    (total,) = load_dlrm_replicas(path, aggregate=True)
    assert total.name == "all" and total.at(0) == 5 and total.peak() == 8
    with pytest.raises(ValueError, match="no GPU replicas for app 'app_999'"):
        load_dlrm_replicas(path, app="app_999")


# --- PAI v2020 ---------------------------------------------------------------------------------


def _check_pai(items: list[WorkItem], stats: LoadStats) -> None:
    by_id = {w.job.id: w for w in items}
    assert len(items) == 5 and stats.kept == 5 and stats.rows == 11
    assert stats.skipped == {
        "job_without_submit_time": 1,
        "no_gpu": 1,
        "no_times": 1,
        "instance_larger_than_node": 1,
        "nonpositive_duration": 1,
        "unknown_job": 2,
    }
    a = by_id["pai-6f3e0a1c2b4d5e6f70819a2b-worker"]
    assert a.job.request == GpuRequest.fraction(500) and a.job.replicas == 1
    assert a.job.submit_time == 0.0 and a.duration_s == 3600.0
    assert a.job.cpu_milli == 6000 and a.job.mem_mib == 30000
    assert a.job.workload_class is WorkloadClass.TRAINING and not a.job.checkpointable
    b = by_id["pai-7a1b2c3d4e5f60718293a4b5-worker"]
    assert b.job.request == GpuRequest.whole(1) and b.job.replicas == 4
    assert b.job.submit_time == 995.0 and b.duration_s == 7200.0
    c = by_id["pai-8b2c3d4e5f60718293a4b5c6-tensorflow"]
    assert c.job.request == GpuRequest.whole(8) and c.duration_s == 44000.0
    e = by_id["pai-ad4e5f60718293a4b5c6d7e8-evaluator"]  # status Failed, but it ran
    assert e.job.request.kind is RequestKind.FRACTION and e.job.request.milli == 250
    g = by_id["pai-cf60718293a4b5c6d7e8f90a-PyTorchWorker"]
    assert g.job.request == GpuRequest.whole(2) and g.job.replicas == 2  # 150% -> 2 GPUs
    assert [w.job.submit_time for w in items] == sorted(w.job.submit_time for w in items)


def test_pai_headerless_fixture() -> None:
    stats = LoadStats()
    items = load_pai(
        FIX / "pai_job_table_sample.csv", FIX / "pai_task_table_sample.csv", stats=stats
    )
    _check_pai(items, stats)


def test_pai_with_header_and_gzip(tmp_path: Path) -> None:
    job_header = ",".join(JOB_COLUMNS) + "\n"
    task_header = ",".join(TASK_COLUMNS) + "\n"
    jobs = _write(
        tmp_path / "jobs.csv", job_header + (FIX / "pai_job_table_sample.csv").read_text()
    )
    tasks = _write(
        tmp_path / "tasks.csv", task_header + (FIX / "pai_task_table_sample.csv").read_text()
    )
    stats = LoadStats()
    items = load_pai(jobs, _gzip_copy(tasks, tmp_path / "tasks.csv.gz"), stats=stats)
    _check_pai(items, stats)
    pinned = load_pai(jobs, tasks, keep_gpu_type=True, rebase=False, host_resources=False)
    first = pinned[0].job
    assert first.gpu_types == ("T4",) and first.submit_time == 4550879.0 and first.cpu_milli == 0
    small = load_pai(jobs, tasks, gpus_per_node=4)
    assert all(w.job.request.gpus <= 4 for w in small) and len(small) == 4


def test_pai_machines_fixture() -> None:
    m = load_pai_machines(FIX / "pai_machine_spec_sample.csv")  # upstream: no header
    assert m.n_machines == 11 and m.n_gpus == 56
    assert m.by_shape() == dict(MISCx8=2, P100x2=2, T4x2=2, V100M32x8=2, V100x8=2, CPU=1)
    assert m.gpus_by_type()["V100M32"] == 16


# --- Philly ------------------------------------------------------------------------------------


def test_philly_job_log_fixture(tmp_path: Path) -> None:
    stats = LoadStats()
    items = load_philly_jobs(FIX / "philly_cluster_job_log_sample.json", stats=stats)
    assert stats.rows == 7 and stats.kept == 3
    assert stats.skipped == {"never_started": 3, "unfinished": 1}
    assert stats.flagged == {"nonuniform": 1}
    one, two, six = items
    assert one.job.id == "philly-application_1506638472019_10238"
    assert one.job.request == GpuRequest.whole(2) and one.job.replicas == 1
    assert one.job.submit_time == 0.0 and one.duration_s == 3600.0
    assert two.job.request == GpuRequest.whole(8) and two.job.replicas == 2
    assert two.job.submit_time == 6382.0 and two.duration_s == 11400.0  # first start..last end
    assert six.job.total_gpus == 6 and six.job.replicas == 6 and six.duration_s == 600.0
    assert six.job.workload_class is WorkloadClass.TRAINING
    gz = _gzip_copy(FIX / "philly_cluster_job_log_sample.json", tmp_path / "log.json.gz")
    passed = load_philly_jobs(gz, statuses={"Pass"}, vc_as_queue=True, with_estimates=True)
    assert [w.job.queue for w in passed] == ["6214e9", "ee9e8c"]
    assert passed[0].job.est_runtime_s == 3600.0


def test_philly_time_zone_word_is_ignored(tmp_path: Path) -> None:
    text = (FIX / "philly_cluster_job_log_sample.json").read_text()
    tz = _write(tmp_path / "tz.json", text.replace('02:43:38"', '02:43:38 PST"'))
    assert load_philly_jobs(tz)[1].job.submit_time == 6382.0


def test_philly_runtimes_fixture_and_sampling() -> None:
    r = philly_runtimes(FIX / "philly_runtime_sample.csv")
    assert r.size == 7 and float(np.median(r)) == 1186.0
    a = sample_runtimes(np.random.default_rng(7), 1000, r)
    b = sample_runtimes(np.random.default_rng(7), 1000, r)
    assert a.tolist() == b.tolist() and float(a.min()) == 1.0  # the 0 s runtime is floored
    assert set(a.tolist()) <= {1.0, *r.tolist()}
    assert sample_runtimes(np.random.default_rng(0), 0, r).size == 0


# --- bad input ---------------------------------------------------------------------------------


AZ = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
SD = "gmt_create,predict_status,exec_time_seconds\n"
DL = "instance_sn,role,app_name,gpu_request,creation_time,deletion_time\n"
T0 = "2023-11-16 18:17:03"


@pytest.mark.parametrize(
    ("loader", "text", "match"),
    [
        (load_azure_llm, f"TIMESTAMP,ContextTokens\n{T0},5\n", r":1: .*GeneratedTokens"),
        (load_azure_llm, f"{AZ}{T0},5,1\n{T0},abc,1\n", r":3: column ContextTokens"),
        (load_azure_llm, f"{AZ}yesterday,5,1\n", r":2: column TIMESTAMP"),
        (load_azure_llm, f"{AZ}{T0},5,nan\n", r":2: column GeneratedTokens"),
        (load_azure_llm, f"{AZ}{T0},5\n", r":2: expected 3 columns"),
        (load_azure_llm, "", r":1: empty file"),
        (load_sd_requests, "gmt_create,exec_time_seconds\n", r":1: .*predict_status"),
        (load_sd_requests, f"{SD}{T0},SUCCEED,\n", r":2: column exec_time_seconds"),
        (load_dlrm_replicas, f"{DL}i0,HN,app_0,1,100,50\n", r":2: column deletion_time"),
        (load_dlrm_replicas, f"{DL}i0,HN,app_0,0.5,,\n", r":2: column gpu_request"),
        (load_dlrm_replicas, "instance_sn,role,app_name,gpu_request\n", r":1: .*creation_time"),
        (load_pai_machines, "m1,T4,96,512,2\nm2,T4,96,512,two\n", r":2: column cap_gpu"),
        (load_pai_machines, "m1,T4,96,512\n", r":1: expected 5 columns"),
        (philly_runtimes, "runtime\n5\n-3\n", r":3: column runtime"),
        (philly_runtimes, "seconds\n5\n", r":1: missing column\(s\) runtime"),
    ],
)
def test_bad_csv_rows_name_file_line_column(
    tmp_path: Path, loader: Callable[[Path], object], text: str, match: str
) -> None:
    path = _write(tmp_path / "trace.csv", text)
    with pytest.raises(ValueError, match=match) as err:
        loader(path)
    assert str(path) in str(err.value)


def test_bad_pai_task_rows(tmp_path: Path) -> None:
    jobs = FIX / "pai_job_table_sample.csv"
    good = (FIX / "pai_task_table_sample.csv").read_text().splitlines()
    bad_gpu = _write(
        tmp_path / "t1.csv", "\n".join([good[0], good[2].replace(",100.0,P100", ",x,P100")])
    )
    with pytest.raises(ValueError, match=r"t1.csv:2: column plan_gpu"):
        load_pai(jobs, bad_gpu)
    short = _write(tmp_path / "t2.csv", good[0] + "\n" + good[1].rsplit(",", 1)[0] + "\n")
    with pytest.raises(ValueError, match=r"t2.csv:2: expected 10 columns, found 9"):
        load_pai(jobs, short)
    dup = _write(tmp_path / "j.csv", jobs.read_text() + jobs.read_text().splitlines()[0] + "\n")
    with pytest.raises(ValueError, match=r"j.csv:9: column job_name: duplicate"):
        load_pai(dup, FIX / "pai_task_table_sample.csv")


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ('[{"jobid": "a", "attempts": []', r":1: column \d+: invalid JSON"),
        ('{"jobid": "a"}', "expected a JSON list"),
        ('[{"jobid": "a", "attempts": []}]', r"job \[0\]: missing field\(s\) submitted_time"),
        (
            '[{"jobid": "a", "submitted_time": "3 Oct 2017", "attempts": [{"start_time":'
            ' "2017-10-03 02:44:00", "end_time": "2017-10-03 03:44:00",'
            ' "detail": [{"ip": "m1", "gpus": ["gpu0"]}]}]}]',
            r"job \[0\].submitted_time: '3 Oct 2017'",
        ),
        (
            '[{"jobid": "a", "submitted_time": "2017-10-03 02:43:38", "attempts": [{"start_time":'
            ' "2017-10-03 02:44:00", "end_time": "2017-10-03 03:44:00",'
            ' "detail": [{"ip": "m1", "gpus": 2}]}]}]',
            r"attempts\[0\].detail\[0\].gpus",
        ),
    ],
)
def test_bad_philly_job_log(tmp_path: Path, text: str, match: str) -> None:
    path = _write(tmp_path / "cluster_job_log", text)
    with pytest.raises(ValueError, match=match):
        load_philly_jobs(path)
