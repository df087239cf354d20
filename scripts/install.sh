#!/usr/bin/env bash
# Set up everything mlenv needs on this machine, idempotently:
#   scripts/install.sh            venv + mlenv (editable) + dev tools
#   scripts/install.sh train      ... + torch (CPU) + deepspeed
#   scripts/install.sh system     ... + Debian packages (rsync, iproute2; Slurm, munge and sshd for the tests of
#                                 those backends; shellcheck for make lint) and kubectl when missing
#   scripts/install.sh shellcheck ... + Debian's shellcheck alone (what make lint needs beyond the venv)
#   scripts/install.sh scan       ... + checkov (the manifest security scanner) in its own venv, .cache/venv-scan
# Each step is skipped when already done.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY=${PYTHON:-python3}

step() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

# apt_install PACKAGE...: the Debian packages, as root; otherwise a line asking for them
apt_install() {
  if [ "$(id -u)" = 0 ]; then
    step "installing Debian packages: $*"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
  else
    echo "mlenv: please install $* (not root, cannot apt-get)" >&2
  fi
}

if [ ! -x "$VENV/bin/python" ]; then
  step "creating $VENV"
  "$PY" -m venv "$VENV"
fi

stamp="$VENV/.mlenv-$(sha256sum pyproject.toml | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  step "installing mlenv (editable) with dev tools"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check -e '.[dev]'
  touch "$stamp"
fi

for what in "$@"; do
  case "$what" in
    train)
      if ! "$VENV/bin/python" -c 'import torch, deepspeed' 2>/dev/null || [ ! -x "$VENV/bin/py-spy" ]; then
        step "installing torch 2.13.0 (CPU), deepspeed and py-spy (a few minutes the first time)"
        "$VENV/bin/pip" install --quiet --disable-pip-version-check 'torch==2.13.0' 'deepspeed==0.19.8' \
          'py-spy==0.4.3'
      fi
      # DeepSpeed's CPU collectives are a C++ extension built on first use in TORCH_EXTENSIONS_DIR behind a lock file:
      # a build killed half-way leaves the lock, and every DeepSpeed job after it waits on it for ever. Built once
      # here, before any job (a lock without the built module is such a leftover: nothing else builds it now).
      extensions=${TORCH_EXTENSIONS_DIR:-$PWD/.cache/torch_extensions}
      if ! ls "$extensions"/deepspeed_shm_comm/*.so >/dev/null 2>&1; then
        step "building DeepSpeed's CPU collectives (once, about a minute)"
        rm -f "$extensions/deepspeed_shm_comm/lock"
        TORCH_EXTENSIONS_DIR=$extensions "$VENV/bin/python" -c \
          'from deepspeed.accelerator import get_accelerator; get_accelerator().create_op_builder("ShareMemCommBuilder").load()' \
          >/dev/null
      fi
      ;;
    system)
      missing=()
      command -v rsync >/dev/null || missing+=(rsync)
      command -v ip >/dev/null || missing+=(iproute2)
      command -v ssh >/dev/null || missing+=(openssh-client)
      [ -x /usr/sbin/sshd ] || missing+=(openssh-server)
      command -v slurmctld >/dev/null || missing+=(slurm-wlm)
      command -v munged >/dev/null || [ -x /usr/sbin/munged ] || missing+=(munge)
      command -v shellcheck >/dev/null || missing+=(shellcheck)
      [ ${#missing[@]} -eq 0 ] || apt_install "${missing[@]}"
      scripts/install-kubectl.sh "$VENV"
      ;;
    shellcheck)
      command -v shellcheck >/dev/null || apt_install shellcheck
      ;;
    scan)
      # its own venv: checkov's many pinned dependencies never touch mlenv's
      scan_venv=.cache/venv-scan
      if [ ! -f "$scan_venv/.checkov-3.3.30" ]; then
        step "installing checkov 3.3.30 into $scan_venv (a few minutes the first time)"
        "$PY" -m venv "$scan_venv"
        "$scan_venv/bin/pip" install --quiet --disable-pip-version-check 'checkov==3.3.30'
        touch "$scan_venv/.checkov-3.3.30"
      fi
      ;;
    *) echo "install.sh: unknown extra '$what' (train, system, shellcheck, scan)" >&2; exit 2 ;;
  esac
done
