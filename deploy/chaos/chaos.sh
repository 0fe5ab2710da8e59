#!/usr/bin/env bash
# Fault injection for the docker-compose cluster (docker-compose.yml), the faults F1-F6
# of docs/operations.md ("Fault injection"). Run it from anywhere while the cluster is up, with a
# steady acks=all load and consumers running, and check afterwards that nothing acknowledged
# was lost (`tidelog consume ... --from-beginning`, `tidelog topics describe`).
#
#   deploy/chaos/chaos.sh [-n] COMMAND [ARGS]
#
#   F1  bounce BROKER                 clean bounce: SIGTERM (controlled shutdown), wait until the
#                                     container exited, start it, wait until healthy
#   F2  hard-bounce BROKER [SECONDS]  SIGKILL, stay down SECONDS (default 25: past the 18 s
#                                     ZooKeeper session of the example configs), start, wait healthy
#   F3  kill-controller [SECONDS]     SIGKILL the broker holding /controller, then as F2
#   F4  cut-off BROKER [SECONDS]      disconnect the broker from the network for SECONDS (default
#                                     40: past replica.lag.time.max.ms, so its ISRs shrink), reconnect
#   F5  isolate-leader TOPIC PARTITION [SECONDS]
#                                     cut off the partition's leader (from ZooKeeper and followers
#                                     alike) for SECONDS (default 40), reconnect
#   F6  pause BROKER [SECONDS]        freeze the broker (docker pause) past its ZooKeeper session
#                                     (default 25 s): a zombie leader when it resumes
#       signal BROKER SIGNAL          docker kill -s SIGNAL (e.g. STOP, CONT, TERM, KILL)
#       controller                    print the id of the broker holding /controller
#       leader TOPIC PARTITION        print the id of the partition's leader
#       status                        containers, health, and `tidelog health` of every broker
#
# BROKER is a broker id (1, 2, 3). -n (or CHAOS_DRY_RUN=1) prints the docker commands instead
# of running them (queries still run). Settings (environment): CHAOS_CONTAINER_PREFIX
# (default tidelog-broker-: the compose file's container_name), CHAOS_NETWORK (default
# tidelog), CHAOS_HEALTHY_TIMEOUT (seconds, default 180), DOCKER (default docker).
#
# A network cut with `docker network disconnect` separates the broker from everyone,
# ZooKeeper included. F4 needs only a follower cut from its leader; here the
# follower is cut off from everything, which shrinks the same ISRs and, if it lasts longer
# than the ZooKeeper session, also deregisters the broker. For F5 that is exactly the fault.
set -euo pipefail

DOCKER=${DOCKER:-docker}
PREFIX=${CHAOS_CONTAINER_PREFIX:-tidelog-broker-}
NETWORK=${CHAOS_NETWORK:-tidelog}
HEALTHY_TIMEOUT=${CHAOS_HEALTHY_TIMEOUT:-180}
DRY_RUN=${CHAOS_DRY_RUN:-0}

say() { printf '[chaos %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { printf 'chaos: %s\n' "$*" >&2; exit 2; }
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 2; }

# A docker command that changes something: printed, and run unless dry-running.
act() {
    say "$DOCKER $*"
    if [ "$DRY_RUN" != 1 ]; then "$DOCKER" "$@"; fi
}
pause_for() {
    say "waiting $1 s"
    if [ "$DRY_RUN" != 1 ]; then sleep "$1"; fi
}

container() {
    [[ "$1" =~ ^[0-9]+$ ]] || die "BROKER must be a broker id, got '$1'"
    printf '%s%s' "$PREFIX" "$1"
}

# Any running broker container, to run queries in (`tidelog` is in the image).
query_container() {
    local c
    for c in $("$DOCKER" ps --format '{{.Names}}' --filter "name=^${PREFIX}"); do
        printf '%s' "$c"
        return 0
    done
    die "no running container named ${PREFIX}*"
}

controller_id() {
    local out
    # --config: the broker's own listener and credentials (the listeners use SASL_SSL)
    out=$("$DOCKER" exec "$(query_container)" tidelog health --config /etc/tidelog/broker.toml) || true
    [[ "$out" =~ controller\ ([0-9]+) ]] || die "cannot tell the controller from: $out"
    printf '%s' "${BASH_REMATCH[1]}"
}

