"""The mig-parted configs gpufence names on Kubernetes (kube/mig_parted.py) and the
``gpufence k8s mig-config`` verb."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from gpufence.cli.main import app
from gpufence.kube import mig_parted as mp
from gpufence.model import mig as migmod
from gpufence.sched import migcut

LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?$")
CUT_3G: mp.Counts = (("1g.10gb", 4), ("3g.40gb", 1))


def test_full_layouts_are_every_maximal_valid_cut() -> None:
    layouts = mp.full_layouts("H100-80GB")
    assert len(layouts) == len(set(layouts)) == 38
    for want in [(("1g.10gb", 7),), (("3g.40gb", 2),), (("7g.80gb", 1),), CUT_3G]:
        assert want in layouts
    profiles = migmod.profiles_for("H100-80GB")
    for counts in layouts:  # each one a cut the hardware takes
        migmod.plan_layout(profiles, [p for p, n in counts for _ in range(n)])
    # every cut the core makes of an idle GPU for one profile (and the demand behind it)
    idle = [migmod.MigInstance("1g.10gb", i) for i in range(7)]
    for want in [p for p in profiles if "+me" not in p]:
        for demand in ([], ["2g.20gb"], ["1g.20gb", "3g.40gb"]):
            cut = migcut.full_layout("H100-80GB", [], idle, [want], demand)
            assert cut is not None
            assert mp.counts_of(f"{i.profile}@{i.start}" for i in cut) in layouts, (want, cut)
    assert (("3g.40gb", 1),) not in layouts  # room left for 1g: the core never cuts it


def test_config_names_are_label_values_fixed_by_content() -> None:
    a = mp.config_name([CUT_3G, (("7g.80gb", 1),)])
    assert LABEL_VALUE.match(a) and a.startswith("gpufence-2gpu-")
    assert a == mp.config_name([CUT_3G, (("7g.80gb", 1),)])
    assert a != mp.config_name([(("7g.80gb", 1),), CUT_3G])  # per GPU index
    assert mp.entries([CUT_3G, (("7g.80gb", 1),), CUT_3G]) == [
        {"devices": [0, 2], "mig-enabled": True, "mig-devices": {"1g.10gb": 4, "3g.40gb": 1}},
        {"devices": [1], "mig-enabled": True, "mig-devices": {"7g.80gb": 1}},
    ]
    assert mp.describe(CUT_3G) == "3g.40gb x1 + 1g.10gb x4"


def test_the_catalogue_holds_every_node_layout_and_refuses_what_cannot_fit() -> None:
    cat = mp.catalogue("H100-80GB", [1, 2])
    assert len(cat["mig-configs"]) == 38 + 38**2
    got = mp.read_configs(cat)
    assert mp.node_counts(got[mp.config_name([CUT_3G])], 1) == (CUT_3G,)
    assert mp.missing(got, "H100-80GB", [1, 2]) == []
    with pytest.raises(mp.MigPartedError, match=r"8 GPUs need 38\*\*8 .*mig.dynamic: false"):
        mp.catalogue("H100-80GB", [8])


def test_a_given_file_is_checked_naming_what_it_lacks() -> None:
    cat = mp.catalogue("H100-80GB", [1])
    gone = mp.config_name([CUT_3G])
    del cat["mig-configs"][gone]
    assert mp.missing(mp.read_configs(cat), "H100-80GB", [1]) == [
        f"{gone} (GPU 0: 3g.40gb x1 + 1g.10gb x4)"
    ]
    with pytest.raises(mp.MigPartedError, match=r"mig-configs.x\[0\].devices"):
        mp.read_configs({"version": "v1", "mig-configs": {"x": [{"devices": "some"}]}})
    with pytest.raises(mp.MigPartedError, match="version: v1"):
        mp.read_configs({"mig-configs": {}})


def test_the_verb_prints_a_configmap_and_checks_a_file(tmp_path: Path) -> None:
    runner = CliRunner()
    out = runner.invoke(app, ["k8s", "mig-config", "--model", "H100-80GB", "--gpus-per-node", "1"])
    assert out.exit_code == 0, out.output
    cm = yaml.safe_load(out.output)
    assert cm["kind"] == "ConfigMap" and cm["metadata"]["namespace"] == "gpu-operator"
    inner = yaml.safe_load(cm["data"]["config.yaml"])
    assert inner["version"] == "v1" and mp.config_name([CUT_3G]) in inner["mig-configs"]
    good = tmp_path / "cm.yaml"
    good.write_text(out.output)
    args = ["k8s", "mig-config", "--model", "H100-80GB", "--gpus-per-node", "1", "--check"]
    assert runner.invoke(app, [*args, str(good)]).exit_code == 0
    del inner["mig-configs"][mp.config_name([CUT_3G])]
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(inner))
    res = runner.invoke(app, [*args, str(bad)])
    assert res.exit_code == 1 and "missing: " + mp.config_name([CUT_3G]) in res.output
    res = runner.invoke(app, ["k8s", "mig-config", "--model", "V100", "--gpus-per-node", "1"])
    assert res.exit_code == 2 and "not a MIG model" in res.output
