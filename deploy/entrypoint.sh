#!/bin/sh
# Container entry point of the hushnet image: configure `hushnet bootstrap serve` or
# `hushnet node serve` from HUSHNET_* environment variables (twelve-factor style, so the same
# image serves docker-compose, Swarm and Kubernetes), then exec it so tini (PID 1) delivers
# SIGTERM straight to hushnet, which leaves the network cleanly.
#
#   hushnet-entrypoint bootstrap   run the bootstrap (CA, membership, topology)
#   hushnet-entrypoint node        run a node
#   hushnet-entrypoint hushnet ... / any other command: exec it unchanged (e.g. `hushnet status`)
#
# Variables (all optional unless marked; full reference in deploy/README.md):
#   HUSHNET_STATE_DIR   state directory (default /var/lib/hushnet; mount a volume here)
#   HUSHNET_JOIN_DIR    where the bootstrap publishes ca.pem + join_token for nodes on the same
#                       host (default /var/lib/hushnet-join; a shared volume in docker-compose)
#   HUSHNET_LISTEN      bootstrap default 0.0.0.0:7400, node default 0.0.0.0:7500
#   HUSHNET_TOPOLOGY    bootstrap: graph SPEC (required on first start), e.g. ring:4
#   HUSHNET_LEASE       bootstrap: membership lease in seconds
#   HUSHNET_TOKEN       join token (bootstrap: set/replace it; node: present it)
#   HUSHNET_TOKEN_FILE  file holding the join token (e.g. /run/secrets/hushnet_token)
#   HUSHNET_BOOTSTRAP   node: bootstrap HOST:PORT (default bootstrap:7400)
#   HUSHNET_CA_FILE     node: network CA (default $HUSHNET_JOIN_DIR/ca.pem)
#   HUSHNET_ADVERTISE   node: address published to peers (default: this container's IP + port)
#   HUSHNET_NODE_ID     node: requested id (default assigned by the bootstrap: n<vertex>)
#   HUSHNET_NODES_PER_CONTAINER  node: K nodes hosted by this one container (default 1): node i
#                       listens on PORT+i, is advertised at this container's IP + PORT+i, keeps
#                       its state in $HUSHNET_STATE_DIR/node-00i (`hushnet node serve --count K`)
#   HUSHNET_MAX_NODES, HUSHNET_FDS_PER_NODE   node host: --max-nodes / --fds-per-node
#   HUSHNET_MAX_MESSAGE_MB, HUSHNET_JOIN_TIMEOUT   node: passed to `hushnet node serve`
#   HUSHNET_WAIT_FILES  node: seconds to wait for the CA/token files on first start (default 120)
#   HUSHNET_DATA_PATH   node: local data for runs, <vertex> / <node_id> filled in after the join
#                       (e.g. /data/node-<vertex>.npz); HUSHNET_BUDGET_EPSILON / _DELTA: its budget
#   HUSHNET_LOG_JSON    1/true: one JSON object per log line;  HUSHNET_LOG_LEVEL: INFO, DEBUG, ...
set -eu

STATE_DIR="${HUSHNET_STATE_DIR:-/var/lib/hushnet}"
JOIN_DIR="${HUSHNET_JOIN_DIR:-/var/lib/hushnet-join}"
PY="${HUSHNET_PYTHON:-/opt/hushnet/bin/python}"
HUSHNET="${HUSHNET_BIN:-/opt/hushnet/bin/hushnet}"

die() { echo "hushnet-entrypoint: error: $*" >&2; exit 2; }

log_args() {
    case "${HUSHNET_LOG_JSON:-}" in 1|true|yes|on) printf '%s\n' "--log-json" ;; esac
    if [ -n "${HUSHNET_LOG_LEVEL:-}" ]; then printf '%s\n%s\n' "--log-level" "$HUSHNET_LOG_LEVEL"; fi
}

