"""The Kubernetes example in docs/deployment.md is valid against the Kubernetes schemas.

``kubernetes-validate`` ships the schemas, so this runs offline. Strict mode rejects
unknown fields, which catches misspelt or misplaced keys, not only wrong types.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

DOC = Path(__file__).parent.parent / "docs" / "deployment.md"
# The oldest Kubernetes release still supported upstream when the example was written.
KUBERNETES_VERSION = "1.32.0"


def manifests() -> list[dict[str, Any]]:
    blocks = re.findall(r"^```yaml\n(.*?)^```", DOC.read_text(), flags=re.S | re.M)
    found = [doc for block in blocks for doc in yaml.safe_load_all(block) if doc]
    return [doc for doc in found if isinstance(doc, dict) and "apiVersion" in doc]


def test_the_example_has_the_parts_the_docs_promise() -> None:
    kinds = {doc["kind"]: doc for doc in manifests()}
    assert set(kinds) == {"Secret", "Service", "StatefulSet"}
    pod = kinds["StatefulSet"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["args"][:3] == ["serve", "--listen", "tcp://0.0.0.0:7000"]
    token = next(env for env in container["env"] if env["name"] == "ACP_BRIDGE_TOKEN")
    assert token["valueFrom"]["secretKeyRef"]["name"] == kinds["Secret"]["metadata"]["name"]
    assert "tcpSocket" in container["readinessProbe"]
    assert "tcpSocket" in container["livenessProbe"]
    state = next(m for m in container["volumeMounts"] if m["name"] == "state")
    assert state["mountPath"] == "/home/node/.local/state"
    claims = kinds["StatefulSet"]["spec"]["volumeClaimTemplates"]
    assert [claim["metadata"]["name"] for claim in claims] == ["state"]
    assert pod["securityContext"]["runAsNonRoot"] is True


@pytest.mark.parametrize("manifest", manifests(), ids=lambda doc: doc["kind"])
def test_the_example_is_valid_kubernetes(manifest: dict[str, Any]) -> None:
    kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)


def test_the_validator_rejects_a_misplaced_field() -> None:
    # The check above can fail: an unknown key in a container is an error in strict mode.
    statefulset = next(doc for doc in manifests() if doc["kind"] == "StatefulSet")
    broken = yaml.safe_load(yaml.safe_dump(statefulset))
    broken["spec"]["template"]["spec"]["containers"][0]["probe"] = {"tcpSocket": {"port": 7000}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)
