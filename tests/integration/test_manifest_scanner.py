"""checkov, a well-known manifest security scanner, on what `mlenv render` prints: it finds nothing but what a
development environment legitimately needs. Installed in its own venv by `scripts/install.sh scan`.

One checkov run over a directory with one file per cluster (the manifests, and for the template the admin objects
too); every finding not allowed below, for that file, fails the test, and so does an allowance nothing needs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from tests._prereq import require
from tests.helpers import MLENV, ROOT

SCANNER = ROOT / ".cache" / "venv-scan" / "bin" / "checkov"
"""Where scripts/install.sh scan puts it; a checkov on PATH does too."""

ALLOWED = {
    "CKV_K8S_8": "no liveness probe: the container runs `sleep infinity` for people to exec into; there is no "
                 "service to probe, and a restart would kill the training they started",
    "CKV_K8S_9": "no readiness probe: likewise; a pod is ready when its container runs (the headless Service "
                 "publishes not-ready addresses for the rendezvous anyway)",
    "CKV_K8S_15": "imagePullPolicy IfNotPresent, not Always: CUDA images are many GB and every node reuses the "
                  "copy it has; Always asks the registry at every pod start, so a slow or rate-limited registry "
                  "(nvcr.io) would keep pods from starting",
    "CKV_K8S_22": "writable root filesystem: a development environment installs packages (pip, apt) and writes "
                  "caches where tools expect them",
    "CKV_K8S_40": "no runAsUser above 10000: on OpenShift the platform assigns one from the namespace's range "
                  "(runAsNonRoot: true is set); on Kubernetes the image's user unless security.run_as_user says",
    "CKV_K8S_43": "image by tag, not digest: the cluster file names the image as people do (nvcr.io/nvidia/"
                  "pytorch:25.01-py3); pinning a digest is the file author's choice",
}
IPC_LOCK = {"CKV_K8S_25": "an added capability: IPC_LOCK, only when the file sets security.ipc_lock: true, so RDMA "
                          "can pin (lock) memory for its transfers"}
CLUSTERS = {  # file written, cluster file, mode, also the admin objects, the findings allowed there
    "barcelona.yaml": ("barcelona", "rdma", False, set(ALLOWED)),
    "nerc-production.yaml": ("nerc-production", "tcp", False, set(ALLOWED)),
    "template.yaml": (str(ROOT / "clusters" / "template.yaml"), "rdma", True, {*ALLOWED, *IPC_LOCK}),
}


def _scanner() -> str:
    on_path = shutil.which("checkov")
    if on_path:
        return on_path
    require(str(SCANNER))  # fails under CI=true when `scripts/install.sh scan` did not run
    return str(SCANNER)


def _render(directory: Path) -> None:
    """One file per cluster: what the real `mlenv render` prints (and `render --admin` where asked)."""
    for name, (cluster, mode, admin, _) in CLUSTERS.items():
        argv = [str(MLENV), "render", cluster, "--mode", mode]
        texts = [subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120, check=True).stdout
                 for command in [argv, *([[*argv, "--admin"]] if admin else [])]]
        (directory / name).write_text("".join(texts))


def test_checkov_finds_only_what_a_development_environment_needs(tmp_path: Path) -> None:
    checkov = _scanner()
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    _render(manifests)
    scan = subprocess.run([checkov, "--directory", str(manifests), "--framework", "kubernetes", "--skip-download",
                           "--quiet", "--compact", "--output", "json"], capture_output=True, text=True, timeout=600,
                          check=False, cwd=tmp_path, env={**os.environ, "BC_SKIP_MAPPING": "TRUE"})
    assert scan.returncode in (0, 1), scan.stderr  # 1: findings (checked below); anything else: checkov failed
    report = json.loads(scan.stdout)
    assert report["summary"]["parsing_errors"] == 0 and report["summary"]["passed"] > 0, report["summary"]
    failed = report["results"]["failed_checks"]
    titles = {check["check_id"]: f"{check['check_name']} ({check['resource']})" for check in failed}
    found: dict[str, set[str]] = {name: set() for name in CLUSTERS}
    for check in failed:
        found[Path(check["file_path"]).name].add(check["check_id"])
    for name, (_, _, _, allowed) in CLUSTERS.items():
        assert found[name] <= allowed, f"{name}: {[titles[check] for check in sorted(found[name] - allowed)]}"
        assert found[name] == allowed, f"{name}: allowed but no longer found, drop: {sorted(allowed - found[name])}"
