"""``#SBATCH`` lines: the table of what each common directive becomes, and the exact refusal of
every other (naming each with its line); the output wrapper run through a real ``/bin/sh``."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gpufence.cli.sbatch import SbatchError, slurm_time, translate
from gpufence.cli.sbatch_output import pattern_problem, shown_command, with_output
from gpufence.cli.sbatch_verb import split_command_line


def params(*lines: str) -> dict[str, Any]:
    return translate("#!/bin/bash\n" + "".join(f"#SBATCH {ln}\n" for ln in lines), "s.sh").params


TRANSLATIONS: list[tuple[list[str], dict[str, Any]]] = [
    (["--gres=gpu:4"], {"gpus": 4}),
    (["--gres=gpu"], {"gpus": 1}),
    (["--gres=gpu:0"], {"gpus": 0}),
    (["--gres gpu:2"], {"gpus": 2}),
    (["--gres=gpu:1g.10gb:1"], {"mig": "1g.10gb"}),
    (["--gpus=3"], {"gpus": 3}),
    (["-G 2"], {"gpus": 2}),
    (["-G2"], {"gpus": 2}),
    (["--ntasks=4", "--gres=gpu:4"], {"replicas": 4, "gpus": 1}),
    (["-n 2 --gpus=4"], {"replicas": 2, "gpus": 2}),
    (["--gpus-per-task=2", "-n 3"], {"gpus": 2, "replicas": 3}),
    (["--gpus-per-task=1g.10gb:1", "-n 2"], {"mig": "1g.10gb", "replicas": 2}),
    (["--chdir=/data/run"], {"cwd": "/data/run"}),
    (["-D /tmp"], {"cwd": "/tmp"}),
    (["--cpus-per-task=8"], {"cpus": 8.0}),
    (["-c 2"], {"cpus": 2.0}),
    (["--mem=4000"], {"mem": "4000M"}),
    (["--mem=16G"], {"mem": "16384M"}),
    (["--mem 1T"], {"mem": "1048576M"}),
    (["--mem=512K"], {"mem": "1M"}),
    (["--mem=16G", "--ntasks=2"], {"mem": "8192M", "replicas": 2}),
    (["--time=30"], {"time_limit": "1800"}),
    (["-t 5:30"], {"time_limit": "330"}),
    (["--time=01:30:00"], {"time_limit": "5400"}),
    (["--time=2-3"], {"time_limit": "183600"}),
    (["--time=1-02:30"], {"time_limit": "95400"}),
    (["--time=1-02:03:04"], {"time_limit": "93784"}),
    (["--time=UNLIMITED"], {}),
    (["--array=0-9%2"], {"array": "0-9%2"}),
    (["-a 1,3,5-7"], {"array": "1,3,5-7"}),
    (["--dependency=afterok:j1"], {"after_ok": ["j1"]}),
    (["-d afterok:j1:j2,afterok:j3"], {"after_ok": ["j1", "j2", "j3"]}),
    (["--dependency=afterany:j1,afternotok:j2"], {"after_any": ["j1"], "after_not_ok": ["j2"]}),
    (["--job-name=train"], {"name": "train"}),
    (["-J train"], {"name": "train"}),
    (["--partition=batch"], {"partition": "batch"}),
    (["-p batch"], {"partition": "batch"}),
    (["--nodes=1"], {}),
    (["-N 1 -n 1"], {"replicas": 1}),
    (["--time=10", "--time=20"], {"time_limit": "1200"}),  # a later line wins, as in sbatch
    (["--gres=gpu:1  # a comment"], {"gpus": 1}),
]


@pytest.mark.parametrize(
    ("lines", "want"), TRANSLATIONS, ids=[" ".join(t[0]) for t in TRANSLATIONS]
)
def test_each_directive_translates(lines: list[str], want: dict[str, Any]) -> None:
    assert params(*lines) == want


def test_output_and_error_patterns_are_kept() -> None:
    sb = translate("#SBATCH -o %A_%a.out\n#SBATCH --error=err-%j.txt\n", "s.sh")
    assert (sb.output, sb.error, sb.present) == ("%A_%a.out", "err-%j.txt", True)
    assert translate("#!/bin/sh\necho hi\n", "s.sh").present is False


def test_parsing_stops_at_the_first_command() -> None:
    text = "#!/bin/bash\n\n# a comment\n#SBATCH --gpus=2\nset -e\n#SBATCH --exclusive\n"
    assert translate(text, "s.sh").params == {"gpus": 2}


def refusal(*lines: str) -> str:
    with pytest.raises(SbatchError) as exc:
        translate("".join(f"#SBATCH {ln}\n" for ln in lines), "s.sh")
    return str(exc.value)


TAIL = (
    ". The README's '#SBATCH scripts' lists those it translates; remove the others or write "
    "what they ask as #GPUFENCE lines"
)
HEAD = "s.sh: {} #SBATCH directive(s) gpufence cannot apply, so nothing was submitted: "


def test_every_untranslated_directive_is_named_with_its_line() -> None:
    got = refusal("--exclusive", "--gpus=1 --mail-type END", "--account=abc -t 10")
    assert (
        got
        == HEAD.format(3)
        + (
            "line 1: --exclusive: not a directive gpufence translates; "
            "line 2: --mail-type END: not a directive gpufence translates; "
            "line 3: --account=abc: not a directive gpufence translates"
        )
        + TAIL
    )


REFUSALS: list[tuple[str, str]] = [
    (
        "--gres=gpu:a100:2",
        "--gres=gpu:a100:2: gpufence picks GPUs by partition, not by type: "
        "write gpu:2 and name the partition that holds a100 GPUs with --partition",
    ),
    (
        "--gres=gpu:2,shard:1",
        "--gres=gpu:2,shard:1: only one gpu:[TYPE:]N is translated (no other generic resources)",
    ),
    (
        "--gres=gpu:x",
        "--gres=gpu:x: write gpu:N or gpu:TYPE:N with N a whole number (gpu:0: none)",
    ),
    (
        "--gres=gpu:3 -n 2",
        "--gres=gpu:3: 3 GPU(s) do not divide among 2 tasks: give a multiple of 2",
    ),
    (
        "--gres=gpu:1 --gpus=1",
        "--gpus=1: give the GPUs once: one of --gres=gpu:N, --gpus=N or --gpus-per-task=N",
    ),
    ("-n 0", "--ntasks=0: must be a whole number of at least 1"),
    ("-c 1.5", "--cpus-per-task=1.5: must be a whole number of at least 1"),
    ("--mem=0", "--mem=0: write a size in Slurm's form: 4000 (MB), 500M, 16G or 1T, more than 0"),
    (
        "--time=1:75:00",
        "--time=1:75:00: minutes and seconds after a ':' go up to 59; write MM, "
        "MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS",
    ),
    (
        "--time=1h",
        "--time=1h: not a time limit; write MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS",
    ),
    (
        "--array=5-1",
        "--array=5-1: range '5-1' is empty (e.g. 0-99, 1,3,5-7, 0-99%8 or 0-20:2 "
        "(every second index))",
    ),
    (
        "-d singleton",
        "--dependency=singleton: 'singleton' dependencies are not translated "
        "(only afterok, afterany, afternotok)",
    ),
    (
        "-d after:j1",
        "--dependency=after:j1: 'after' dependencies are not translated (only "
        "afterok, afterany, afternotok)",
    ),
    (
        "-d aftercorr:j1",
        "--dependency=aftercorr:j1: 'aftercorr' dependencies are not "
        "translated (only afterok, afterany, afternotok)",
    ),
    (
        "-d afterok:j1?afterany:j2",
        "--dependency=afterok:j1?afterany:j2: '?' (any one of) is "
        "not translated: every dependency must hold",
    ),
    ("-d afterok:j1+5", "--dependency=afterok:j1+5: write afterok:JOB[:JOB] (no +TIME delay)"),
    ("-p a,b", "--partition=a,b: name one partition (gpufence does not try a list in turn)"),
    ("-o %N.out", "--output=%N.out: '%N' is not translated (use %j, %A, %a, %x, %t or %%)"),
    ("-e log-%3a", "--error=log-%3a: '%3' is not translated (use %j, %A, %a, %x, %t or %%)"),
    ("-N 2", "--nodes=2: gpufence places a job's tasks itself: give --ntasks (and no --nodes)"),
    ("-N 1 -n 2", "--nodes=1: gpufence cannot keep 2 tasks on one node: drop --nodes=1"),
    ("--time", "--time: needs a value"),
    ("train", "train: not an option (a directive is #SBATCH --name=value)"),
    ("--job-name='x", "--job-name='x: No closing quotation"),
]


@pytest.mark.parametrize(("line", "why"), REFUSALS, ids=[r[0] for r in REFUSALS])
def test_each_refusal_says_why(line: str, why: str) -> None:
    assert refusal(line) == HEAD.format(1) + f"line 1: {why}" + TAIL


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("0", 0), ("infinite", 0), ("90", 5400), ("90:30", 5430), ("100:00:00", 360000),
     ("3-0", 259200)],
)  # fmt: skip
def test_slurm_time_forms(text: str, seconds: int) -> None:
    assert slurm_time(text) == seconds


def test_pattern_letters() -> None:
    assert pattern_problem("%j-%A-%a-%x-%t-%%N.out") is None
    assert pattern_problem("") == "name a file (e.g. %x-%j.out)"
    assert pattern_problem("x%") == "'%' is not translated (use %j, %A, %a, %x, %t or %%)"


SCRIPT = "#!/bin/sh\necho out $SLURM_ARRAY_TASK_ID\necho err >&2\nexit 3\n"
JOB_ENV = {"SLURM_JOB_ID": "j7", "SLURM_JOB_NAME": "nm", "SLURM_PROCID": "1"}
TASK_ENV = {**JOB_ENV, "SLURM_ARRAY_JOB_ID": "j4", "SLURM_ARRAY_TASK_ID": "3"}


def run(tmp_path: Path, env: dict[str, str], out: str | None, err: str | None) -> int:
    (tmp_path / "s.sh").write_text(SCRIPT)
    argv = with_output(["/bin/sh", "s.sh"], out, err, gang=False)
    full = {"PATH": os.environ["PATH"], **env}
    return subprocess.run(argv, cwd=tmp_path, env=full, capture_output=True, check=False).returncode


def files(tmp_path: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in tmp_path.iterdir() if p.name != "s.sh"}


def test_output_goes_to_the_expanded_file_with_stderr(tmp_path: Path) -> None:
    assert run(tmp_path, TASK_ENV, "%A_%a-%x-%t-%%-%j.out", None) == 3  # the script's own exit
    assert files(tmp_path) == {"j4_3-nm-1-%-j7.out": "out 3\nerr\n"}


def test_error_goes_to_its_own_file(tmp_path: Path) -> None:
    assert run(tmp_path, TASK_ENV, "o-%a", "e-%a") == 3
    assert files(tmp_path) == {"o-3": "out 3\n", "e-3": "err\n"}


def test_outside_an_array_a_is_slurms_no_value(tmp_path: Path) -> None:
    run(tmp_path, JOB_ENV, "%A-%a", None)
    assert files(tmp_path) == {"j7-4294967294": "out\nerr\n"}


def test_no_pattern_no_wrapper() -> None:
    assert with_output(["a", "b"], None, None, gang=True) == ["a", "b"]


def test_command_line_options_win_and_are_named_as_such() -> None:
    text = "#SBATCH -t 10 -J script\n"
    sb = translate(text, "s.sh", ["-t", "5", "--job-name=cli"])
    assert sb.params == {"time_limit": "300", "name": "cli"}
    with pytest.raises(SbatchError) as exc:
        translate("#SBATCH --exclusive\n", "s.sh", ["--qos=high", "-t", "x"])
    assert (
        str(exc.value)
        == HEAD.format(3)
        + (
            "line 1: --exclusive: not a directive gpufence translates; "
            "the command line: --qos=high: not a directive gpufence translates; "
            "the command line: --time=x: not a time limit; write MM, MM:SS, HH:MM:SS, D-HH, "
            "D-HH:MM or D-HH:MM:SS"
        )
        + TAIL
    )


def test_gpufence_sbatch_finds_the_script_after_the_options(tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\ntrue\n")
    s = str(script)
    assert split_command_line(["-p", "batch", "-n2", "--time=5", s, "-x", "y"]) == (
        ["-p", "batch", "-n2", "--time=5"],
        script,
        ["-x", "y"],
    )
    # an option that is not translated takes the next word unless that is the script
    assert split_command_line(["--qos", "high", "--exclusive", s]) == (
        ["--qos", "high", "--exclusive"],
        script,
        [],
    )


def test_a_wrapped_script_is_shown_as_the_script_and_its_files() -> None:
    wrapped = with_output(["/bin/bash", "/w/sweep.sh", "a"], "%A_%a.out", None, gang=False)
    assert shown_command(wrapped) == "/bin/bash /w/sweep.sh a > %A_%a.out 2>&1"
    both = with_output(["/bin/sh", "/w/s.sh"], "o", "e", gang=True)
    assert shown_command(both) == "/bin/sh /w/s.sh > o 2> e"
    assert shown_command(with_output(["x"], None, "e", gang=False)) == "x 2> e"
    assert shown_command(["/bin/sh", "-c", "echo hi"]) == "/bin/sh -c echo hi"


def test_a_script_that_asks_for_no_gpu_gets_none_unless_another_layer_asks() -> None:
    sb = translate("#SBATCH -c 2\n", "s.sh")
    assert (sb.params, sb.cpu_only) == ({"cpus": 2.0}, True)
    assert sb.finish({"cpus": 2.0, "gpus": None, "mig": None}) == {
        "cpus": 2.0,
        "gpus": 0,
        "mig": None,
    }  # Slurm gives a job that names no GPU none; gpufence's default would be one
    assert sb.finish({"gpus": 2, "mig": None}) == {"gpus": 2, "mig": None}
    assert sb.finish({"gpus": None, "mig": "1g.10gb"}) == {"gpus": None, "mig": "1g.10gb"}
    assert translate("#SBATCH -G 1\n", "s.sh").cpu_only is False
