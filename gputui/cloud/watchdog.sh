#!/bin/sh
# gputui-watchdog: this instance powers itself off (and, launched by gputui with
# InstanceInitiatedShutdownBehavior=terminate, is terminated) when the master's lease has
# passed, the cluster's budget time has come, it has been idle too long, or it has lived
# its maximum life. It needs no master, no Python and no inbound connection: POSIX sh and
# curl (or wget). gputui's user data installs it; it reads the instance's tags from the
# metadata service (IMDSv2), all Unix seconds or seconds:
#
#   gputui:lease-until    renewed by the master while it wants the instance
#   gputui:budget-until   when the cluster's budget runs out at the prices of the last renewal
#   gputui:max-until      launch + [cloud] max_hours (absent: no limit)
#   gputui:idle-seconds   [cluster] idle_stop_minutes (0: never)
#
# The reason goes to the console, which the cloud's get_console_output shows:
#   gputui-watchdog: stopping: lease|budget|idle|max_hours (details)
#
# When the metadata service cannot be read, nothing stops on that account alone: the last
# values read stay in force, so the instance stops once the last lease read has passed.
#
# Environment (the defaults suit an EC2 instance; tests change them):
#   GPUTUI_WATCHDOG_IMDS        metadata service (http://169.254.169.254)
#   GPUTUI_WATCHDOG_INTERVAL    seconds between checks (30)
#   GPUTUI_WATCHDOG_STATE       directory of the values last read (/var/lib/gputui-watchdog)
#   GPUTUI_WATCHDOG_POWEROFF    the power-off command, run by sh -c with GPUTUI_WATCHDOG_REASON
#                               set (default: shutdown -h now, else poweroff)
#   GPUTUI_WATCHDOG_NOW         a file holding the time in Unix seconds (default: the clock)
#   GPUTUI_WATCHDOG_CONSOLE     where the reason is written ("/dev/console /dev/kmsg")
#   GPUTUI_WATCHDOG_PROC        where processes are listed (/proc)
#   GPUTUI_WATCHDOG_NVIDIA_SMI  nvidia-smi (none there: the GPUs count as idle)
#   GPUTUI_WATCHDOG_HTTP        curl or wget (default: curl if there is one)
#   GPUTUI_WATCHDOG_ONCE        1: check once, then exit 0 (nothing to do) or 10 (powered off)
#   GPUTUI_WATCHDOG_LEASE_UNTIL, _MAX_UNTIL, _IDLE_SECONDS: values in force until the first
#                               read (the user data sets them from the launch's tags)

IMDS=${GPUTUI_WATCHDOG_IMDS:-http://169.254.169.254}
INTERVAL=${GPUTUI_WATCHDOG_INTERVAL:-30}
STATE=${GPUTUI_WATCHDOG_STATE:-/var/lib/gputui-watchdog}
CONSOLE=${GPUTUI_WATCHDOG_CONSOLE-/dev/console /dev/kmsg}
PROC=${GPUTUI_WATCHDOG_PROC:-/proc}
SMI=${GPUTUI_WATCHDOG_NVIDIA_SMI:-nvidia-smi}
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

say() {
    printf '%s\n' "$1"
    for dev in $CONSOLE; do
        if [ -w "$dev" ]; then
            printf '%s\n' "$1" >>"$dev" 2>/dev/null
        fi
    done
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

# http METHOD URL OUTFILE [HEADER]: prints the status code (000: no answer)
http() {
    if [ "$HTTP" = curl ]; then
        if [ -n "$4" ]; then
            curl -s -m 3 -X "$1" -o "$3" -w '%{http_code}' -H "$4" "$2" 2>/dev/null || echo 000
        else
            curl -s -m 3 -X "$1" -o "$3" -w '%{http_code}' "$2" 2>/dev/null || echo 000
        fi
        return
    fi
    if [ "$1" = PUT ]; then
        wget -q -S -T 3 -t 1 --method=PUT --header="$4" -O "$3" "$2" 2>"$3.h"
    else
        wget -q -S -T 3 -t 1 --header="$4" -O "$3" "$2" 2>"$3.h"
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
    for name in lease-until budget-until max-until idle-seconds; do
        code=$(http GET "$IMDS/latest/meta-data/tags/instance/gputui:$name" "$tmp" "X-aws-ec2-metadata-token: $token")
        case $code in
            200)
                if value=$(number "$(cat "$tmp")"); then
                    echo "$value" >"$STATE/$name"
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
    util=$($SMI --query-gpu=utilization.gpu --format=csv,noheader,nounits 2>/dev/null) || return 1
    for u in $util; do
        u=$(number "$u") || continue
        [ "$u" -ge "$IDLE_UTIL_PCT" ] && return 0
    done
    return 1
}

power_off() {
    GPUTUI_WATCHDOG_REASON=$1
    export GPUTUI_WATCHDOG_REASON
    if [ -n "$GPUTUI_WATCHDOG_POWEROFF" ]; then
        sh -c "$GPUTUI_WATCHDOG_POWEROFF"
    else
        shutdown -h now "$PREFIX: $1" 2>/dev/null || poweroff
    fi
}

# stop REASON DETAILS: say why, then power off; returns the power-off command's status
stop() {
    say "$PREFIX: stopping: $1 ($2)"
    echo "$1" >"$STATE/stopped"
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
        echo "$t" >"$STATE/read-at"
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
    budget=$(stored budget-until)
    lease=$(stored lease-until)
    max=$(stored max-until)
    idle=$(stored idle-seconds)
    if busy; then
        echo "$t" >"$STATE/busy-at"
    fi
    busy_at=$(stored busy-at)
    reason=""
    if [ -n "$budget" ] && [ "$t" -ge "$budget" ]; then
        reason=budget detail="budget time $budget reached at $t$note"
    elif [ -n "$lease" ] && [ "$t" -ge "$lease" ]; then
        reason=lease detail="lease ended at $lease, now $t$note"
    elif [ -n "$max" ] && [ "$t" -ge "$max" ]; then
        reason=max_hours detail="maximum life ended at $max, now $t"
    elif [ -n "$idle" ] && [ "$idle" -gt 0 ] && [ $((t - ${busy_at:-$t})) -ge "$idle" ]; then
        reason=idle detail="no gputui run and GPUs under ${IDLE_UTIL_PCT}% since $busy_at, now $t"
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
        "idle-seconds:$GPUTUI_WATCHDOG_IDLE_SECONDS" "busy-at:$start"; do
        name=${pair%%:*}
        if [ ! -s "$STATE/$name" ] && value=$(number "${pair#*:}"); then
            echo "$value" >"$STATE/$name"
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
