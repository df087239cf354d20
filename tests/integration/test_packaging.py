"""A plain (non-editable) `pip install .` into a fresh virtualenv outside the checkout renders anywhere: the
templates, the CRD schemas and the backends' schema fragments are installed with the package."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = """\
backend: kubernetes
cluster: {name: elsewhere, namespace: ml}
storage: {mode: rwx, class_rwx: nfs-csi}
gpus: {per_node: 2, default_nodes: 2}
"""


def test_pip_install_dot_renders_outside_the_checkout(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--disable-pip-version-check",
                    "-w", str(wheels), str(ROOT)], check=True, capture_output=True, timeout=600)
    environment = tmp_path / "venv"
    venv.create(environment, with_pip=True)
    python = environment / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    str(next(wheels.glob("mlenv-*.whl")))], check=True, capture_output=True, timeout=900)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "cluster.yaml").write_text(CLUSTER)
    env = {key: value for key, value in os.environ.items() if key not in ("MLENV_HOME", "PYTHONPATH")}
    rendered = subprocess.run([str(environment / "bin" / "mlenv"), "render", "cluster.yaml", "--mode", "tcp"],
                              cwd=elsewhere, capture_output=True, text=True, timeout=120, env=env, check=False)
    assert rendered.returncode == 0, rendered.stderr
    assert [obj["kind"] for obj in yaml.safe_load_all(rendered.stdout)] == [
        "ServiceAccount", "PersistentVolumeClaim", "PersistentVolumeClaim", "Service", "NetworkPolicy", "StatefulSet"]
    where = subprocess.run([str(python), "-c", "import mlenv; print(mlenv.__file__)"], capture_output=True,
                           text=True, check=True, cwd=elsewhere, env=env).stdout
    assert where.startswith(str(environment))  # the installed copy, not the checkout
