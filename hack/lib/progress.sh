# shellcheck shell=bash
# Progress lines for the long scripts (make demo, cluster-up, kind-up, test), sourced by them:
# which step of how many, what it builds and why, roughly how long it takes cold on 2 cores, and
# one line for a step that is cached. Go's own output (go: downloading ..., compiler lines) goes
# to a log file under the cache, shown (its last 30 lines and its path) only when the step fails.
# Plain lines on stderr, nothing that redraws: CI reads them (.ci/run).
#
#   progress_plan N [TITLE]   this script prints N numbered steps. Started by a parent that
#                             counted them (substeps), it carries on the parent's numbering.
#   step DESC                 "[i/N] DESC"
#   step_skip K DESC          "[i-j/N] DESC": K steps with nothing to do
#   step_done WHAT            "[i/N] WHAT in 65 s"
#   run_logged LOG CMD...     runs CMD with its output in LOG (truncated first) only; a line every
#                             minute while it runs; on failure the last 30 lines and LOG's path;
#                             returns CMD's status, so under set -e a failure ends the script.
#                             CMD may be a function of the script: it runs in a subshell with
#                             errexit on (so nothing it sets is seen afterwards). Call run_logged
#                             as a plain command, not in if/while/||/&&/!, when CMD is a
#                             function: bash ignores errexit in the function there (even in a
#                             subshell with set -e), so run_logged refuses (status 2).
#   substeps K CMD...         runs CMD, a script (not a function) that prints K steps, as the
#                             next K of this plan; returns CMD's status
#   substeps_to VAR K CMD...  the same, storing CMD's stdout in VAR (as VAR=$(CMD) would)
#   progress_log NAME         prints the path of log NAME (the directory is made)
#   progress_end              says so when this script printed more or fewer steps than planned
#
# WARMPOOL_LOG_DIR (default $WARMPOOL_CACHE/logs, i.e. ~/.cache/warmpool/logs) holds the logs;
# WARMPOOL_PROGRESS_EVERY (seconds, default 60; 0: never) paces the "still running" lines;
# PROGRESS_NAME names the lines of a shell that has no plan (a Makefile recipe).

PROGRESS_LOG_DIR=${WARMPOOL_LOG_DIR:-${WARMPOOL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/warmpool}/logs}
PROGRESS_EVERY=${WARMPOOL_PROGRESS_EVERY:-60}
_progress_step=0 _progress_total=0 _progress_first=0 _progress_count=0 _progress_t0=$SECONDS

_progress_tag() { # [i/N]; outside a plan [i], or [PROGRESS_NAME or the script's name] before any step
  if ((_progress_total > 0)); then printf '[%d/%d]' "$_progress_step" "$_progress_total"
  elif ((_progress_step > 0)); then printf '[%d]' "$_progress_step"
  else printf '[%s]' "${PROGRESS_NAME:-${0##*/}}"; fi
}

_progress_say() { printf '%s %s\n' "$(_progress_tag)" "$*" >&2; }

progress_plan() {
  local n=$1 title=${2:-} at total
  # A parent's reservation (substeps): "STEP TOTAL", for this script only, not its children.
  if [[ ${WARMPOOL_PROGRESS:-} =~ ^([0-9]+)\ ([0-9]+)$ ]]; then
    at=${BASH_REMATCH[1]} total=${BASH_REMATCH[2]}
    _progress_step=$at _progress_total=$total
  else
    _progress_step=0 _progress_total=$n
    if [[ -n $title ]]; then
      printf '== %s\n== %d steps; Go'\''s download and build output goes to %s/, shown when a step fails\n' \
        "$title" "$n" "$PROGRESS_LOG_DIR" >&2
    fi
  fi
  unset WARMPOOL_PROGRESS
  _progress_first=$_progress_step _progress_count=$n
}

step() {
  _progress_step=$((_progress_step + 1))
  _progress_t0=$SECONDS
  _progress_say "$*"
}

