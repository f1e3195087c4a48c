"""``gpufence k8s run --mig-configmap``: a value that is not NAMESPACE/NAME is refused before
anything else is read, naming the flag and an example."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from gpufence.cli.k8s_verbs import k8s_app


@pytest.mark.parametrize("value", ["gpufence-mig-parted", "/name", "ns/", "a/b/c"])
def test_a_configmap_that_is_not_namespace_slash_name_is_refused(value: str) -> None:
    result = CliRunner().invoke(
        k8s_app, ["run", "--config", "/nonexistent.yaml", "--mig-configmap", value]
    )
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.replace("│", " ").split())  # (rich's error box folds lines)
    assert "--mig-configmap" in said, said
    assert "give NAMESPACE/NAME, e.g. gpu-operator/gpufence-mig-parted" in said, said
