#!/usr/bin/env bash
# A private Docker daemon that leaves the host alone: its own data root, exec root, pid file and socket under
# DIR, no bridge, no iptables rules, no ip_forward change, no host daemon.json. Containers must then run with
# `--network host`. Needs root and Debian's docker.io (apt-get install -y docker.io).
#
#   deploy/ci/dockerd.sh start DIR    # prints `export DOCKER_HOST=unix://DIR/docker.sock`
#   deploy/ci/dockerd.sh stop DIR     # stops the daemon by its PID, unmounts, removes DIR
#
# A plain `dockerd` would add iptables chains, set the FORWARD policy to DROP and turn on ip_forward.
set -euo pipefail

usage() { echo "usage: $0 start|stop DIR" >&2; exit 2; }
[ $# -eq 2 ] || usage
action=$1
dir=$(realpath -m "$2")
sock="unix://$dir/docker.sock"

start() {
    command -v dockerd >/dev/null || { echo "dockerd missing: apt-get install -y docker.io" >&2; exit 1; }
    [ "$(id -u)" = 0 ] || { echo "dockerd needs root" >&2; exit 1; }
    if [ -f "$dir/docker.pid" ] && kill -0 "$(cat "$dir/docker.pid")" 2>/dev/null; then
        echo "a daemon already runs for $dir (pid $(cat "$dir/docker.pid"))" >&2
        exit 1
    fi
    mkdir -p "$dir/data" "$dir/exec"
    echo '{}' >"$dir/daemon.json"  # ignore the host's /etc/docker/daemon.json
    # setsid: the daemon gets its own session, so a Ctrl-C aimed at the caller does not reach it.
    setsid dockerd --config-file "$dir/daemon.json" --data-root "$dir/data" --exec-root "$dir/exec" \
        --pidfile "$dir/docker.pid" -H "$sock" --bridge=none --iptables=false --ip6tables=false \
        --ip-forward=false --ip-masq=false >"$dir/dockerd.log" 2>&1 </dev/null &
    for _ in $(seq 1 120); do
        if docker -H "$sock" version >/dev/null 2>&1; then
            echo "export DOCKER_HOST=$sock"
            return 0
        fi
        sleep 0.5
    done
    echo "dockerd did not answer on $sock within 60 s; its log:" >&2
    tail -n 20 "$dir/dockerd.log" >&2
    stop
    exit 1
}

stop() {
    if [ -f "$dir/docker.pid" ]; then
        pid=$(cat "$dir/docker.pid")
        if kill -0 "$pid" 2>/dev/null; then
            kill -TERM "$pid"
            for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
            if kill -0 "$pid" 2>/dev/null; then
                echo "dockerd $pid ignored SIGTERM for 30 s; sending SIGKILL" >&2
                kill -KILL "$pid" 2>/dev/null || true
            fi
        fi
    fi
    # The network namespace file and any leftover overlay mounts keep DIR busy: unmount, deepest first.
    if [ -d "$dir" ]; then
        awk -v d="$dir/" 'index($2, d) == 1 {print $2}' /proc/mounts | sort -r | while read -r mnt; do
            umount "$mnt" 2>/dev/null || umount -l "$mnt"
        done
        rm -rf "$dir"
    fi
}

case $action in
    start) start ;;
    stop) stop ;;
    *) usage ;;
esac
