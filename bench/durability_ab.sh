#!/bin/bash
# A/B of a one-file change (#18, docs/BENCHMARKS.md "Durability of a one-file commit"): two txbox
# binaries each run `sh -c 'echo N > f'` (a file of the workspace rewritten, N the round) and
# `sh -c 'echo N > gN'` (a new file), against the same shell natively, followed by an fsync of
# the file (`sync f`: coreutils' sync of one file is an fsync) and without it. Reported: the
# commit phase (TXBOX_TIMING) and the whole run, medians, and each run's ratio to the native
# write + fsync. Interleaved (the order rotates every round), every run followed by an untimed
# `sync` so no variant pays for what another left dirty, each binary with its own workspace
# and state directory (same filesystem), the load average printed before and after.
#
#   bench/durability_ab.sh OLD NEW [ROUNDS]      (scratch space under $TMPDIR or /var/tmp)
set -euo pipefail
OLD=$(realpath "$1")
NEW=$(realpath "$2")
ROUNDS=${3:-31}
ROOT=$(mktemp -d "${TMPDIR:-/var/tmp}/txbox-durability-ab.XXXXXX")
trap 'rm -rf "$ROOT"' EXIT
VARIANTS=(old new native native_nosync)
for v in "${VARIANTS[@]}"; do
    mkdir -p "$ROOT/$v/ws" "$ROOT/$v/state"
    for i in $(seq 20); do echo "$i" > "$ROOT/$v/ws/w$i"; done
    echo 0 > "$ROOT/$v/ws/f"
    : > "$ROOT/$v.edit.us"; : > "$ROOT/$v.new.us"; : > "$ROOT/$v.edit.commit"; : > "$ROOT/$v.new.commit"
done
sync
now() { date +%s%N; }
median() { sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }

# one VARIANT KIND ROUND: KIND edit rewrites f, new writes gROUND.
one() {
    local v=$1 kind=$2 r=$3 script s e
    if [ "$kind" = edit ]; then script="echo $r > f"; else script="echo $r > g$r"; fi
    case $v in
        old | new)
            local bin=$OLD
            [ "$v" = new ] && bin=$NEW
            s=$(now)
            (cd "$ROOT/$v/ws" && TXBOX_STATE_DIR="$ROOT/$v/state" TXBOX_TIMING=1 "$bin" run -- sh -c "$script" 2> "$ROOT/timing")
            e=$(now)
            sed -n 's/.*commit \([0-9.]*\),.*/\1/p' "$ROOT/timing" >> "$ROOT/$v.$kind.commit"
            grep -o 'sandbox: [a-z]*' "$ROOT/timing" >> "$ROOT/$v.sandbox" || true
            ;;
        native)
            s=$(now)
            (cd "$ROOT/$v/ws" && sh -c "$script && sync ${script##*> }")
            e=$(now)
            ;;
        native_nosync)
            s=$(now)
            (cd "$ROOT/$v/ws" && sh -c "$script")
            e=$(now)
            ;;
    esac
    echo $(((e - s) / 1000)) >> "$ROOT/$v.$kind.us"
    sync
}

echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
for v in "${VARIANTS[@]}"; do one "$v" edit 0; done # warm-up, untimed
for v in "${VARIANTS[@]}"; do : > "$ROOT/$v.edit.us"; : > "$ROOT/$v.edit.commit"; done
for r in $(seq "$ROUNDS"); do
    n=${#VARIANTS[@]}
    for k in $(seq 0 $((n - 1))); do
        v=${VARIANTS[$(((r + k) % n))]}
        one "$v" edit "$r"
        one "$v" new "$r"
    done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
printf 'rounds %s; medians; whole run in ms (ratio to native write + fsync), commit phase in ms\n' "$ROUNDS"
for kind in edit new; do
    nat=$(median < "$ROOT/native.$kind.us")
    echo "== $kind ($([ $kind = edit ] && echo "echo N > f" || echo "echo N > gN"))"
    for v in "${VARIANTS[@]}"; do
        m=$(median < "$ROOT/$v.$kind.us")
        line=$(printf '%-14s run %7.2f ms (%5.2fx)' "$v" "$(echo "$m / 1000" | bc -l)" "$(echo "$m / $nat" | bc -l)")
        if [ -s "$ROOT/$v.$kind.commit" ]; then
            c=$(median < "$ROOT/$v.$kind.commit")
            line="$line   commit $(printf '%.3f' "$c") ms   all: $(tr '\n' ' ' < "$ROOT/$v.$kind.commit")"
        fi
        echo "$line"
    done
done
for v in old new; do echo "$v sandboxes: $(sort "$ROOT/$v.sandbox" | uniq -c | tr '\n' ' ')"; done
