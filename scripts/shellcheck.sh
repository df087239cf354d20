#!/usr/bin/env bash
# make lint's shellcheck (Debian's shellcheck, which scripts/install.sh system installs): every shell program the
# repository tracks, found by name (*.sh) or by its first line (a sh or bash #!). The Slurm templates
# (manifests/slurm/*.j2) are Jinja, which shellcheck cannot parse: their renders are checked instead, the scripts in
# tests/fixtures/slurm/ that tests/unit/test_slurm_render.py keeps byte for byte what the templates render. A finding
# a script means is silenced where it is, with `# shellcheck disable=SCnnnn  # why`.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v shellcheck >/dev/null; then
  echo "error: shellcheck not found: scripts/install.sh system (make install-system) installs Debian's shellcheck" >&2
  exit 1
fi
files=()
shebang='^#!.*[/ ](ba)?sh( |$)'
while IFS= read -r -d '' entry; do  # "MODE OBJECT STAGE<tab>PATH"; regular files only (no links)
  file=${entry#*$'\t'}
  case "$entry" in 100*) ;; *) continue ;; esac
  case "$file" in
    *.j2) ;;
    *.sh) files+=("$file") ;;
    *)
      first=''
      read -r first < "$file" 2>/dev/null || true  # a file of one line without its newline reads too
      if [[ $first =~ $shebang ]]; then files+=("$file"); fi ;;
  esac
done < <(git ls-files -s -z)
shellcheck "${files[@]}"
