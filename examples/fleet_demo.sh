#!/usr/bin/env bash
# A whole fleet on one machine: a signing key, the fleet manager with the Mosquitto it manages
# (no anonymous client: each agent is enrolled with its own account), a few agents running a real
# classifier, and a signed canary rollout of a new model to them, with an API token.
#
#   examples/fleet_demo.sh            # 3 agents
#   examples/fleet_demo.sh --quick    # 2 agents, lighter pipelines (what the test suite runs)
#
# Every step is an `edgeinfer` command a user would type; run with `bash -x` to see them all.
# Everything lives in a temporary folder and every process this script starts is stopped when it
# exits, however it exits (trap). Needs edgeinfer[fleet] and the Debian package mosquitto.
set -euo pipefail

usage() {
    cat <<'EOF'
usage: fleet_demo.sh [--quick] [--agents N] [--workdir DIR] [--keep] [--timeout SECONDS]

  --quick          2 agents at 3 fps (what the tests run)
  --agents N       how many agents (default 3; 2 with --quick)
  --workdir DIR    where keys, databases, configs and logs go (default: a new temporary folder)
  --keep           keep the work folder at the end (it is removed otherwise, unless --workdir is given)
  --timeout S      give up on any waiting step after S seconds (default 120)

Environment: EDGEINFER (the command, default "edgeinfer"; e.g. "python -m edgeinfer"),
EDGEINFER_ASSETS (the shared models and photos, default ../shared/assets next to the repository).
EOF
}

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
QUICK=0
AGENTS=""
WORK=""
KEEP=0
TIMEOUT=120
while [[ $# -gt 0 ]]; do
    case $1 in
        --quick) QUICK=1 ;;
        --agents) AGENTS=${2:?--agents needs a number}; shift ;;
        --workdir) WORK=${2:?--workdir needs a folder}; KEEP=1; shift ;;
        --keep) KEEP=1 ;;
        --timeout) TIMEOUT=${2:?--timeout needs seconds}; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "fleet_demo.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
    esac
    shift
done
if [[ -z $AGENTS ]]; then
    AGENTS=$(( QUICK ? 2 : 3 ))
fi
if ! [[ $AGENTS =~ ^[1-9][0-9]?$ ]]; then
    echo "fleet_demo.sh: --agents must be a number from 1 to 99" >&2
    exit 2
fi
FPS=$(( QUICK ? 3 : 5 ))

# word splitting is wanted: EDGEINFER may be "python -m edgeinfer"
read -r -a EI <<< "${EDGEINFER:-edgeinfer}"
ASSETS=${EDGEINFER_ASSETS:-$HERE/../../shared/assets}
MODEL_V1=$ASSETS/models/mobilenet_v2_1.0_224_quant.tflite
MODEL_V2=$ASSETS/models/mobilenet_v2_1.0_224_inat_bird_quant.tflite
for file in "$MODEL_V1" "$MODEL_V2"; do
    if [[ ! -f $file ]]; then
        echo "fleet_demo.sh: $file not found — set EDGEINFER_ASSETS to the shared assets folder" >&2
        exit 2
    fi
done

if [[ -z $WORK ]]; then
    WORK=$(mktemp -d "${TMPDIR:-/tmp}/edgeinfer-fleet-demo.XXXXXX")
fi
mkdir -p "$WORK"
PIDS=()
FLEET_PID=""

# stop_all PID...: SIGTERM, up to 10 s to finish cleanly, then SIGKILL
stop_all() {
    local pid
    for pid in "$@"; do
        kill -TERM "$pid" 2>/dev/null || true
    done
    for pid in "$@"; do
        for _ in $(seq 100); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
}

