#!/bin/sh
# gputui-watchdog: this instance powers itself off (and, launched by gputui with
# InstanceInitiatedShutdownBehavior=terminate, is terminated) when the master's lease has
# passed, the cluster's budget time has come, it has lived its maximum life, training has made
# no progress for too long, or it has been idle too long. It needs no master, no Python and no
# inbound connection: POSIX sh and curl (or wget). gputui's user data installs it; it reads the
# instance's tags from the metadata service (IMDSv2), all Unix seconds or seconds:
#
#   gputui:lease-until      renewed by the master while it wants the instance
#   gputui:budget-until     when the cluster's budget runs out at the prices of the last renewal
#   gputui:max-until        launch + [cloud] max_hours (absent: no limit)
#   gputui:stalled-seconds  [cloud] stalled_minutes (0: never)
#   gputui:idle-seconds     [cluster] idle_stop_minutes (0: never)
#
# The reason goes to the console, which the cloud's get_console_output shows:
#   gputui-watchdog: stopping: lease|budget|max_hours|stalled|idle (details)
#
# Lease, budget and maximum life are decided first, from the values stored, before anything
# that can hang is asked. Every outside command is bounded: the metadata service by its
# client's timeout and `timeout`; nvidia-smi and the /proc scan run in a background probe the
# loop waits for a bounded time and never joins (a GPU that fell off the bus, Xid 79, hangs
# nvidia-smi in the kernel, where no signal reaches it).
#
# Stalled: while a run is registered (a live pid in a gputui home's watched/, where the spot
# watcher registers each cluster node and sweep worker), its node writes Unix seconds to
# heartbeat in the same home at each step event. No heartbeat newer than stalled-seconds (nor
# a run newly registered within it) means training hangs (a hung collective keeps the GPU at
# 100% and the master renewing): the instance powers off.
#
# When the metadata service cannot be read, nothing stops on that account alone: the last
# values read stay in force, so the instance stops once the last lease read has passed. A
# stored limit that is empty or not a number (a write cut short) counts as passed.
#
# Environment (the defaults suit an EC2 instance; tests change them):
#   GPUTUI_WATCHDOG_IMDS        metadata service (http://169.254.169.254)
#   GPUTUI_WATCHDOG_INTERVAL    seconds between checks (30)
#   GPUTUI_WATCHDOG_TIMEOUT     seconds any outside command may take (10)
#   GPUTUI_WATCHDOG_STATE       directory of the values last read (/var/lib/gputui-watchdog)
#   GPUTUI_WATCHDOG_POWEROFF    the power-off command, run by sh -c with GPUTUI_WATCHDOG_REASON
#                               set (default: shutdown -h now, else poweroff)
#   GPUTUI_WATCHDOG_NOW         a file holding the time in Unix seconds (default: the clock)
#   GPUTUI_WATCHDOG_CONSOLE     where the reason is written ("/dev/console /dev/kmsg")
#   GPUTUI_WATCHDOG_PROC        where processes are listed (/proc)
#   GPUTUI_WATCHDOG_NVIDIA_SMI  nvidia-smi (none there: the GPUs count as idle)
#   GPUTUI_WATCHDOG_HOMES       gputui homes, shell patterns ("/root/.gputui-cluster/home
#                               /home/*/.gputui-cluster/home": [cluster] remote_dir's default)
#   GPUTUI_WATCHDOG_HTTP        curl or wget (default: curl if there is one)
#   GPUTUI_WATCHDOG_ONCE        1: check once, then exit 0 (nothing to do) or 10 (powered off)
#   GPUTUI_WATCHDOG_LEASE_UNTIL, _MAX_UNTIL, _IDLE_SECONDS, _STALLED_SECONDS: values in force
#                               until the first read (the user data sets them from the launch's tags)

