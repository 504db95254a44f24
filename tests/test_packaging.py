"""What a non-editable install (`pip install .`, `pipx install .`) ships: every package."""

from __future__ import annotations

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")

ROOT = Path(__file__).resolve().parent.parent


def test_every_acp_bridge_package_is_listed_for_installation() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    listed = set(config["tool"]["setuptools"]["packages"])
    found = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for init in (ROOT / "acp_bridge").rglob("__init__.py")
    }
    assert found <= listed, f"missing from [tool.setuptools] packages: {sorted(found - listed)}"


def test_the_readme_uninstalls_the_distribution_by_its_name() -> None:
    name = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["name"]
    assert name != "acp-bridge"  # the command's name: pipx would say "Nothing to uninstall"
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert f"pipx uninstall {name}" in readme
    assert f"uv tool uninstall {name}" in readme
