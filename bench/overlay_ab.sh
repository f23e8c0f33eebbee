#!/bin/bash
# A/B of the 10,000-file change (docs/BENCHMARKS.md, "The 10,000-file commit"): the same loop
# natively, through a bare overlayfs mount (no txbox: `unshare -Urm` + `mount -t overlay …
# userxattr`, the loop timed inside, nothing synced), and through `txbox run` (its sandbox and
# commit phases from TXBOX_TIMING). Interleaved rounds, fresh directories, nothing deleted
# until the end (ext4 without a journal is slow to create files after bulk deletes).
#
#   bench/overlay_ab.sh [TXBOX] [ROUNDS] [FILES]      (scratch space under $TMPDIR or /var/tmp)
set -euo pipefail
TXBOX=${1:-target/release/txbox}
ROUNDS=${2:-7}
FILES=${3:-10000}
TXBOX=$(realpath "$TXBOX")
ROOT=$(mktemp -d "${TMPDIR:-/var/tmp}/txbox-overlay-ab.XXXXXX")
trap 'rm -rf "$ROOT"' EXIT
for v in native overlay txbox; do
    mkdir -p "$ROOT/$v/ws"
    for i in $(seq 100); do echo "$i" > "$ROOT/$v/ws/w$i"; done
done
mkdir -p "$ROOT/overlay/upper" "$ROOT/overlay/work"
sync

LOOP="for i in \$(seq $FILES); do echo \$i > f\$i; done"
TIMED='s=$(date +%s%N); '"$LOOP"'; e=$(date +%s%N); echo $(( (e - s) / 1000000 ))'
now() { date +%s%N; }

median() { sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }

: > "$ROOT/native.ms"; : > "$ROOT/overlay.ms"; : > "$ROOT/txbox.ms"; : > "$ROOT/sandbox.ms"; : > "$ROOT/commit.ms"
for r in $(seq "$ROUNDS"); do
    (cd "$ROOT/native/ws" && bash -c "mkdir d$r && cd d$r && $TIMED") >> "$ROOT/native.ms"
    sync
    unshare -Urm bash -c "mount -t overlay overlay -o lowerdir=$ROOT/overlay/ws,upperdir=$ROOT/overlay/upper,workdir=$ROOT/overlay/work,userxattr $ROOT/overlay/ws && cd $ROOT/overlay/ws && mkdir d$r && cd d$r && $TIMED" >> "$ROOT/overlay.ms"
    sync
    s=$(now)
    (cd "$ROOT/txbox/ws" && TXBOX_TIMING=1 "$TXBOX" run -c "mkdir d$r && cd d$r && $LOOP" 2> "$ROOT/timing")
    e=$(now)
    echo $(( (e - s) / 1000000 )) >> "$ROOT/txbox.ms"
    sed -n 's/.*sandbox \([0-9.]*\),.*/\1/p' "$ROOT/timing" >> "$ROOT/sandbox.ms"
    sed -n 's/.*commit \([0-9.]*\),.*/\1/p' "$ROOT/timing" >> "$ROOT/commit.ms"
    sync
done

n=$(median < "$ROOT/native.ms")
printf 'rounds %s, %s files, medians in ms (ratio to native)\n' "$ROUNDS" "$FILES"
for v in native overlay txbox sandbox commit; do
    m=$(median < "$ROOT/$v.ms")
    printf '%-8s %8.1f  (%.2fx)   all: %s\n' "$v" "$m" "$(echo "$m / $n" | bc -l)" "$(tr '\n' ' ' < "$ROOT/$v.ms")"
done
echo "(overlay: the loop alone through bare overlayfs; txbox: the whole 'txbox run'; sandbox, commit: its phases)"
