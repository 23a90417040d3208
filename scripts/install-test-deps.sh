#!/bin/sh
# System packages the test suite starts for real: OpenSSH's sshd (remote slaves on
# loopback) and tmux (the dashboard driven in a real terminal). Debian/Ubuntu; run as root.
set -eu
missing=""
[ -x /usr/sbin/sshd ] || missing="$missing openssh-server"
command -v tmux >/dev/null 2>&1 || missing="$missing tmux"
if [ -n "$missing" ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq $missing
fi
