#!/bin/sh
# curvine-py's container entrypoint: one image runs any role (docs/deploy.md).
#
#   master [FLAGS]                      curvine-master (the metadata server)
#   worker [FLAGS]                      curvine-worker (a block server)
#   mount MOUNTPOINT [FLAGS]            cv mount MOUNTPOINT --foreground (the FUSE mount)
#   csi-node [FLAGS]                    cv csi node, started again when it crashes
#   csi-controller [FLAGS]              cv csi controller
#   cv ARGS...                          any cv command (cv version, cv report, cv fs ls /)
#   help                                this text
#   anything else                       run as a command (a shell to look around)
#
# Configuration: the mounted TOML /etc/curvine/curvine.toml (the ConfigMap), when there
# and no $CURVINE_CONF names another, plus CURVINE_SECTION_KEY environment variables
# (docs/config.md), plus the role's flags (--section-key V).  CURVINE_ENTRYPOINT_PRINT=1
# prints the command a role runs (NUL-separated) instead of running it: the manifest
# tests parse it with the real parsers, and it shows what a pod would run.
set -eu

CONF_DEFAULT=/etc/curvine/curvine.toml
# The value deploy/k8s/secret.yaml ships with: a cluster whose secret everyone can read
# in the repository is not a secured one, so no daemon starts with it.
SECRET_PLACEHOLDER=change-me

usage() {
  sed -n '2,12s/^# \{0,1\}//p' "$0"
  exit "${1:-2}"
}

fail() {
  echo "curvine-entrypoint: $*" >&2
  exit 2
}

printing() { [ -n "${CURVINE_ENTRYPOINT_PRINT:-}" ]; }

# Run the role's command in place of this shell (tini, PID 1, reaps and forwards signals).
run() {
  if printing; then
    printf '%s\0' "$@"
    exit 0
  fi
  exec "$@"
}

# cv csi node, run again when it dies.  The FUSE mount daemons it starts outlive it (their
# own sessions, reparented to tini) and keep pods' volumes working; a driver started again
# finds them in the mount table (docs/csi.md, "Restart recovery").  A container restart
# would kill them, so a crashed driver must not end the container.  Exit 0 (it stopped on
# a signal) and 2 (a wrong command line or configuration) end it: running again cannot help.
supervise() {
  if printing; then
    run "$@"
  fi
  child=""
  stopping=0
  trap 'stopping=1; if [ -n "$child" ]; then kill -TERM "$child" 2>/dev/null || true; fi' TERM INT
  while :; do
    "$@" &
    child=$!
    if [ "$stopping" = 1 ]; then
      # the TERM came between the start and child=$!: the trap had no pid to forward it to
      kill -TERM "$child" 2>/dev/null || true
    fi
    rc=0
    wait "$child" || rc=$?
    if [ "$stopping" = 1 ]; then
      # wait was interrupted by the signal: now wait for the driver's own exit.  A driver
      # still starting (before its handlers) dies of the TERM we forwarded: that is the
      # stop that was asked for, not a failure.
      # The TERM may have reached the forked child before its exec, where the shell's trap
      # still held (it then runs the driver unstopped): send it again each second until
      # the driver is gone.
      ( while sleep 1; do kill -TERM "$child" 2>/dev/null || exit 0; done ) &
      resend=$!
      first=$rc
      rc=0
      wait "$child" || rc=$?
      kill "$resend" 2>/dev/null || true
      # 127: the first wait had reaped it already (it died of the TERM as the trap ran):
      # its status is the first wait's (CI saw 127)
      case "$rc" in
        127) rc=$first ;;
      esac
      case "$rc" in
        143) rc=0 ;;
      esac
      exit "$rc"
    fi
    child=""
    case "$rc" in
      0 | 2) exit "$rc" ;;
    esac
    echo "curvine-entrypoint: '$*' exited with status $rc; starting it again in 2 s" >&2
    sleep 2 || true
    if [ "$stopping" = 1 ]; then
      exit 0
    fi
  done
}

if [ -z "${CURVINE_CONF:-}" ] && [ -f "$CONF_DEFAULT" ]; then
  export CURVINE_CONF="$CONF_DEFAULT"
fi
if [ "${CURVINE_CLUSTER_SECRET:-}" = "$SECRET_PLACEHOLDER" ]; then
  fail "the cluster secret is the placeholder '$SECRET_PLACEHOLDER' of deploy/k8s/secret.yaml:" \
       "set your own (an overlay's secretGenerator, docs/deploy.md)"
fi

role=${1:-help}
if [ $# -gt 0 ]; then
  shift
fi
case "$role" in
  master)
    run curvine-master "$@" ;;
  worker)
    run curvine-worker "$@" ;;
  mount)
    [ $# -ge 1 ] || fail "mount: MOUNTPOINT is missing (mount MOUNTPOINT [cv mount flags])"
    case "$1" in
      -*) fail "mount: the first argument must be the MOUNTPOINT, not '$1'" ;;
    esac
    printing || mkdir -p "$1"
    run cv mount "$@" --foreground ;;
  csi-node)
    supervise cv csi node "$@" ;;
  csi-controller)
    run cv csi controller "$@" ;;
  cv)
    run cv "$@" ;;
  help | -h | --help)
    usage 0 ;;
  *)
    run "$role" "$@" ;;
esac
