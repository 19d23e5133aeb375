#!/usr/bin/env bash
# Rolls a new version of one backend out to a fleet of `backplane serve` replicas, canary first,
# through each replica's admin API; stops at the first replica whose rejected-deploy or failure
# counters move, rolls back what took the new version, restores the previous file and unpins.
# With --progressive, each replica's own rollout controller (deploy_policy "progressive") judges
# the new version instead, and the first rollback it decides stops the fleet's rollout.
# docs/deploy.md ("Rolling a backend out") explains the procedure and shows a run.
set -euo pipefail

usage() {
  cat <<'USAGE'
usage: scripts/rollout.sh --backend ID --file NEW.so
                          (--publish-dir DIR... | --publish-command CMD [--restore-command CMD])
                          [options] SERVER_URL...

Every replica is pinned, the file is published, then the replicas are unpinned one at a time:
the first (the canary) soaks for --soak seconds and its /metrics are compared with the others';
each next one must take the new version without its counters moving. The admin token comes from
$BACKPLANE_ADMIN_TOKEN or --token-file.

With --progressive (servers with "deploy_policy": "progressive"), each unpinned replica makes the
file a candidate and its rollout controller walks it through shadow and canary steps on live
traffic; the script follows GET /v2/backends/ID/rollout and unpins the next replica once the
candidate is promoted. The first rollback a replica decides (or a rollout that does not end within
--rollout-timeout, which is aborted) stops the fleet's rollout as above. The replicas need traffic
for their rollouts to advance. --soak, --step-soak, --max-failures and --max-latency-ratio do not
apply: the servers' rollout policy judges.

  --backend ID            backend id, as in GET /v2/backends (e.g. CpuRef)
  --file FILE             the new backend file
  --name NAME             its file name in the backend directories (default: FILE's name)
  --publish-dir DIR       a backend directory to publish into (write-temp + rename); repeatable:
                          one per replica, or once for a shared volume. The file it replaces is
                          kept as DIR/.NAME.rollout-previous and restored on failure.
  --publish-command CMD   instead: run CMD (bash) to publish; it gets ROLLOUT_FILE, ROLLOUT_NAME
                          and ROLLOUT_BACKEND in its environment
  --restore-command CMD   with --publish-command: run CMD to put the previous file back
  --servers-file FILE     server URLs, one per line (beside or instead of SERVER_URL...)
  --token-file FILE       the admin token (default: $BACKPLANE_ADMIN_TOKEN)
  --soak SECONDS          canary soak before comparing (default 60)
  --step-soak SECONDS     soak for each next replica (default 10)
  --wait SECONDS          how long a replica may take to pick the file up (default 30)
  --max-failures N        server-side inference failures (REST 5xx) allowed per replica during its soak (default 0)
  --max-latency-ratio R   stop when the canary's mean latency exceeds R times the others' (0: off,
                          the default)
  --progressive           let each replica's rollout controller judge the new version (see above)
  --rollout-timeout SECONDS
                          with --progressive: how long a replica's rollout may take from the
                          moment its candidate appears until it is promoted (default 600)

Exit status: 0 rolled out everywhere; 1 stopped, and the fleet is back on the previous version
and unpinned; 2 usage; 3 stopped, and something needs a hand (the message says what).
USAGE
}

die_usage() {
  echo "rollout: $*" >&2
  echo "run scripts/rollout.sh --help for usage" >&2
  exit 2
}

backend="" file="" name="" publish_command="" restore_command="" token_file=""
soak=60 step_soak=10 wait_seconds=30 max_failures=0 max_latency_ratio=0
progressive=0 rollout_timeout=600
publish_dirs=() servers=()
while (($# > 0)); do
  case "$1" in
    --backend) backend="${2:?}"; shift 2 ;;
    --file) file="${2:?}"; shift 2 ;;
    --name) name="${2:?}"; shift 2 ;;
    --publish-dir) publish_dirs+=("${2:?}"); shift 2 ;;
    --publish-command) publish_command="${2:?}"; shift 2 ;;
    --restore-command) restore_command="${2:?}"; shift 2 ;;
    --servers-file)
      while read -r line; do
        [[ -n "$line" && "$line" != \#* ]] && servers+=("$line")
      done <"${2:?}"
      shift 2 ;;
    --token-file) token_file="${2:?}"; shift 2 ;;
    --soak) soak="${2:?}"; shift 2 ;;
    --step-soak) step_soak="${2:?}"; shift 2 ;;
    --wait) wait_seconds="${2:?}"; shift 2 ;;
    --max-failures) max_failures="${2:?}"; shift 2 ;;
    --max-latency-ratio) max_latency_ratio="${2:?}"; shift 2 ;;
    --progressive) progressive=1; shift ;;
    --rollout-timeout) rollout_timeout="${2:?}"; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    --*) die_usage "unknown option $1" ;;
    *) servers+=("${1%/}"); shift ;;
  esac
