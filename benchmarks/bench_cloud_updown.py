"""`gputui cloud up --count 4 --yes` then `gputui cloud down --all --yes` against moto.

(a) The two commands, each a fresh `python -m gputui` process exactly as a user runs
    it, against moto's EC2 server started here on 127.0.0.1 (dummy credentials,
    AWS_ENDPOINT_URL; HTTP(S)_PROXY point at a closed port so nothing can reach AWS).
    Waits included: key pair, security group, SSM AMI lookup, run_instances, polling
    until all 4 run with an address, terminate, polling until all are shutting down.
    moto is warmed first (its first request builds the region's backend, ~1.5 s,
    which is moto's cost, not gputui's). Printed against the 10 s target.
(b) How state polling notices a change, on the simulated cloud with a 3 s launch
    delay: gputui's backoff (0.2 s growing by 1.6x to 5 s) against polling with a
    fixed 5 s sleep, both through the same wait function, in the same run.

Usage:
    python benchmarks/bench_cloud_updown.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import statistics
import subprocess
import sys
import shutil
import tempfile
import time
import urllib.request
from pathlib import Path

from gputui.cloud.provider import LaunchRequest, instance_tags
from gputui.cloud.sim import SimProvider, SimScript
from gputui.cloud.waiting import wait_until

TARGET_S = 10.0


def public_key() -> str:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    raw = ed25519.Ed25519PrivateKey.generate().public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return raw.decode() + " bench@gputui"


def gputui(*args: str) -> tuple[float, subprocess.CompletedProcess[str]]:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "gputui", *args], capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)
    return time.perf_counter() - start, done


def updown(repeat: int) -> list[tuple[float, float]]:
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    work = Path(tempfile.mkdtemp(prefix="gputui-bench-cloud-"))
    dead = "http://127.0.0.1:9"
    os.environ.update({
        "AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "AKIABENCHDUMMY000000", "AWS_SECRET_ACCESS_KEY": "bench-dummy",
        "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true", "HTTP_PROXY": dead, "HTTPS_PROXY": dead,
        "NO_PROXY": "127.0.0.1,localhost", "GPUTUI_HOME": str(work / "home"), "GPUTUI_CLOUD": "ec2",
    })
    (work / "id.pub").write_text(public_key() + "\n")
    profile = work / "bench.toml"
    profile.write_text('[cloud]\nregion = "us-east-1"\nzones = ["us-east-1a", "us-east-1b"]\n'
                       'instance_type = "g4dn.xlarge"\npublic_key = "id.pub"\nssh_cidr = "198.51.100.7/32"\n'
                       'ami = "ssm:/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-x86_64"\n'
                       'budget_usd = 50\n')
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    opener.open(f"{endpoint}/?Action=DescribeAvailabilityZones&Version=2016-11-15", timeout=60).read()  # warm moto
    results = []
    try:
        for _ in range(repeat):
            t_up, up = gputui("cloud", "up", "--count", "4", "--yes", "--guard-interval", "1", "--profile", str(profile))
            t_down, down = gputui("cloud", "down", "--all", "--yes", "--profile", str(profile))
            for name, done in (("up", up), ("down", down)):
                if done.returncode != 0:
                    raise SystemExit(f"{name} failed ({done.returncode}): {done.stderr.strip()}")
            results.append((t_up, t_down))
            print(f"up {t_up:.2f} s + down {t_down:.2f} s = {t_up + t_down:.2f} s", flush=True)
        time.sleep(1.5)  # let each run's background guard see the slaves gone and leave
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)  # nothing left in the temporary directory
    return results


def notice_running(delays: "itertools.repeat[float] | None", launch_delay_s: float) -> tuple[float, int]:
    """Seconds from launch until the wait returns, and how many polls it took."""
    sim = SimProvider(script=SimScript(launch_delay_s=launch_delay_s))
    (info,) = sim.launch(LaunchRequest("g4dn.xlarge", 1, "us-east-1a", "spot", "ami-0123456789abcdef0", "k", "sg",
                                       tags=instance_tags("bench", "bench")))
    polls = [0]

    def fetch() -> list[object]:
        polls[0] += 1
        return list(sim.describe([info.instance_id]))

    start = time.perf_counter()
    wait_until(fetch, lambda infos: all(getattr(i, "state") == "running" for i in infos), "running", 60,
               delays=delays)
    return time.perf_counter() - start, polls[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    results = updown(args.repeat)
    totals = [u + d for u, d in results]
    median = statistics.median(totals)
    print(f"(a) up --count 4 + down --all against moto: median {median:.2f} s, worst {max(totals):.2f} s "
          f"(up median {statistics.median(u for u, _ in results):.2f} s, down median "
          f"{statistics.median(d for _, d in results):.2f} s); vs {TARGET_S:.0f} s target: {median / TARGET_S:.2f}x "
          f"(worst {max(totals) / TARGET_S:.2f}x)")
    backoff_s, backoff_polls = notice_running(None, 3.0)
    fixed_s, fixed_polls = notice_running(itertools.repeat(5.0), 3.0)
    print(f"(b) noticing 'running' 3 s after launch: backoff {backoff_s:.2f} s ({backoff_polls} polls), "
          f"fixed 5 s sleeps {fixed_s:.2f} s ({fixed_polls} polls); backoff/fixed = {backoff_s / fixed_s:.2f}")


if __name__ == "__main__":
    main()