read_token() {  # the token from HUSHNET_TOKEN or HUSHNET_TOKEN_FILE, empty if neither is set
    if [ -n "${HUSHNET_TOKEN:-}" ]; then
        printf '%s' "$HUSHNET_TOKEN"
    elif [ -n "${HUSHNET_TOKEN_FILE:-}" ]; then
        [ -r "$HUSHNET_TOKEN_FILE" ] || die "HUSHNET_TOKEN_FILE=$HUSHNET_TOKEN_FILE is not readable"
        tr -d ' \r\n' < "$HUSHNET_TOKEN_FILE"
    fi
}

check_writable() {
    mkdir -p "$1" 2>/dev/null || true
    [ -d "$1" ] && [ -w "$1" ] || die "state directory $1 is missing or not writable by uid $(id -u): \
mount a volume there (docker-compose: 'volumes:'), owned by this user"
}

container_ip() {  # first IPv4 address of this container (what peers on the network reach)
    "$PY" - <<'PYEOF'
import socket
addrs = [a[4][0] for a in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)]
addrs = [a for a in addrs if not a.startswith("127.")]
print(addrs[0] if addrs else "")
PYEOF
}

role="${1:-node}"
case "$role" in
bootstrap)
    shift
    check_writable "$STATE_DIR"
    if [ -z "${HUSHNET_TOPOLOGY:-}" ] && [ ! -f "$STATE_DIR/bootstrap.sqlite" ]; then
        die "first start of the bootstrap needs HUSHNET_TOPOLOGY (a graph SPEC with one vertex per node, \
e.g. ring:4, hypercube:3, complete:5)"
    fi
    token="$(read_token)"
    # Create (or load) the CA, operator certificate and join token now, so that the public CA
    # certificate and the token can be handed to the nodes before the service starts.
    HUSHNET_INIT_TOKEN="$token" "$PY" -c "import os, pathlib; from hushnet.bootstrap.authority import load_or_create; \
load_or_create(pathlib.Path('$STATE_DIR'), token=os.environ['HUSHNET_INIT_TOKEN'] or None)" \
        || die "cannot initialise the bootstrap state in $STATE_DIR"
    if mkdir -p "$JOIN_DIR" 2>/dev/null && [ -w "$JOIN_DIR" ]; then
        # ca.pem only: the CA *key* never leaves the bootstrap's own volume
        cp "$STATE_DIR/ca.pem" "$JOIN_DIR/ca.pem.tmp" && mv "$JOIN_DIR/ca.pem.tmp" "$JOIN_DIR/ca.pem"
        (umask 077; cp "$STATE_DIR/join_token" "$JOIN_DIR/join_token.tmp") && mv "$JOIN_DIR/join_token.tmp" "$JOIN_DIR/join_token"
    fi
    set -- bootstrap serve --state-dir "$STATE_DIR" --listen "${HUSHNET_LISTEN:-0.0.0.0:7400}" "$@"
    [ -n "${HUSHNET_TOPOLOGY:-}" ] && set -- "$@" --topology "$HUSHNET_TOPOLOGY"
    [ -n "${HUSHNET_LEASE:-}" ] && set -- "$@" --lease "$HUSHNET_LEASE"
    for a in $(log_args); do set -- "$@" "$a"; done
    exec "$HUSHNET" "$@"
    ;;
