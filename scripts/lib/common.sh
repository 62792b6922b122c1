# shellcheck shell=bash
# scripts/lib/common.sh — sourced (never run) by scripts/kube-node.sh, scripts/kube-control-plane.sh
# and scripts/compose-engine.sh: one `log`, one `die`, one way to start, watch, wait for and stop
# a daemon, and the undo journal that a bring-up appends to and a teardown replays.
#
# Exit codes, for every script that sources this: 0 done; 1 failed (`die`, a step of a bring-up,
# a check that found something left); 2 usage (no or an unknown command: the script's header is
# printed). A failed bring-up exits with its failing command's status (130 on ^C), never 0.
# compose-engine.sh keeps its own two (64 usage, 2 something missing), which its callers read.
#
# Set LOG_TAG before sourcing (the [tag] of every line); JOURNAL before `journal`/`undo`.

log() { printf '[%s] %s\n' "${LOG_TAG:-${0##*/}}" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
# The script's header (line 2 up to `set -euo pipefail`) as its help, exit 2
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 2; }

# ---------------------------------------------------------------- daemons
# A process that exists and is not a zombie: `kill -0` succeeds on a zombie, and a killed child
# stays one until it is reaped (PID 1 on this machine kind reaps orphans only seconds later).
# The state is the field after the command's ")" (a command may hold spaces or parentheses).
running() { # pid
  local s
  [[ ${1:-} =~ ^[0-9]+$ ]] || return 1
  s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  s=${s##*) }
  [ -n "$s" ] && [ "${s%% *}" != Z ]
}
alive() { [ -f "$1/$2.pid" ] && running "$(cat "$1/$2.pid")"; } # dir name

# launch DIR NAME CMD...: CMD in a session of its own, stdin closed, output to DIR/NAME.log, its
# PID in DIR/NAME.pid. Run in this shell's background (never inside $(...)), so $! is the
# daemon's own PID: setsid and nsenter exec in place. It gets no other descriptor of ours
# (on_failure's 7 and 8 are the caller's stdout and stderr: a daemon holding them open would
# keep a caller that reads them, spawnSync say, waiting).
launch() {
  local dir=$1 name=$2; shift 2
  setsid "$@" >"$dir/$name.log" 2>&1 </dev/null 7>&- 8>&- &
  echo $! >"$dir/$name.pid"
}

# stop_pid NAME PID: TERM, then KILL after 15 s; nothing when it is gone already
stop_pid() {
  local pid=$2 i t0=${EPOCHREALTIME/./}
  running "$pid" || return 0
  kill "$pid" 2>/dev/null || true
  for ((i = 0; i < 150; i++)); do running "$pid" || break; sleep 0.1; done
  if running "$pid"; then kill -9 "$pid" 2>/dev/null || true; log "killed $1 (pid $pid) after 15 s"
  else log "stopped $1 (pid $pid) in $(((${EPOCHREALTIME/./} - t0) / 1000)) ms"; fi
}
# stop_daemon DIR NAME: the PID `launch` recorded, then its PID file
stop_daemon() {
  [ -f "$1/$2.pid" ] || return 0
  stop_pid "$2" "$(cat "$1/$2.pid")"
  rm -f "$1/$2.pid"
}

# wait_until SECONDS WHAT [-s STEP] [-a DIR:NAME]... CMD...
#   CMD (output discarded) every STEP seconds (default 0.25) until it succeeds. Returns 1 with a
#   log line after SECONDS, or as soon as a daemon named by -a (launch's DIR and NAME) is no
#   longer running, its log's last lines shown.
wait_until() {
  local secs=$1 end=$((SECONDS + $1)) what=$2 step=0.25 watch=() w; shift 2
  while :; do
    case ${1:-} in
      -s) step=$2; shift 2 ;;
      -a) watch+=("$2"); shift 2 ;;
      *) break ;;
    esac
  done
  while :; do
    "$@" >/dev/null 2>&1 && return 0
    for w in "${watch[@]}"; do
      alive "${w%:*}" "${w##*:}" && continue
      tail -20 "${w%:*}/${w##*:}.log" >&2 || true
      log "${w##*:} exited, see ${w%:*}/${w##*:}.log"
      return 1
    done
    ((SECONDS < end)) || { log "timed out after $secs s waiting for $what"; return 1; }
    sleep "$step"
  done
}

# ---------------------------------------------------------------- the undo journal
# Each step of a bring-up appends its own inverse to $JOURNAL as soon as it has succeeded (a
# command line, each word quoted with printf %q); `undo` runs them newest first. An inverse is
# idempotent (undoing what is already gone does nothing), so a replay that was cut short can be
# run again. A step that starts something which keeps its own journal (a child script) records
# the replay of that journal before it starts: that replay undoes only what the child did.
journal() { # CMD [ARG...]: the inverse of the step that has just succeeded
  { printf '%q ' "$@"; printf '\n'; } >>"${JOURNAL:?}"
}

# undo [FILE]: replay the journal (default $JOURNAL) newest first, then rename it FILE.undone.
# An inverse that fails is logged and the others still run; returns 1 if any failed.
undo() {
  local f=${1:-${JOURNAL:?}} line rc=0
  [ -f "$f" ] || return 0
  # fd 3: an inverse that reads stdin must not eat the journal
  while IFS= read -r line <&3; do
    [ -n "$line" ] || continue
    eval "$line" || { log "undo: '$line' failed"; rc=1; }
  done 3< <(tac "$f")
  mv -f "$f" "$f.undone"
  return $rc
}

# on_failure CMD [ARG...]: from here on, leaving the script (a step failing under set -e, die,
# ^C) runs CMD first, then exits with that status (130 on INT or TERM; 1 if it was 0: the
# bring-up did not finish). `on_failure -` disarms it once the bring-up is done. CMD writes
# to the stdout and stderr the script had when armed (kept as 7 and 8): a failure inside a
# function called with a redirection (`f >file 2>&1`) would otherwise send CMD's lines there.
on_failure() {
  if [ "$1" = - ]; then trap - EXIT INT TERM; exec 7>&- 8>&-; return 0; fi
  _ON_FAILURE=("$@")
  exec 7>&1 8>&2
  trap '_on_failure_exit $?' EXIT
  trap 'exit 130' INT TERM
}
_on_failure_exit() {
  trap - EXIT INT TERM
  exec 1>&7 2>&8
  "${_ON_FAILURE[@]}" || true
  exit $(($1 == 0 ? 1 : $1))
}

# render TEMPLATE NAME...: the file with each ${NAME} replaced by that shell variable's value
# (no other substitution: no envsubst, which Debian's base image lacks, no eval); a ${...} left
# over is a template naming a variable the caller did not list, and fails.
render() {
  local text name
  text=$(<"$1") || return 1
  for name in "${@:2}"; do text=${text//"\${$name}"/"${!name}"}; done
  # shellcheck disable=SC2016 # a literal ${
  case $text in *'${'*) log "render: $1 has a \${...} not in: ${*:2}"; return 1 ;; esac
  printf '%s\n' "$text"
}