done

[[ -n "$backend" ]] || die_usage "--backend is required"
[[ -n "$file" ]] || die_usage "--file is required"
[[ -f "$file" ]] || die_usage "--file $file is not a file"
[[ -n "$name" ]] || name="$(basename "$file")"
[[ "$name" =~ ^[a-zA-Z0-9]+_[a-zA-Z0-9]+_backend\.so(\.[0-9]+)*$ ]] ||
  die_usage "file name $name is not a backend name (<vendor>_<name>_backend.so[.N...])"
if ((${#publish_dirs[@]} > 0)) && [[ -n "$publish_command" ]]; then
  die_usage "give --publish-dir or --publish-command, not both"
fi
if ((${#publish_dirs[@]} == 0)) && [[ -z "$publish_command" ]]; then
  die_usage "give --publish-dir DIR or --publish-command CMD: how the file reaches the replicas"
fi
for dir in "${publish_dirs[@]}"; do
  [[ -d "$dir" ]] || die_usage "--publish-dir $dir is not a directory"
done
((${#servers[@]} > 0)) || die_usage "no server URL given"
for number in "$soak" "$step_soak" "$wait_seconds" "$max_failures" "$rollout_timeout"; do
  [[ "$number" =~ ^[0-9]+$ ]] || die_usage "'$number' is not a whole number"
done
[[ "$max_latency_ratio" =~ ^[0-9]+(\.[0-9]+)?$ ]] || die_usage "bad --max-latency-ratio"
for tool in curl jq awk; do
  command -v "$tool" >/dev/null || die_usage "$tool is needed (Debian: apt-get install $tool)"
done

token="${BACKPLANE_ADMIN_TOKEN:-}"
if [[ -n "$token_file" ]]; then
  token="$(tr -d '\r\n' <"$token_file")"
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# The token goes to curl in a header file, never on its command line (ps shows those).
: >"$work/headers"
chmod 600 "$work/headers"
if [[ -n "$token" ]]; then
  printf 'Authorization: Bearer %s\n' "$token" >"$work/headers"
fi

log() { printf '[rollout %(%H:%M:%S)T] %s\n' -1 "$*"; }

# request METHOD URL: the body goes to $work/body, the status to stdout ("000": no answer).
request() {
  curl -sS --connect-timeout 3 --max-time 30 -o "$work/body" -w '%{http_code}' \
    -H @"$work/headers" -X "$1" "$2" 2>"$work/curl-error" || true
}
body() { cat "$work/body"; }
why() { jq -r '.error // empty' "$work/body" 2>/dev/null || body; }

is_static="" is_pinned="" active="" rejected="" load_rejected=""
# describe SERVER: sets is_static, is_pinned, active (generation), rejected (how many rejected
# deploys are listed) and load_rejected (of them, those not rolled back by a progressive rollout)
# from GET /v2/backends/ID; fails loudly when unreachable.
describe() {
  local status
  status="$(request GET "$1/v2/backends/$backend")"
  if [[ "$status" != 200 ]]; then
    log "$1: GET /v2/backends/$backend answered $status: $(why) $(cat "$work/curl-error")"
    return 1
  fi
  read -r is_static is_pinned active rejected load_rejected < <(jq -r \
    '[.static, .pinned, .active_generation, (.rejected | length),
      ([.rejected[] | select(.reason != "ROLLED_BACK")] | length)] | @tsv' "$work/body")
  cp "$work/body" "$work/backend"
}

rollout_phase="" rollout_candidate="" rollout_weight="" rollout_samples=""
rollout_decided_by="" rollout_reason=""
# rollout_state SERVER: sets rollout_phase, rollout_candidate (generation), rollout_weight (%),
# rollout_samples, rollout_decided_by and rollout_reason from GET /v2/backends/ID/rollout
# (--progressive).
rollout_state() {
  local status
  status="$(request GET "$1/v2/backends/$backend/rollout")"
  if [[ "$status" != 200 ]]; then
    log "$1: GET /v2/backends/$backend/rollout answered $status: $(why) $(cat "$work/curl-error")"
    return 1
  fi
  # Unit separators, not tabs: read would merge the empty fields (decided_by, reason) that tabs
  # leave.
  IFS=$'\x1f' read -r rollout_phase rollout_candidate rollout_weight rollout_samples \
    rollout_decided_by rollout_reason < <(jq -r '[.phase, .candidate_generation,
      .weight_percent, .samples, .decided_by, (.reason | gsub("\n"; " "))]
      | map(tostring) | join("\u001f")' "$work/body")
  cp "$work/body" "$work/rollout"
}
under_way() {
  [[ "$rollout_phase" == shadow || "$rollout_phase" == canary || "$rollout_phase" == paused ]]
}
# same_build GENERATION: whether the generation (in $work/backend) has the active one's digest.
same_build() {
  jq -e --argjson a "$active" --argjson c "$1" '
    ([.generations[] | select(.generation == $a) | .sha256][0]) as $x
    | ([.generations[] | select(.generation == $c) | .sha256][0]) as $y
    | $x != null and $x == $y' "$work/backend" >/dev/null
}

# counters SERVER: "rejected failures requests duration_sum duration_count" from /metrics.
# failures: inference failures with a server-side code, REST's 5xx (a backend fault, an overload
# or a model not serving; INVALID_ARGUMENT, NOT_FOUND… are the clients' own errors).
counters() {
  local status
  status="$(curl -sS --connect-timeout 3 --max-time 30 -o "$work/metrics" -w '%{http_code}' \
    "$1/metrics" 2>"$work/curl-error" || true)"
  if [[ "$status" != 200 ]]; then
    log "$1: GET /metrics answered $status $(cat "$work/curl-error")"
    return 1
  fi
  awk '
    /^#/ { next }
    $1 ~ /^backplane_backend_rejected_loads_total([{]|$)/ { rejected += $2 }
    $1 ~ /^backplane_inference_failures_total[{]/ && $1 ~ /code="(INTERNAL|UNAVAILABLE|DEADLINE_EXCEEDED|RESOURCE_EXHAUSTED)"/ { failures += $2 }
    $1 ~ /^backplane_inference_requests_total([{]|$)/ { requests += $2 }
    $1 ~ /^backplane_inference_request_duration_seconds_sum([{]|$)/ { duration_sum += $2 }
    $1 ~ /^backplane_inference_request_duration_seconds_count([{]|$)/ { duration_count += $2 }
    END { printf "%d %d %d %.9f %d\n", rejected, failures, requests, duration_sum, duration_count }
  ' "$work/metrics"
}

# State per replica (index into servers). counters_before is taken just before the replica is
# given the new version, so that only what happened on the new version counts.
declare -a generation_before=() rejected_before=() counters_before=() pinned_by_us=() took_new=()
# --progressive: the rollout's candidate before the file was published, and the new file's
# candidate on each replica (0: none yet). load_rejected_before: like rejected_before, without
# the rollouts' own rollbacks.
declare -a rollout_before=() candidate_of=() load_rejected_before=()

# ---- Before anything changes: every replica answers, none is pinned by someone else.
log "backend $backend, file $file as $name, ${#servers[@]} replica(s), canary ${servers[0]}"
for i in "${!servers[@]}"; do
  server="${servers[i]}"
  describe "$server" || { echo "rollout: ${server} is not usable; nothing changed" >&2; exit 3; }
  if [[ "$is_static" == true ]]; then
    echo "rollout: $backend is a static backend on $server: it cannot be redeployed" >&2
    exit 3
  fi
  if [[ "$is_pinned" == true ]]; then
    echo "rollout: $backend is already pinned on $server (another rollout, or an operator):" \
      "unpin it or leave that replica out; nothing changed" >&2
    exit 3
  fi
  generation_before[i]="$active"
  rejected_before[i]="$rejected"
  load_rejected_before[i]="$load_rejected"
  counters "$server" >/dev/null || exit 3
  pinned_by_us[i]=0
  took_new[i]=0
  candidate_of[i]=0
  log "$server: generation ${generation_before[i]} active"
  if ((progressive)); then
    if ! rollout_state "$server"; then
      echo "rollout: $server has no GET /v2/backends/$backend/rollout (a server without" \
        "progressive rollouts?); nothing changed" >&2
      exit 3
    fi
    if under_way; then
      if ! same_build "$rollout_candidate"; then
        echo "rollout: a rollout of $backend generation $rollout_candidate is under way on" \
          "$server ($rollout_phase): let it end, or abort it (POST" \
          "/v2/backends/$backend/rollout/abort); nothing changed" >&2
        exit 3
      fi
      # What an earlier stop leaves when its replicas have no traffic: harmless to replace.
      log "$server: a rollout of generation $rollout_candidate, the build it runs already (a" \
        "restored file), is under way; the new file will replace it"
    fi
    rollout_before[i]="$rollout_candidate"
  fi
done

# ---- Stopping: roll back what took the new version, restore the file, unpin. Sets the exit.
restore_file() {
  if ((${#publish_dirs[@]} > 0)); then
    local dir
    for dir in "${publish_dirs[@]}"; do
      if [[ -f "$dir/.$name.rollout-previous" ]]; then
        cp -p "$dir/.$name.rollout-previous" "$dir/.$name.rollout-restore"
        sync "$dir/.$name.rollout-restore"
        mv -f "$dir/.$name.rollout-restore" "$dir/$name"
        log "restored the previous $name in $dir"
      else
        rm -f "$dir/$name"
        log "removed $name from $dir (there was none before)"
      fi
    done
    return 0
  fi
  if [[ -n "$restore_command" ]]; then
    log "restoring the previous file: $restore_command"
    ROLLOUT_NAME="$name" ROLLOUT_BACKEND="$backend" bash -c "$restore_command"
    return
  fi
  return 1
}

# abort_rollout INDEX (--progressive): ends the new file's rollout on the replica if it is still
# under way; marks the replica took_new when its candidate was promoted meanwhile. Fails when the
# replica does not answer or its rollout stays under way.
abort_rollout() {
  local i="$1" server="${servers[$1]}" status attempt
  for attempt in 1 2 3 4 5 6 7 8 9 10; do
    rollout_state "$server" || return 1
    if ((rollout_candidate != candidate_of[i])) || ! under_way; then break; fi
    status="$(request POST "$server/v2/backends/$backend/rollout/abort")"
    if [[ "$status" == 200 ]]; then
      log "$server: aborted the rollout of generation ${candidate_of[i]}" \
        "($(jq -r '.phase' "$work/body"))"
      return 0
    fi
    # 409 while the server's own decision is being carried out: look again.
    log "$server: rollout/abort answered $status (attempt $attempt): $(why)"
    sleep 0.5
  done
  describe "$server" || return 1
  if [[ "$active" == "${candidate_of[i]}" ]]; then
    took_new[i]=1  # promoted: rolled back below like any replica that took the new version
  elif ((rollout_candidate == candidate_of[i])) && under_way; then
    return 1
  fi
}

stop_rollout() {
  local reason="$*" i server status needs_hand=0
  # A second Ctrl-C while stopping ends the script at once; the log says how far it got.
  trap - INT TERM
  log "STOP: $reason"
  if ((progressive)); then
    for i in "${!servers[@]}"; do
      ((candidate_of[i] != 0 && took_new[i] == 0)) || continue
      abort_rollout "$i" || {
        log "${servers[i]}: the rollout of generation ${candidate_of[i]} could not be ended"
        needs_hand=1
      }
    done
  fi
  for i in "${!servers[@]}"; do
    ((took_new[i] == 1)) || continue
    server="${servers[i]}"
    status="$(request POST "$server/v2/backends/$backend/rollback")"
    if [[ "$status" == 200 ]]; then
      log "$server: rolled back to the previous version" \
        "(generation $(jq -r '.active_generation' "$work/body"))"
    else
      log "$server: rollback answered $status: $(why)"
      needs_hand=1
    fi
  done
  if ! restore_file; then
    log "could not restore the previous file (none kept, or no --restore-command): the" \
      "replicas that never took the new version stay PINNED so they do not load it. Put the" \
      "previous file back, then POST /v2/backends/$backend/unpin on each of:"
    for i in "${!servers[@]}"; do
      if ((pinned_by_us[i] == 1)); then log "  ${servers[i]}"; fi
    done
    echo "rollout: stopped; replicas left pinned until the previous file is back (see above)" >&2
    exit 3
  fi
  for i in "${!servers[@]}"; do
    ((pinned_by_us[i] == 1)) || continue
    server="${servers[i]}"
    status="$(request POST "$server/v2/backends/$backend/unpin")"
    if [[ "$status" == 200 ]]; then
      pinned_by_us[i]=0
      log "$server: unpinned ($(jq -r '.action' "$work/body")," \
        "generation $(jq -r '.backend.active_generation' "$work/body"))"
    else
      log "$server: unpin answered $status: $(why); it stays pinned"
      needs_hand=1
    fi
  done
  if ((progressive)); then
    log "a restored file is a new file to each replica: a progressive one makes it a candidate (the" \
      "build it runs already), and its rollout controller promotes it once it has seen traffic"
  fi
  if ((needs_hand)); then
    echo "rollout: stopped; some replicas need a hand (see above)" >&2
    exit 3
  fi
  echo "rollout: stopped: $reason; the fleet is back on the previous version" >&2
  exit 1
}
trap 'stop_rollout "interrupted"' INT TERM

# ---- 1. Pin every replica: the published file is noticed, not loaded.
for i in "${!servers[@]}"; do
  server="${servers[i]}"
  status="$(request POST "$server/v2/backends/$backend/pin")"
  if [[ "$status" != 200 ]]; then
    log "$server: pin answered $status: $(why)"
    for j in "${!servers[@]}"; do
      ((pinned_by_us[j] == 1)) || continue
      request POST "${servers[j]}/v2/backends/$backend/unpin" >/dev/null
      log "${servers[j]}: unpinned again"
    done
    echo "rollout: could not pin $server (a wrong or missing admin token answers 401/403);" \
      "nothing was published" >&2
    exit 3
  fi
  pinned_by_us[i]=1
  log "$server: pinned at generation ${generation_before[i]}"
done

# ---- 2. Publish.
if ((${#publish_dirs[@]} > 0)); then
  for dir in "${publish_dirs[@]}"; do
    if [[ -e "$dir/$name" ]]; then
      cp -pL "$dir/$name" "$dir/.$name.rollout-previous"
    else
      rm -f "$dir/.$name.rollout-previous"
    fi
    # A name the registry ignores (it starts with a dot), complete and synced before the rename
    # makes it the backend's file in one step.
    install -m 0755 "$file" "$dir/.$name.rollout-new"
    sync "$dir/.$name.rollout-new"
    mv -f "$dir/.$name.rollout-new" "$dir/$name"
    log "published $name into $dir"
  done
else
  log "publishing: $publish_command"
  if ! ROLLOUT_FILE="$(realpath "$file")" ROLLOUT_NAME="$name" ROLLOUT_BACKEND="$backend" \
    bash -c "$publish_command"; then
    stop_rollout "the publish command failed"
  fi
fi

# unpin_replica INDEX: unpins the replica (it looks at the file at once) and sets
# unpinned_action to what its registry did; a refusal or an error stops the rollout. Not run in
# $(...): stop_rollout must end this shell, and pinned_by_us must change in it.
unpin_replica() {
  local i="$1" server="${servers[$1]}" status
  status="$(request POST "$server/v2/backends/$backend/unpin")"
  pinned_by_us[i]=0
  unpinned_action="$(jq -r '.action // empty' "$work/body" 2>/dev/null || true)"
  if [[ "$status" == 422 ]]; then
    stop_rollout "$server rejected the new file: $(why)"
  elif [[ "$status" != 200 ]]; then
    stop_rollout "$server: unpin answered $status: $(why)"
  fi
}

# deploy_to INDEX: unpin the replica and wait until it took the file or rejected it.
deploy_to() {
  local i="$1" server="${servers[$1]}" action deadline
  counters_before[i]="$(counters "$server")" || stop_rollout "$server: /metrics did not answer"
  unpin_replica "$i"
  action="$unpinned_action"
  # "unchanged" or "deferred": the file has not reached this replica yet (a sync still on its
  # way) or is still being written; the watcher takes it when it is complete.
  deadline=$((SECONDS + wait_seconds))
  while :; do
    describe "$server" || stop_rollout "$server stopped answering"
    if ((rejected > rejected_before[i])); then
      stop_rollout "$server rejected the new file:" \
        "$(jq -r '.rejected[0] | "\(.reason): \(.message)"' "$work/backend")"
    fi
    if [[ "$active" != "${generation_before[i]}" ]]; then
      took_new[i]=1
      log "$server: generation $active active (was ${generation_before[i]})"
      return 0
    fi
    ((SECONDS < deadline)) || stop_rollout "$server did not take the new file within" \
      "${wait_seconds} s (last answer: ${action:-none})"
    sleep 0.5
  done
}

# check INDEX: stop when the replica's counters moved since before the rollout.
check() {
  local i="$1" server="${servers[$1]}" now rejected0 failures0 rejected1 failures1
  read -r rejected0 failures0 _ _ _ <<<"${counters_before[i]}"
  now="$(counters "$server")" || stop_rollout "$server: /metrics did not answer"
  read -r rejected1 failures1 _ _ _ <<<"$now"
  log "$server: rejected deploys +$((rejected1 - rejected0))," \
    "server-side inference failures +$((failures1 - failures0))"
  if ((rejected1 > rejected0)); then
    stop_rollout "$server: backplane_backend_rejected_loads_total moved" \
      "(+$((rejected1 - rejected0)))"
  fi
  if ((failures1 - failures0 > max_failures)); then
    stop_rollout "$server: server-side inference failures moved" \
      "(+$((failures1 - failures0)), allowed $max_failures)"
  fi
}

# mean_latency "before" "after": mean seconds per successful request between two snapshots.
mean_latency() {
  local s0 c0 s1 c1
  read -r _ _ _ s0 c0 <<<"$1"
  read -r _ _ _ s1 c1 <<<"$2"
  awk -v s="$s1" -v t="$s0" -v c="$c1" -v d="$c0" \
    'BEGIN { if (c - d > 0) printf "%.6f %d\n", (s - t) / (c - d), c - d; else print "- 0" }'
}

# roll_out_to INDEX (--progressive): unpin the replica, wait for the new file's candidate, and
# follow the replica's rollout of it until the replica promotes it; anything else stops.
roll_out_to() {
  local i="$1" server="${servers[$1]}" action deadline shown="" now
  unpin_replica "$i"
  action="$unpinned_action"
  if [[ "$action" == candidate ]]; then
    candidate_of[i]="$(jq -r '.generation' "$work/body")"
  elif [[ "$action" == activated ]]; then
    took_new[i]=1
    stop_rollout "$server activated the new file at once, without a rollout: is its" \
      "deploy_policy \"progressive\"?"
  fi
  # "unchanged" or "deferred": the file has not reached this replica yet (a sync still on its
  # way) or is still being written; the watcher takes it when it is complete. The rollout is
  # read after the backend, so that a candidate promoted in between is seen as ours.
  deadline=$((SECONDS + wait_seconds))
  while ((candidate_of[i] == 0)); do
    describe "$server" || stop_rollout "$server stopped answering"
    rollout_state "$server" || stop_rollout "$server stopped answering"
    if ((rollout_candidate != rollout_before[i])); then
      candidate_of[i]="$rollout_candidate"
    elif [[ "$active" != "${generation_before[i]}" ]]; then
      took_new[i]=1
      stop_rollout "$server activated the new file at once (generation $active), without a" \
        "rollout: is its deploy_policy \"progressive\"?"
    elif ((load_rejected > load_rejected_before[i])); then
      stop_rollout "$server rejected the new file: $(jq -r \
        '[.rejected[] | select(.reason != "ROLLED_BACK")][0] | "\(.reason): \(.message)"' \
        "$work/backend")"
    elif ((SECONDS >= deadline)); then
      stop_rollout "$server did not take the new file within ${wait_seconds} s" \
        "(last answer: ${action:-none})"
    else
      sleep 0.5
    fi
  done
  log "$server: generation ${candidate_of[i]} is a candidate beside ${generation_before[i]};" \
    "following its rollout (up to ${rollout_timeout} s)"
  deadline=$((SECONDS + rollout_timeout))
  while :; do
    rollout_state "$server" || stop_rollout "$server stopped answering"
    if ((rollout_candidate != candidate_of[i])); then
      stop_rollout "$server: generation $rollout_candidate replaced the candidate" \
        "${candidate_of[i]} (another file was deployed)"
    fi
    case "$rollout_phase" in
      promoted)
        took_new[i]=1
        log "$server: generation ${candidate_of[i]} promoted ($rollout_decided_by: $rollout_reason)"
        return 0
        ;;
      rolled_back)
        stop_rollout "$server rolled generation ${candidate_of[i]} back (decided_by" \
          "$rollout_decided_by): $rollout_reason"
        ;;
      shadow | canary | paused) ;;
      *) stop_rollout "$server: the rollout of generation ${candidate_of[i]} is '$rollout_phase'" ;;
    esac
    now="$rollout_phase at ${rollout_weight} %"
    if [[ "$now" != "$shown" ]]; then
      log "$server: $now"
      shown="$now"
    fi
    ((SECONDS < deadline)) || stop_rollout "$server: the rollout of generation" \
      "${candidate_of[i]} did not end within ${rollout_timeout} s ($now," \
      "$rollout_samples sample(s) in this step)"
    sleep 0.5
  done
}

# finish: every replica runs the new version.
finish() {
  trap - INT TERM
  log "rolled out: every replica runs the new $backend"
  for dir in "${publish_dirs[@]}"; do
    if [[ -f "$dir/.$name.rollout-previous" ]]; then
      log "the previous file stays in $dir/.$name.rollout-previous"
    fi
  done
  for i in "${!servers[@]}"; do
    describe "${servers[i]}" && log "${servers[i]}: generation ${generation_before[i]} -> $active"
  done
  exit 0
}

# ---- 3p. --progressive: one replica at a time, canary first, each replica's rollout judging.
if ((progressive)); then
  for i in "${!servers[@]}"; do
    roll_out_to "$i"
  done
  finish
fi

# ---- 3. The canary: take it, soak, compare with the replicas still on the previous version.
deploy_to 0
declare -a soak_start=()
for i in "${!servers[@]}"; do
  soak_start[i]="$(counters "${servers[i]}")" ||
    stop_rollout "${servers[i]}: /metrics did not answer"
done
log "canary ${servers[0]}: soaking ${soak} s"
sleep "$soak"
check 0
canary_now="$(counters "${servers[0]}")"
read -r canary_mean canary_count <<<"$(mean_latency "${soak_start[0]}" "$canary_now")"
others_sum=0 others_count=0
for ((i = 1; i < ${#servers[@]}; i++)); do
  read -r _ _ _ s0 c0 <<<"${soak_start[i]}"
  read -r _ _ _ s1 c1 <<<"$(counters "${servers[i]}")"
  others_sum="$(awk -v a="$others_sum" -v b="$s1" -v c="$s0" 'BEGIN { printf "%.9f", a + b - c }')"
  others_count=$((others_count + c1 - c0))
done
others_mean="$(awk -v s="$others_sum" -v c="$others_count" \
  'BEGIN { if (c > 0) printf "%.6f", s / c; else print "-" }')"
log "canary: $canary_count request(s), mean ${canary_mean} s;" \
  "the others: $others_count, mean ${others_mean} s"
if ((canary_count == 0)); then
  log "warning: the canary served no inference during its soak: only load-time checks applied"
fi
if [[ "$max_latency_ratio" != 0 && "$canary_mean" != - && "$others_mean" != - ]] &&
  awk -v a="$canary_mean" -v b="$others_mean" -v r="$max_latency_ratio" \
    'BEGIN { exit !(a > r * b) }'; then
  stop_rollout "the canary's mean latency ${canary_mean} s is over ${max_latency_ratio}x" \
    "the others' ${others_mean} s"
fi

# ---- 4. The others, one at a time.
for ((i = 1; i < ${#servers[@]}; i++)); do
  deploy_to "$i"
  if ((step_soak > 0)); then sleep "$step_soak"; fi
  check "$i"
done
finish