step_skip() {
  local k=$1 first; shift
  ((k > 0)) || return 0
  first=$((_progress_step + 1))
  _progress_step=$((_progress_step + k))
  if ((k == 1)); then _progress_say "$*"
  else printf '[%d-%d/%d] %s\n' "$first" "$_progress_step" "$_progress_total" "$*" >&2; fi
}

step_done() { _progress_say "$* in $((SECONDS - _progress_t0)) s"; }

progress_end() {
  local want=$((_progress_first + _progress_count))
  if ((_progress_step != want)); then
    printf '[progress] %s planned %d steps but printed %d: fix its progress_plan\n' \
      "$(basename "$0")" "$_progress_count" "$((_progress_step - _progress_first))" >&2
  fi
}

progress_log() {
  mkdir -p "$PROGRESS_LOG_DIR"
  printf '%s/%s.log\n' "$PROGRESS_LOG_DIR" "$1"
}

_progress_minutes() { # 61 -> "1 min", 150 -> "2 min 30 s"
  local s=$1
  if ((s < 60)); then printf '%d s' "$s"
  elif ((s % 60 == 0)); then printf '%d min' $((s / 60))
  else printf '%d min %d s' $((s / 60)) $((s % 60)); fi
}

# _progress_heartbeat LOG START PID TAG: a line every PROGRESS_EVERY seconds while PID lives.
# It wakes every 5 s, so it is gone soon after the script even when that one is killed.
_progress_heartbeat() {
  local log=$1 t0=$2 pid=$3 tag=$4 next=$PROGRESS_EVERY
  while kill -0 "$pid" 2>/dev/null; do
    sleep 5 </dev/null >/dev/null 2>&1 || return 0
    if ((SECONDS - t0 >= next)); then
      kill -0 "$pid" 2>/dev/null || return 0
      printf '%s still running, %s so far; output: %s\n' "$tag" "$(_progress_minutes "$next")" "$log" >&2
      next=$((next + PROGRESS_EVERY))
    fi
  done
}

run_logged() {
  local log=$1; shift
  local t0=$SECONDS rc=0 hb= errexit=false tag
  tag=$(_progress_tag)
  if [[ $- == *e* ]]; then errexit=true; fi
  set +e
  if [[ $(type -t "$1") == function ]]; then
    # Where errexit is being ignored, it cannot be turned back on, not even in a subshell.
    (set -e; false; exit 0)
    if (($? == 0)); then
      printf 'run_logged %s: called where errexit is ignored (if, while, ||, &&, !), so %s would run on past a failure; call run_logged as a plain command\n' \
        "$1" "$1" >&2
      if $errexit; then set -e; fi
      return 2
    fi
  fi
  mkdir -p "$(dirname "$log")"
  printf '# %s: %s\n' "$(date '+%F %T')" "$*" >"$log"
  if ((PROGRESS_EVERY > 0)); then
    _progress_heartbeat "$log" "$t0" "$BASHPID" "$tag" >/dev/null &
    hb=$!
  fi
  (set -e; "$@") >>"$log" 2>&1
  rc=$?
  if [[ -n $hb ]]; then
    kill "$hb" 2>/dev/null
    wait "$hb" 2>/dev/null
  fi
  if ((rc != 0)); then
    {
      printf '%s failed after %d s (exit status %d); the last 30 lines of %s:\n' "$tag" $((SECONDS - t0)) "$rc" "$log"
      tail -n 30 "$log" | sed 's/^/    | /'
      printf '%s full output: %s\n' "$tag" "$log"
    } >&2
  fi
  if $errexit; then set -e; fi
  return "$rc"
}

substeps() {
  local k=$1; shift
  local rc=0
  WARMPOOL_PROGRESS="$_progress_step $_progress_total" "$@" || rc=$?
  _progress_step=$((_progress_step + k))
  return "$rc"
}

substeps_to() {
  local _progress_var=$1 k=$2; shift 2
  local _progress_out rc=0
  _progress_out=$(WARMPOOL_PROGRESS="$_progress_step $_progress_total" "$@") || rc=$?
  _progress_step=$((_progress_step + k))
  printf -v "$_progress_var" '%s' "$_progress_out"
  return "$rc"
}
