"""``#SBATCH`` scripts through the CLI and a real server on 127.0.0.1 (4 fake GPUs, real
processes): a Slurm array script with a dependency, its output files named ``%A_%a.out`` and
what each task read from ``SLURM_*``; the command line over the directives; a gang's
``SLURM_PROCID``; and a script with a directive gpufence does not translate, refused whole."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_server import Cli, CliServer, cli_for, cli_server

from gpufence.control.gpus.discovery import fake_gpus, node_spec
from gpufence.testing.waiting import until_value

ADMIN = "sbatch-admin-token-0123456789"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CliServer]:
    spec = node_spec(fake_gpus(4))
    spec["control"] = {"auth": {"admin_token": ADMIN}, "stop_grace_s": 1}
    yield from cli_server(tmp_path_factory.mktemp("sbatch"), spec, ADMIN)


@pytest.fixture
def cli(server: CliServer) -> Cli:
    return cli_for(server, ADMIN)


def ended(srv: CliServer, jid: str, timeout: float = 60.0) -> dict[str, Any]:
    return until_value(
        lambda: srv.client.job(jid), lambda j: j["ended_at"] is not None, timeout, f"{jid} ended"
    )


ARRAY_SCRIPT = """#!/bin/sh
# a Slurm sweep: four shards, two at a time, after the prep job
#SBATCH --job-name=sweep
#SBATCH --array=0-3%2
#SBATCH --gres=gpu:1 -c 1
#SBATCH --time=00:05:00
#SBATCH --dependency=afterok:{prep}
#SBATCH --output=%A_%a.out

echo "task=$SLURM_ARRAY_TASK_ID array=$SLURM_ARRAY_JOB_ID job=$SLURM_JOB_ID" \\
  "name=$SLURM_JOB_NAME count=$SLURM_ARRAY_TASK_COUNT cpus=$SLURM_CPUS_PER_TASK" \\
  "ntasks=$SLURM_NTASKS procid=$SLURM_PROCID gpus=$CUDA_VISIBLE_DEVICES"
