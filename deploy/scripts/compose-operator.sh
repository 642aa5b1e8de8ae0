#!/bin/sh
# Copy the operator identity out of a docker-compose bootstrap into DIR, so the hushnet CLI and
# the notebook client on this host can drive the network through the published loopback port:
#
#   deploy/scripts/compose-operator.sh ~/.hushnet/compose         (run next to docker-compose.yml)
#   hushnet status --state-dir ~/.hushnet/compose
#   hushnet run start examples/rw_houses.toml --state-dir ~/.hushnet/compose --watch
#
# DIR receives ca.pem, operator.pem, operator.key (0600) and bootstrap.json naming
# 127.0.0.1:$HUSHNET_BOOTSTRAP_PORT (default 7400). Honours COMPOSE_PROJECT_NAME / COMPOSE_FILE
# like docker-compose itself. The operator key is a credential: keep DIR private.
set -eu
DIR="${1:?usage: compose-operator.sh DIR}"
DOCKER="${DOCKER:-docker}"
COMPOSE="${COMPOSE:-docker-compose}"
PORT="${HUSHNET_BOOTSTRAP_PORT:-7400}"

cid="$($COMPOSE ps -q bootstrap 2>/dev/null | head -n 1)"
[ -n "$cid" ] || { echo "compose-operator: no running bootstrap container (docker-compose up first)" >&2; exit 1; }
i=0
until "$DOCKER" exec "$cid" test -f /var/lib/hushnet/operator.key 2>/dev/null; do
    i=$((i + 1))
    [ "$i" -ge 60 ] && { echo "compose-operator: the bootstrap has not created its state after 60 s" >&2; exit 1; }
    sleep 1
done
mkdir -p "$DIR"
chmod 700 "$DIR"
for f in ca.pem operator.pem operator.key; do
    "$DOCKER" cp "$cid:/var/lib/hushnet/$f" "$DIR/$f"
done
chmod 600 "$DIR/operator.key"
printf '{"address": "127.0.0.1:%s"}\n' "$PORT" > "$DIR/bootstrap.json"
echo "operator identity in $DIR (bootstrap 127.0.0.1:$PORT)"
