"""The report's queue-delay CDF keeps classes that never waited apart (issue 32, case 10): a
zero delay sits at the log axis's floor, and two such classes drew the same line there."""

from __future__ import annotations

import pytest

pytest.importorskip("matplotlib", reason="the sim extra is not installed")

from gpufence.sim.report import queue_cdf_figure


def test_zero_delay_classes_each_keep_a_line_of_their_own() -> None:
    per = {
        "serving": [0.0] * 5,
        "training": [0.0, 2.0, 30.0],
        "interactive": [0.0] * 3,
        "batch": [],
    }
    fig = queue_cdf_figure(per, "t")
    ax = fig.axes[0]
    lines = ax.get_lines()
    assert len(lines) == 3  # batch started nothing: no line
    drawn = [(tuple(ln.get_xdata()), tuple(ln.get_ydata()), ln.get_linestyle()) for ln in lines]
    serving, interactive = drawn[0], drawn[2]
    # both never waited: without their own place and style, one hid the other
    assert serving[0][0] != interactive[0][0] and serving[2] != interactive[2]
    labels = ax.get_legend_handles_labels()[1]
    assert labels[0] == "serving (n=5 started, 100% waited 0 s)"
    assert labels[1] == "training (n=3 started, 33% waited 0 s)"