cleanup() {
    local status=$?
    trap - EXIT INT TERM
    # the agents (and a running deploy) first, while the broker is still up to take their goodbye;
    # then the fleet manager and its Mosquitto
    local others=() pid
    for pid in ${PIDS[@]+"${PIDS[@]}"}; do
        [[ $pid == "${FLEET_PID:-}" ]] || others+=("$pid")
    done
    stop_all ${others[@]+"${others[@]}"}
    [[ -z ${FLEET_PID:-} ]] || stop_all "$FLEET_PID"
    if [[ $status -ne 0 ]]; then
        echo "fleet_demo.sh: failed (status $status); last lines of the logs in $WORK:" >&2
        tail -n 5 "$WORK"/*.log >&2 2>/dev/null || true
    fi
    if [[ $KEEP -eq 0 ]]; then
        rm -rf "$WORK"
    else
        echo "== kept $WORK" >&2
    fi
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

step() { echo "== $*"; }
ei() { "${EI[@]}" "$@"; }
# a long step runs in the background and is waited for: bash runs a trap only between foreground
# commands, but at once during `wait`; and the cleanup then stops that step too
ei_long() {
    "${EI[@]}" "$@" &
    PIDS+=("$!")
    wait "$!"
}

# wait_for DESCRIPTION COMMAND...: run COMMAND every second until it succeeds or TIMEOUT passes
wait_for() {
    local what=$1 deadline=$(( SECONDS + TIMEOUT ))
    shift
    until "$@"; do
        if (( SECONDS > deadline )); then
            echo "fleet_demo.sh: timed out after ${TIMEOUT}s waiting for $what" >&2
            return 1
        fi
        sleep 1
    done
}

step "1. the fleet's signing key (agents pin its public half; only signed models are accepted)"
ei keys init --dir "$WORK/fleet-data"

step "2. the fleet manager, with the Mosquitto it starts and supervises (port 0: pick free ports)"
# (no shell function in front of a background command: $! must be the process itself, for the trap)
"${EI[@]}" fleet serve --broker-port 0 --http 127.0.0.1:0 --data-dir "$WORK/fleet-data" > "$WORK/fleet.log" 2>&1 &
FLEET_PID=$!
PIDS+=("$FLEET_PID")
manager_up() {
    if ! kill -0 "$FLEET_PID" 2>/dev/null; then
        echo "fleet_demo.sh: the fleet manager exited" >&2
        exit 1
    fi
    grep -q '^fleet manager: ' "$WORK/fleet.log"
}
wait_for "the fleet manager to start" manager_up
# "fleet manager: managed Mosquitto mqtt://127.0.0.1:PORT, HTTP http://127.0.0.1:PORT, data DIR"
BROKER=$(sed -n 's/^fleet manager: [^,]* \(mqtts\{0,1\}:[^,]*\),.*/\1/p' "$WORK/fleet.log")
FLEET_URL=$(sed -n 's/^fleet manager: .* HTTP \([^,]*\),.*/\1/p' "$WORK/fleet.log")
export EDGEINFER_FLEET_URL=$FLEET_URL  # read by `edgeinfer fleet ...` and `edgeinfer deploy`
# the first start wrote an admin token (mode 0600); the API answers 401 without a token
export EDGEINFER_FLEET_TOKEN_FILE=$WORK/fleet-data/admin.token
echo "broker $BROKER, API $FLEET_URL, admin token in $EDGEINFER_FLEET_TOKEN_FILE"

step "3. $AGENTS agents, each enrolled (its own MQTT account) and running MobileNet v2 (version 1) on the sample photos"
for i in $(seq 1 "$AGENTS"); do
    device=$(printf 'cam-%02d' "$i")
    # enroll prints the device's agent.yaml keys: device_id, fleet, broker, username, password, update key
    (umask 077; ei fleet enroll "$device" --fleet demo > "$WORK/$device.yaml")
    cat >> "$WORK/$device.yaml" <<EOF
data_dir: '$WORK/$device'
telemetry_interval_s: 1.0
reconnect_min_s: 0.2
profile: auto
groups: [demo]
update_health_frames: 5        # frames the new model must run well before it is committed
pipelines:
  - name: main
    model: '$MODEL_V1'
    source: '$ASSETS/images/*.jpg'  # every .jpg photo, over and over
    loop: true
    max_fps: $FPS
    threads: 1
    version: "1"
EOF
    "${EI[@]}" agent --config "$WORK/$device.yaml" > "$WORK/$device.log" 2>&1 &
    PIDS+=("$!")
done

# count the rows of `edgeinfer fleet devices` (DEVICE STATUS MODEL VERSION ...) that match
count_devices() { ei fleet devices | awk -v version="${1:-}" \
    'NR > 1 && $2 == "online" && (version == "" || $4 == version)' | wc -l; }
all_online() { [[ $(count_devices) -eq $AGENTS ]]; }
wait_for "$AGENTS devices to come online" all_online
ei fleet devices

step "4. deploy the bird classifier as version 2: a canary first, then the rest"
# deploy signs the model's manifest with the fleet key, waits for every device, and exits 0 only
# when all of them run the new version (a failed canary aborts the rollout for the others).
# The bird model answers with other classes than v1: the canary analysis would rightly stop it as
# output drift (docs/fleet.md, "Canary analysis"), so this demo of the rollout itself turns it off.
ei_long deploy "$MODEL_V2" --version 2 --all --canary 34 --no-canary-analysis --device-timeout "$TIMEOUT"

step "5. the fleet now"
# the agents' retained state reaches the manager a moment after the deploy command returns
all_v2() { [[ $(count_devices 2) -eq $AGENTS ]]; }
wait_for "every device to report version 2" all_v2
ei fleet deployments
ei fleet devices
step "6. who did what (the audit log)"
ei fleet audit
step "done: $AGENTS devices active on v2"