IMDS=${GPUTUI_WATCHDOG_IMDS:-http://169.254.169.254}
INTERVAL=${GPUTUI_WATCHDOG_INTERVAL:-30}
BOUND=${GPUTUI_WATCHDOG_TIMEOUT:-10}
case $BOUND in '' | *[!0-9]* | 0) BOUND=10 ;; esac
STATE=${GPUTUI_WATCHDOG_STATE:-/var/lib/gputui-watchdog}
CONSOLE=${GPUTUI_WATCHDOG_CONSOLE-/dev/console /dev/kmsg}
PROC=${GPUTUI_WATCHDOG_PROC:-/proc}
SMI=${GPUTUI_WATCHDOG_NVIDIA_SMI:-nvidia-smi}
HOMES=${GPUTUI_WATCHDOG_HOMES:-/root/.gputui-cluster/home /home/*/.gputui-cluster/home}
IDLE_UTIL_PCT=5
PREFIX="gputui-watchdog"
# the metadata service is link-local: never through a proxy
unset http_proxy HTTP_PROXY https_proxy HTTPS_PROXY all_proxy ALL_PROXY

if [ -n "$GPUTUI_WATCHDOG_HTTP" ]; then
    HTTP=$GPUTUI_WATCHDOG_HTTP
elif command -v curl >/dev/null 2>&1; then
    HTTP=curl
else
    HTTP=wget
fi
if command -v timeout >/dev/null 2>&1; then
    TIMEOUT=timeout
else
    TIMEOUT=""
fi

say() {
    printf '%s\n' "$1"
    for dev in $CONSOLE; do
        if [ -w "$dev" ]; then
            printf '%s\n' "$1" >>"$dev" 2>/dev/null
        fi
    done
}

# bounded CMD ARGS...: CMD, sent SIGTERM after BOUND s and SIGKILL 2 s later (as is without `timeout`:
# only commands with their own limit, or run in the probe, go through here)
bounded() {
    if [ -n "$TIMEOUT" ]; then
        "$TIMEOUT" -k 2 "$BOUND" "$@"
    else
        "$@"
    fi
}

now() {
    if [ -n "$GPUTUI_WATCHDOG_NOW" ]; then
        t=$(cat "$GPUTUI_WATCHDOG_NOW" 2>/dev/null)
    else
        t=$(date +%s)
    fi
    t=${t%%.*}
    case $t in '' | *[!0-9]*) t=0 ;; esac
    echo "$t"
}

# number TEXT: the whole seconds in TEXT, or nothing when it is not a number
number() {
    v=${1%%.*}
    case $v in '' | *[!0-9]*) return 1 ;; esac
    echo "$v"
}

# put NAME VALUE: the state file NAME holds VALUE, written whole or not at all (a temporary
# file renamed over it: a power cut or a full disk never leaves it empty or half written)
put() {
    printf '%s\n' "$2" >"$STATE/.$1.tmp" && mv -f "$STATE/.$1.tmp" "$STATE/$1"
}

# http METHOD URL OUTFILE [HEADER]: prints the status code (000: no answer)
http() {
    if [ "$HTTP" = curl ]; then
        if [ -n "$4" ]; then
            bounded curl -s -m 3 -X "$1" -o "$3" -w '%{http_code}' -H "$4" "$2" 2>/dev/null || echo 000
        else
            bounded curl -s -m 3 -X "$1" -o "$3" -w '%{http_code}' "$2" 2>/dev/null || echo 000
        fi
        return
    fi
    if [ "$1" = PUT ]; then
        bounded wget -q -S -T 3 -t 1 --method=PUT --header="$4" -O "$3" "$2" 2>"$3.h"
    else
        bounded wget -q -S -T 3 -t 1 --header="$4" -O "$3" "$2" 2>"$3.h"
    fi
    rc=$?
    code=$(sed -n 's/^ *HTTP\/[0-9.]* \([0-9][0-9][0-9]\).*/\1/p' "$3.h" | tail -n 1)
    rm -f "$3.h"
    if [ -n "$code" ]; then
        echo "$code"
    elif [ $rc -eq 0 ]; then
        echo 200
    else
        echo 000
    fi
}

# read_tags: store every gputui tag found; fails when the service gives no answer
read_tags() {
    tmp="$STATE/reply"
    code=$(http PUT "$IMDS/latest/api/token" "$tmp" "X-aws-ec2-metadata-token-ttl-seconds: 300")
    [ "$code" = 200 ] || return 1
    token=$(cat "$tmp")
    for name in lease-until budget-until max-until idle-seconds stalled-seconds; do
        code=$(http GET "$IMDS/latest/meta-data/tags/instance/gputui:$name" "$tmp" "X-aws-ec2-metadata-token: $token")
        case $code in
            200)
                if value=$(number "$(cat "$tmp")"); then
                    put "$name" "$value"
                fi
                ;;
            404) ;;  # no such tag: what is stored stays
            *) return 1 ;;
        esac
    done
    rm -f "$tmp"
    return 0
}

