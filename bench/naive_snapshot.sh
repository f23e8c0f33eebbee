#!/usr/bin/env bash
# The naive alternative to txbox a user could write in five minutes: snapshot the workspace by
# copying it, run the command in the copy, and copy the result back only if it succeeded.
#
# usage: naive_snapshot.sh WORKSPACE SCRATCH PROGRAM [ARG...]
#   SCRATCH must be an empty directory on the same filesystem. It is left in place: the
#   benchmark deletes it after measuring (on these disks a bulk delete slows the file creation
#   that follows for minutes), as a real tool would delete it in the background.
#
# Unlike txbox it has no isolation, no atomicity (a crash during the copy back leaves a mix),
# runs the command at another path, and does not carry deletions back. Its cost grows with
# the size of the workspace, which is what the benchmark shows.
set -u
ws=$1 scratch=$2
shift 2
cp -a "$ws/." "$scratch/" || exit 125
(cd "$scratch" && "$@")
status=$?
if [ "$status" -eq 0 ]; then
  cp -a "$scratch/." "$ws/" || exit 125
fi
exit "$status"
