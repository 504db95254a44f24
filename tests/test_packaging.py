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