node)
    shift
    check_writable "$STATE_DIR"
    listen="${HUSHNET_LISTEN:-0.0.0.0:7500}"
    port="${listen##*:}"
    advertise="${HUSHNET_ADVERTISE:-}"
    if [ -z "$advertise" ]; then
        ip="$(container_ip)"
        [ -n "$ip" ] || die "cannot determine this container's IP address; set HUSHNET_ADVERTISE=HOST:PORT"
        advertise="$ip:$port"
    fi
    ca="${HUSHNET_CA_FILE:-$JOIN_DIR/ca.pem}"
    [ -z "${HUSHNET_TOKEN:-}" ] && [ -z "${HUSHNET_TOKEN_FILE:-}" ] && HUSHNET_TOKEN_FILE="$JOIN_DIR/join_token"
    per="${HUSHNET_NODES_PER_CONTAINER:-1}"
    case "$per" in ''|*[!0-9]*) die "HUSHNET_NODES_PER_CONTAINER=$per is not a whole number of nodes" ;; esac
    [ "$per" -ge 1 ] || die "HUSHNET_NODES_PER_CONTAINER must be at least 1, got $per"
    first_identity="$STATE_DIR/identity.json"
    if [ "$per" -gt 1 ]; then
        [ -z "${HUSHNET_NODE_ID:-}" ] || die "HUSHNET_NODE_ID names one node: unset it when \
HUSHNET_NODES_PER_CONTAINER=$per (the bootstrap assigns the ids)"
        first_identity="$STATE_DIR/node-000/identity.json"
    fi
    if [ ! -f "$first_identity" ]; then
        # first start: the CA certificate and the token come from the bootstrap (shared volume)
        # or from secrets; wait for them rather than failing while the bootstrap starts.
        waited=0
        limit="${HUSHNET_WAIT_FILES:-120}"
        while [ ! -r "$ca" ] || { [ -z "${HUSHNET_TOKEN:-}" ] && [ ! -r "$HUSHNET_TOKEN_FILE" ]; }; do
            [ "$waited" -ge "$limit" ] && die "no CA certificate at $ca or no join token \
(HUSHNET_TOKEN / HUSHNET_TOKEN_FILE=${HUSHNET_TOKEN_FILE:-}) after ${limit} s: mount the bootstrap's join \
volume at $JOIN_DIR or provide them as secrets"
            sleep 1
            waited=$((waited + 1))
        done
    fi
    set -- node serve --state-dir "$STATE_DIR" --listen "$listen" --advertise "$advertise" \
        --bootstrap "${HUSHNET_BOOTSTRAP:-bootstrap:7400}" "$@"
    # a node host: K nodes in this process, node i on PORT+i, published at <advertise port>+i
    [ "$per" -gt 1 ] && set -- "$@" --count "$per"
    [ -n "${HUSHNET_MAX_NODES:-}" ] && set -- "$@" --max-nodes "$HUSHNET_MAX_NODES"
    [ -n "${HUSHNET_FDS_PER_NODE:-}" ] && set -- "$@" --fds-per-node "$HUSHNET_FDS_PER_NODE"
    [ -r "$ca" ] && set -- "$@" --ca "$ca"
    # the token goes by file where possible (an argument would show in `ps`)
    if [ -n "${HUSHNET_TOKEN:-}" ]; then
        set -- "$@" --token "$HUSHNET_TOKEN"
    elif [ -r "$HUSHNET_TOKEN_FILE" ]; then
        set -- "$@" --token-file "$HUSHNET_TOKEN_FILE"
    fi
    [ -n "${HUSHNET_NODE_ID:-}" ] && set -- "$@" --node-id "$HUSHNET_NODE_ID"
    [ -n "${HUSHNET_MAX_MESSAGE_MB:-}" ] && set -- "$@" --max-message-mb "$HUSHNET_MAX_MESSAGE_MB"
    [ -n "${HUSHNET_JOIN_TIMEOUT:-}" ] && set -- "$@" --join-timeout "$HUSHNET_JOIN_TIMEOUT"
    for a in $(log_args); do set -- "$@" "$a"; done
    if [ -n "${HUSHNET_DATA_PATH:-}${HUSHNET_BUDGET_EPSILON:-}" ]; then
        # run policy (data shard + budget) once the bootstrap has assigned our vertex
        HUSHNET_STATE_DIR="$STATE_DIR" "$PY" /usr/local/lib/hushnet/node_policy.py &
    fi
    exec "$HUSHNET" "$@"
    ;;
hushnet)
    shift
    exec "$HUSHNET" "$@"
    ;;
*)
    exec "$@"
    ;;
esac
