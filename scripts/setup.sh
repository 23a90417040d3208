#!/bin/sh
# Set-up on a fresh Linux machine: a project virtual environment in .venv with gputui and
# the CPU build of torch (pinned, so no multi-GB CUDA wheels are pulled). Works the same on
# a PEP 668 system (Debian 12+, Ubuntu 24.04: nothing is installed into the system Python),
# inside an active venv, as root or not (apt-get goes through sudo when not root).
#
#   sh scripts/setup.sh           gputui in .venv            then: .venv/bin/gputui run
#   sh scripts/setup.sh --test    and what the tests need    then: .venv/bin/python -m pytest -q
#
# GPUTUI_TORCH overrides the torch requirement, e.g. GPUTUI_TORCH=torch on a GPU machine
# (the regular CUDA build). Re-running it is cheap: an existing, working .venv is reused.
set -eu
cd "$(dirname "$0")/.."
tests=0
case "${1:-}" in
  "") ;;
  --test) tests=1 ;;
  *) echo "setup: unknown option '$1' (use --test for the test suite's needs)" >&2; exit 2 ;;
esac
fail() { echo "setup: $*" >&2; exit 2; }
say() { echo "setup: $*"; }
command -v python3 >/dev/null 2>&1 || fail "no python3 on the PATH: install Python 3.10+ (apt-get install python3)"
python3 -c 'import sys; sys.exit(sys.version_info < (3, 10))' || fail "$(python3 -V 2>&1) is too old: gputui needs Python 3.10+"

# System packages: the venv module where the distribution splits it off, and for the tests
# OpenSSH's sshd (slaves on loopback), tmux (the dashboard in a real terminal) and Debian's
# chromium (`gputui serve` in a headless browser).
missing=""
python3 -c 'import ensurepip, venv' 2>/dev/null || missing="python3-venv"
if [ "$tests" = 1 ]; then
  [ -x /usr/sbin/sshd ] || missing="$missing openssh-server"
  command -v tmux >/dev/null 2>&1 || missing="$missing tmux"
  command -v chromium >/dev/null 2>&1 || missing="$missing chromium"
fi
if [ -n "$missing" ]; then
  command -v apt-get >/dev/null 2>&1 || fail "please install:$missing (no apt-get here to do it)"
  if [ "$(id -u)" = 0 ]; then sudo=""
  elif command -v sudo >/dev/null 2>&1; then sudo="sudo"
  else fail "installing$missing needs root: run as root, or install them first"; fi
  say "installing system packages:$missing (apt-get)"
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null
fi

# The project venv (remade if a previous one no longer runs, e.g. its Python was removed).
if ! .venv/bin/python -c '' 2>/dev/null; then
  rm -rf .venv
  say "making the project virtual environment in .venv"
  python3 -m venv .venv || fail "python3 -m venv failed: install the venv module (apt-get install python3-venv)"
fi
extras=""
[ "$tests" = 1 ] && extras="[test]"
export PIP_DISABLE_PIP_VERSION_CHECK=1
if .venv/bin/python -c 'import torch' 2>/dev/null; then
  say "updating gputui${extras:+ and the test tools} in .venv"
else
  say "installing ${GPUTUI_TORCH:-torch==2.13.0 (the CPU build)}, gputui${extras:+ and the test tools} into .venv: about 1 GB the first time, a few minutes"
fi
.venv/bin/python -m pip install -q "${GPUTUI_TORCH:-torch==2.13.0}" -e ".$extras"
say "done: .venv/bin/gputui --help lists the commands"
