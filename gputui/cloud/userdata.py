"""The user data every cloud slave boots with: it installs and starts the watchdog
(gputui/cloud/watchdog.sh) as a systemd unit, or as a nohup'd loop where there is no
systemd. Nothing else: no gputui bootstrap, no Python, no inbound port, and nothing
secret (only the watchdog and the numbers of the launch's tags).
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from typing import Mapping

from gputui.cloud.tags import TAG_IDLE, TAG_LEASE, TAG_MAX, TAG_STALLED

INSTALL_PATH = "/usr/local/sbin/gputui-watchdog"
DEFAULTS_PATH = "/etc/default/gputui-watchdog"
UNIT_PATH = "/etc/systemd/system/gputui-watchdog.service"
MARKER = "gputui-watchdog"  # how the simulated cloud knows an instance runs the watchdog
# the user data's environment names for the tags in force before the first read
_DEFAULTS = ((TAG_LEASE, "GPUTUI_WATCHDOG_LEASE_UNTIL"), (TAG_MAX, "GPUTUI_WATCHDOG_MAX_UNTIL"),
             (TAG_IDLE, "GPUTUI_WATCHDOG_IDLE_SECONDS"), (TAG_STALLED, "GPUTUI_WATCHDOG_STALLED_SECONDS"))

UNIT = f"""[Unit]
Description=gputui watchdog: power off once the lease, the budget time, the maximum life, the stalled time or the idle time has passed
After=network-online.target
Wants=network-online.target

[Service]
EnvironmentFile=-{DEFAULTS_PATH}
ExecStart=/bin/sh {INSTALL_PATH}
Restart=always
RestartSec=10
StandardOutput=journal+console
StandardError=journal+console

[Install]
WantedBy=multi-user.target
"""


@lru_cache(maxsize=1)
def watchdog_script() -> str:
    """The watchdog's text, shipped as package data."""
    return resources.files("gputui.cloud").joinpath("watchdog.sh").read_text(encoding="utf-8")


def _heredoc(path: str, text: str, end: str) -> str:
    assert f"\n{end}\n" not in f"\n{text}"
    return f"cat > {path} <<'{end}'\n{text.rstrip()}\n{end}\n"


def user_data(tags: Mapping[str, str]) -> str:
    """The shell script cloud-init runs as root at first boot (16 KB at most on EC2)."""
    defaults = []
    for tag, name in _DEFAULTS:
        value = str(tags.get(tag, ""))
        if value.isdigit():  # numbers only: the tags' other values never reach the file
            defaults.append(f"{name}={value}")
    return (
        "#!/bin/sh\n"
        f"# gputui: install and start {MARKER}, which powers this instance off once the master's lease\n"
        "# (renewed while it wants the instance), the budget time, the idle time or the maximum life has passed.\n"
        "set -u\n"
        f"mkdir -p /usr/local/sbin /etc/default\n"
        + _heredoc(INSTALL_PATH, watchdog_script(), "GPUTUI_WATCHDOG_EOF")
        + f"chmod 0755 {INSTALL_PATH}\n"
        + _heredoc(DEFAULTS_PATH, "\n".join(defaults), "GPUTUI_DEFAULTS_EOF")
        + "if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then\n"
        + _heredoc(UNIT_PATH, UNIT, "GPUTUI_UNIT_EOF")
        + "  systemctl daemon-reload && systemctl enable --now gputui-watchdog.service && exit 0\n"
        "fi\n"
        f"# no systemd: a detached loop, its output on the console\n"
        f"(set -a; . {DEFAULTS_PATH}; set +a; nohup /bin/sh {INSTALL_PATH} >/dev/console 2>&1 </dev/null &)\n"
    )