stored() {
    cat "$STATE/$1" 2>/dev/null
}

# limit NAME: the stored time limit NAME; nothing when there is none, 0 (long passed) when the
# file is there but empty or not a number
limit() {
    [ -e "$STATE/$1" ] || return 0
    number "$(stored "$1")" || echo 0
}

# setting NAME: the stored number of seconds NAME, 0 (off) when absent or not a number
setting() {
    number "$(stored "$1")" || echo 0
}

# small FILE: the first bytes of a regular file (a heartbeat or a registry entry, which their
# owner could have made a fifo or a link to a device)
small() {
    [ -f "$1" ] && [ -r "$1" ] || return 1
    head -c 32 "$1" 2>/dev/null
}

# started PROC PID: the process's start time (field 22 of PROC/PID/stat), nothing when it cannot be read
started() {
    stat=$(head -c 1024 "$1/$2/stat" 2>/dev/null) || return 0
    set -- ${stat##*) }
    [ $# -ge 20 ] && eval "echo \"\${20}\""
}

# training: "REGISTERED HEARTBEAT": whether a registered run lives (1/0), and the newest heartbeat
# of the gputui homes (0: none)
training() {
    registered=0
    beat=0
    for home in $HOMES; do
        [ -d "$home" ] || continue
        for entry in "$home"/watched/[0-9]*; do
            pid=${entry##*/}
            case $pid in '' | *[!0-9]*) continue ;; esac
            [ -d "$PROC/$pid" ] || continue
            # the entry holds the process's start time: a later process with its pid does not count
            recorded=$(small "$entry")
            if [ -n "$recorded" ]; then
                actual=$(started "$PROC" "$pid")
                [ -n "$actual" ] && [ "$actual" != "$recorded" ] && continue
            fi
            registered=1
        done
        if b=$(number "$(small "$home/heartbeat")") && [ "$b" -gt "$beat" ]; then
            beat=$b
        fi
    done
    echo "$registered $beat"
}

# busy: a gputui process other than this watchdog runs, or a GPU is at IDLE_UTIL_PCT or more
busy() {
    for cmd in "$PROC"/[0-9]*/cmdline; do
        [ -r "$cmd" ] || continue
        line=$(tr '\000' ' ' <"$cmd" 2>/dev/null)
        case $line in
            *gputui-watchdog*) ;;
            *gputui*) return 0 ;;
        esac
    done
    command -v "$SMI" >/dev/null 2>&1 || return 1
    util=$(bounded "$SMI" --query-gpu=utilization.gpu --format=csv,noheader,nounits 2>/dev/null) || return 1
    for u in $util; do
        u=$(number "$u") || continue
        [ "$u" -ge "$IDLE_UTIL_PCT" ] && return 0
    done
    return 1
}