leader_id() {
    local topic=$1 partition=$2 line
    line=$("$DOCKER" exec "$(query_container)" tidelog topics describe "$topic" \
        | grep -E "Partition: ${partition}([^0-9]|$)" | head -1) || true
    [[ "$line" =~ Leader:\ (-?[0-9]+) ]] || die "cannot find the leader of $topic-$partition in: $line"
    [ "${BASH_REMATCH[1]}" -ge 0 ] || die "$topic-$partition has no leader"
    printf '%s' "${BASH_REMATCH[1]}"
}

wait_exited() {
    [ "$DRY_RUN" = 1 ] && return 0
    local c=$1 deadline=$((SECONDS + HEALTHY_TIMEOUT))
    while [ "$("$DOCKER" inspect -f '{{.State.Running}}' "$c")" = true ]; do
        [ $SECONDS -lt $deadline ] || die "$c still running after ${HEALTHY_TIMEOUT} s"
        sleep 1
    done
    say "$c exited with status $("$DOCKER" inspect -f '{{.State.ExitCode}}' "$c")"
}

wait_healthy() {
    [ "$DRY_RUN" = 1 ] && return 0
    local c=$1 deadline=$((SECONDS + HEALTHY_TIMEOUT)) status
    while true; do
        status=$("$DOCKER" inspect -f '{{if .State.Health}}{{.State.Health.Status}}{{else}}none{{end}}' "$c")
        [ "$status" = healthy ] && { say "$c is healthy"; return 0; }
        [ $SECONDS -lt $deadline ] || die "$c not healthy after ${HEALTHY_TIMEOUT} s (status: $status)"
        sleep 2
    done
}

bounce() {  # F1
    local c; c=$(container "$1")
    act kill -s TERM "$c"
    wait_exited "$c"
    act start "$c"
    wait_healthy "$c"
}

hard_bounce() {  # F2
    local c; c=$(container "$1")
    act kill -s KILL "$c"
    pause_for "${2:-25}"
    act start "$c"
    wait_healthy "$c"
}

cut_off() {  # F4, F5
    local c; c=$(container "$1")
    act network disconnect "$NETWORK" "$c"
    pause_for "${2:-40}"
    # reconnect under the service's name, so that broker-N resolves again in the network
    act network connect --alias "broker-$1" "$NETWORK" "$c"
    wait_healthy "$c"
}

freeze() {  # F6
    local c; c=$(container "$1")
    act pause "$c"
    pause_for "${2:-25}"
    act unpause "$c"
    wait_healthy "$c"
}

status() {
    "$DOCKER" ps -a --filter "name=^${PREFIX}" --format '{{.Names}}\t{{.Status}}'
    local c
    for c in $("$DOCKER" ps --format '{{.Names}}' --filter "name=^${PREFIX}"); do
        "$DOCKER" exec "$c" tidelog health --config /etc/tidelog/broker.toml || true
    done
}

while getopts "nh" opt; do
    case $opt in
        n) DRY_RUN=1 ;;
        *) usage ;;
    esac
done
shift $((OPTIND - 1))
[ $# -ge 1 ] || usage
cmd=$1
shift
case "$cmd" in
    bounce) [ $# -eq 1 ] || usage; bounce "$1" ;;
    hard-bounce) [ $# -ge 1 ] || usage; hard_bounce "$1" "${2:-25}" ;;
    kill-controller) id=$(controller_id); say "controller is broker $id"; hard_bounce "$id" "${1:-25}" ;;
    cut-off) [ $# -ge 1 ] || usage; cut_off "$1" "${2:-40}" ;;
    isolate-leader) [ $# -ge 2 ] || usage; id=$(leader_id "$1" "$2"); say "leader of $1-$2 is broker $id"
        cut_off "$id" "${3:-40}" ;;
    pause) [ $# -ge 1 ] || usage; freeze "$1" "${2:-25}" ;;
    signal) [ $# -eq 2 ] || usage; act kill -s "$2" "$(container "$1")" ;;
    controller) controller_id; echo ;;
    leader) [ $# -eq 2 ] || usage; leader_id "$1" "$2"; echo ;;
    status) status ;;
    *) usage ;;
esac