cat prep.done
echo "to stderr" >&2
"""


def test_an_sbatch_array_script_runs_after_its_dependency(
    cli: Cli, server: CliServer, tmp_path: Path
) -> None:
    # the prep job writes prep.done at its very end: a task that did not wait for it fails
    prep_cmd = "sleep 2; echo prep-finished > prep.done"
    r = cli("submit", "--cwd", str(tmp_path), "--", "sh", "-c", prep_cmd)
    assert r.exit_code == 0, r.output
    prep = r.stdout.strip()
    script = tmp_path / "sweep.sh"
    script.write_text(ARRAY_SCRIPT.format(prep=prep))
    r = cli("submit", "--cwd", str(tmp_path), str(script))
    assert r.exit_code == 0, r.output
    array = r.stdout.strip()
    assert f"array {array}: 4 task(s) {array}_0..{array}_3" in r.stderr, r.stderr
    tasks = server.client.named(array)
    assert [t["index"] for t in tasks] == [0, 1, 2, 3]
    assert ended(server, prep)["state"] == "done"
    for t in tasks:
        job = ended(server, str(t["id"]))
        assert job["state"] == "done", job
        spec = job["spec"]
        assert (spec["gpus"], spec["cpus"], spec["time_limit_s"]) == (1, 1.0, 300.0), spec
        assert spec["after_ok"] == [prep]
    # each task's own output file, named as status shows the task (j4_3), holds what it read
    for t in tasks:
        i, jid = t["index"], t["id"]
        lines = (tmp_path / f"{array}_{i}.out").read_text().splitlines()
        head, _, gpus = lines[0].partition(" gpus=")
        assert head == (
            f"task={i} array={array} job={jid} name=sweep count=4 cpus=1 ntasks=1 procid=0"
        ), lines
        assert gpus and "," not in gpus, lines  # one GPU each
        assert lines[1:] == ["prep-finished", "to stderr"], lines  # after prep; stderr too
    r = cli("status", array)
    assert r.exit_code == 0, r.output
    for t in tasks:
        assert f"{array}_{t['index']}" in r.stdout and str(t["id"]) in r.stdout, r.stdout
    # the list and one task's status name it as Slurm does, next to its own id
    r = cli("queue", "--all", "-o", "wide")
    assert r.exit_code == 0, r.output
    for t in tasks:
        assert f"{t['id']} {array}_{t['index']}" in r.stdout, r.stdout
    r = cli("status", f"{array}_2")
    assert r.exit_code == 0, r.output
    assert f"{tasks[2]['id']} {array}_2 (sweep)" in r.stdout, r.stdout
    assert f"{script} > %A_%a.out 2>&1" in " ".join(r.stdout.split()), r.stdout


def test_the_command_line_wins_over_sbatch_lines(
    cli: Cli, server: CliServer, tmp_path: Path
) -> None:
    script = tmp_path / "train.sh"
    script.write_text(
        "#!/bin/sh\n#SBATCH --gres=gpu:1 --time=10 -J from-script\n#SBATCH --mem=2G\n"
        "#GPUFENCE --priority 5\ntrue\n"
    )
    r = cli("submit", "--hold", "--gpus", "2", "--time-limit", "1m", str(script))
    assert r.exit_code == 0, r.output
    jid = r.stdout.strip()
    try:
        spec = server.client.job(jid)["spec"]
        assert (spec["gpus"], spec["time_limit_s"]) == (2, 60.0), spec  # the command line's
        assert (spec["name"], spec["mem_bytes"], spec["priority"]) == ("from-script", 2 << 30, 5)
        assert spec["env"] == {"SLURM_JOB_NAME": "train.sh"}
    finally:
        server.client.cancel(jid)


def test_a_gang_task_reads_its_procid(cli: Cli, server: CliServer, tmp_path: Path) -> None:
    script = tmp_path / "gang.sh"
    script.write_text(
        "#!/bin/sh\n#SBATCH --ntasks=2 --gpus=2\n#SBATCH -o rank-%t.out\n"
        'echo "$SLURM_PROCID/$SLURM_NTASKS local=$SLURM_LOCALID job=$SLURM_JOB_ID"\n'
    )
    r = cli("submit", "--cwd", str(tmp_path), str(script))
    assert r.exit_code == 0, r.output
    jid = r.stdout.strip()
    assert ended(server, jid)["state"] == "done"
    got = {p.name: p.read_text() for p in tmp_path.glob("rank-*.out")}
    assert set(got) == {"rank-0.out", "rank-1.out"}, got
    for rank in (0, 1):
        text = got[f"rank-{rank}.out"]
        assert text.startswith(f"{rank}/2 local=") and text.endswith(f" job={jid}\n"), text


def test_an_untranslated_directive_refuses_the_whole_script(
    cli: Cli, server: CliServer, tmp_path: Path
) -> None:
    script = tmp_path / "train.sh"
    script.write_text(
        "#!/bin/sh\n#SBATCH --gres=gpu:1\n#SBATCH --exclusive\n#SBATCH --mail-type=END\n"
        "#SBATCH --array=0-3 -d singleton\necho hi\n"
    )
    before = len(server.client.jobs(limit=1000))
    r = cli("submit", str(script))
    assert r.exit_code == 2, r.output
    assert " ".join(r.stderr.split()) == (
        f"error: {script}: 3 #SBATCH directive(s) gpufence cannot apply, so nothing was "
        "submitted: line 3: --exclusive: not a directive gpufence translates; line 4: "
        "--mail-type=END: not a directive gpufence translates; line 5: --dependency=singleton: "
        "'singleton' dependencies are not translated (only afterok, afterany, afternotok). The "
        "README's '#SBATCH scripts' lists those it translates; remove the others or write what "
        "they ask as #GPUFENCE lines"
    )
    assert len(server.client.jobs(limit=1000)) == before  # nothing submitted, not one task


def test_gpufence_sbatch_options_win_over_the_scripts_lines(
    cli: Cli, server: CliServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # where sbatch is run: the job's working directory
    script = tmp_path / "job.sh"
    script.write_text(
        "#!/bin/sh\n#SBATCH --gres=gpu:1 -J from-script -t 10\n#SBATCH -o script-%j.out\n"
        'echo "args=$* name=$SLURM_JOB_NAME id=$SLURM_JOB_ID"\n'
    )
    r = cli("sbatch", "--parsable", "-J", "from-cli", "--output=cli-%j.out", str(script), "a", "b")
    assert r.exit_code == 0, r.output
    jid = r.stdout.strip()
    job = ended(server, jid)
    assert job["state"] == "done", job
    assert (job["spec"]["time_limit_s"], job["spec"]["gpus"]) == (600.0, 1)  # the script's
    assert not list(tmp_path.glob("script-*"))  # the command line's -o won
    assert (tmp_path / f"cli-{jid}.out").read_text() == f"args=a b name=from-cli id={jid}\n"
    r = cli("sbatch", "-t", "5", "--dependency", f"afterok:{jid}", str(script))
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith("Submitted batch job j"), r.stdout
    second = r.stdout.split()[-1]
    spec = server.client.job(second)["spec"]
    assert (spec["after_ok"], spec["time_limit_s"]) == ([jid], 300.0)
    assert ended(server, second)["state"] == "done"
    assert (tmp_path / f"script-{second}.out").read_text().startswith("args= name=from-script")


def test_gpufence_sbatch_refuses_what_it_cannot_apply(
    cli: Cli, server: CliServer, tmp_path: Path
) -> None:
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\n#SBATCH --gres=gpu:1\ntrue\n")
    before = len(server.client.jobs(limit=1000))
    r = cli("sbatch", "--exclusive", "-q", "high", str(script))
    assert r.exit_code == 2, r.output
    assert " ".join(r.stderr.split()) == (
        f"error: {script}: 2 #SBATCH directive(s) gpufence cannot apply, so nothing was "
        "submitted: the command line: --exclusive: not a directive gpufence translates; the "
        "command line: -q high: not a directive gpufence translates. The README's '#SBATCH "
        "scripts' lists those it translates; remove the others or write what they ask as "
        "#GPUFENCE lines"
    )
    own = tmp_path / "own.sh"
    own.write_text("#!/bin/sh\n#GPUFENCE --gpus 1\ntrue\n")
    r = cli("sbatch", str(own))
    assert r.exit_code == 2 and "has #GPUFENCE lines: submit it with gpufence submit" in r.stderr
    r = cli("sbatch", "-p", "x", "--url", "http://127.0.0.1:1", str(script))
    assert r.exit_code == 2 and "put --url first, before sbatch's options" in r.stderr, r.output
    assert len(server.client.jobs(limit=1000)) == before


def test_a_script_that_asks_for_no_gpu_runs_without_one(
    cli: Cli, server: CliServer, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    script = tmp_path / "prep.sh"
    script.write_text(
        f"#!/bin/sh\n#SBATCH -c 1 -o prep.out\n#SBATCH --chdir={work}\n"
        'echo "gpus=[$CUDA_VISIBLE_DEVICES] job_gpus=[${SLURM_JOB_GPUS-unset}]"\n'
    )
    r = cli("submit", str(script))
    assert r.exit_code == 0, r.output
    job = ended(server, r.stdout.strip())
    assert (job["state"], job["spec"]["gpus"]) == ("done", 0), job
    # --chdir: the job ran there, so its relative --output landed there
    assert (work / "prep.out").read_text() == "gpus=[] job_gpus=[unset]\n"