# probe: "busy", "idle" or "unknown". busy() runs in the background and is waited for BOUND + 3 s
# at most, never joined: a /proc read behind a process stuck in the driver, or nvidia-smi in
# uninterruptible sleep, holds only the probe. While one probe hangs no other starts.
probe() {
    set -- $(stored probe.pid)
    if [ $# -ge 1 ] && kill -0 "$1" 2>/dev/null && [ "$(started /proc "$1")" = "${2:-}" ]; then
        echo unknown
        return
    fi
    rm -f "$STATE/probe.out"
    (
        if busy; then r=busy; else r=idle; fi
        put probe.out "$r"
    ) </dev/null >/dev/null 2>&1 &
    put probe.pid "$! $(started /proc $!)"
    ticks=$(((BOUND + 3) * 20))
    while [ ! -e "$STATE/probe.out" ] && [ "$ticks" -gt 0 ]; do
        sleep 0.05 2>/dev/null || sleep 1
        ticks=$((ticks - 1))
    done
    if [ -e "$STATE/probe.out" ]; then
        rm -f "$STATE/probe.pid"
        stored probe.out
    else
        echo unknown
    fi
}

power_off() {
    GPUTUI_WATCHDOG_REASON=$1
    export GPUTUI_WATCHDOG_REASON
    if [ -n "$GPUTUI_WATCHDOG_POWEROFF" ]; then
        bounded sh -c "$GPUTUI_WATCHDOG_POWEROFF"
    else
        bounded shutdown -h now "$PREFIX: $1" 2>/dev/null || bounded poweroff
    fi
}

# stop REASON DETAILS: say why, then power off; returns the power-off command's status
stop() {
    say "$PREFIX: stopping: $1 ($2)"
    put stopped "$1"
    if power_off "$1"; then
        return 0
    fi
    say "$PREFIX: the power-off command failed; trying again in ${INTERVAL} s"
    return 1
}

# check: one look; returns 10 when it powered off, 0 otherwise
check() {
    t=$(now)
    if read_tags; then
        put read-at "$t"
        note=""
    else
        last=$(stored read-at)
        note="; metadata service unreachable since ${last:-boot}"
        if [ ! -e "$STATE/unreachable" ]; then
            say "$PREFIX: cannot read the instance's tags from $IMDS; the last lease read stays in force"
            : >"$STATE/unreachable"
        fi
    fi
    [ -z "$note" ] && rm -f "$STATE/unreachable"
    budget=$(limit budget-until)
    lease=$(limit lease-until)
    max=$(limit max-until)
    stalled=$(setting stalled-seconds)
    idle=$(setting idle-seconds)
    reason=""
    # first what needs nothing but the stored values and the clock
    if [ -n "$budget" ] && [ "$t" -ge "$budget" ]; then
        reason=budget detail="budget time $budget reached at $t$note"
    elif [ -n "$lease" ] && [ "$t" -ge "$lease" ]; then
        reason=lease detail="lease ended at $lease, now $t$note"
    elif [ -n "$max" ] && [ "$t" -ge "$max" ]; then
        reason=max_hours detail="maximum life ended at $max, now $t"
    fi
    if [ -z "$reason" ] && [ "$stalled" -gt 0 ]; then
        set -- $(training)
        if [ "$1" = 1 ]; then
            [ -s "$STATE/run-seen-at" ] || put run-seen-at "$t"
            seen=$(setting run-seen-at)
            progress=$2
            [ "$seen" -gt "$progress" ] && progress=$seen
            if [ $((t - progress)) -ge "$stalled" ]; then
                reason=stalled detail="no training progress since $progress, now $t"
            fi
        else
            rm -f "$STATE/run-seen-at"  # the next run's time starts when it registers
        fi
    fi
    if [ -z "$reason" ] && [ "$idle" -gt 0 ]; then
        if [ "$(probe)" = busy ]; then
            put busy-at "$t"
        fi
        busy_at=$(setting busy-at)
        if [ $((t - busy_at)) -ge "$idle" ]; then
            reason=idle detail="no gputui run and GPUs under ${IDLE_UTIL_PCT}% since $busy_at, now $t"
        fi
    elif [ -z "$reason" ]; then
        put busy-at "$t"  # no idle stop: its time starts when one is set
    fi
    if [ -n "$reason" ]; then
        stop "$reason" "$detail" && return 10
    fi
    return 0
}

main() {
    mkdir -p "$STATE" || exit 2
    start=$(now)
    # values in force before the first read, from the user data (kept over a restart)
    for pair in "lease-until:$GPUTUI_WATCHDOG_LEASE_UNTIL" "max-until:$GPUTUI_WATCHDOG_MAX_UNTIL" \
        "idle-seconds:$GPUTUI_WATCHDOG_IDLE_SECONDS" "stalled-seconds:$GPUTUI_WATCHDOG_STALLED_SECONDS" \
        "busy-at:$start"; do
        name=${pair%%:*}
        if [ ! -s "$STATE/$name" ] && value=$(number "${pair#*:}"); then
            put "$name" "$value"
        fi
    done
    while :; do
        check
        rc=$?
        if [ $rc -eq 10 ] || [ "$GPUTUI_WATCHDOG_ONCE" = 1 ]; then
            exit $rc
        fi
        sleep "$INTERVAL"
    done
}

main
