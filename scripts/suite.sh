#!/usr/bin/env bash
# One of `make test`'s pytest processes: NAME BOUND_S COMMAND...
# Its output is streamed as it comes, each line prefixed with "[NAME] " (two processes run side by
# side, so a hang shows where it is while it hangs, not only once both ended), and it runs under
# `timeout`: past BOUND_S seconds it is stopped (SIGTERM to its process group, SIGKILL 30 s later)
# and this says so by name. Exits with the command's status (124 when it was stopped).
set -uo pipefail
if [ $# -lt 3 ]; then
  echo "usage: $0 NAME BOUND_S COMMAND..." >&2
  exit 2
fi
name=$1 bound=$2
shift 2
start=$SECONDS
raw=$(mktemp)
trap 'rm -f "$raw"' EXIT
# PYTHONUNBUFFERED: pytest's lines reach the pipe as written, not in 8 KiB blocks
PYTHONUNBUFFERED=1 timeout --kill-after=30 "$bound" env "$@" 2>&1 | tee "$raw" |
  sed -u "s/^/[$name] /"
rc=${PIPESTATUS[0]}
took=$((SECONDS - start))
# pytest's closing line once more as pytest wrote it, unprefixed, for whoever reads the counts
closing=$(grep -E '^=* ?([0-9]+ (passed|failed|errors?|skipped|deselected)|no tests ran)' "$raw" |
  tail -n 1)
[ -z "$closing" ] || echo "$closing"
# 124 (or 137 after the SIGKILL) is timeout's own status only once the bound has passed
if { [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; } && [ "$took" -ge "$bound" ]; then
  rc=timeout
fi
case $rc in
  0) echo "make test: the $name tests passed in $took s" ;;
  timeout)
    where="the lines above prefixed [$name] show where they were"
    echo "make test: the $name tests TIMED OUT, stopped at their bound of $bound s; $where"
    rc=124
    ;;
  *) echo "make test: the $name tests FAILED (rc $rc) in $took s" ;;
esac
exit "$rc"
