#!/bin/bash
# A/B of the 10,000-file change (docs/BENCHMARKS.md, "The 10,000-file commit"): the same loop
# natively, natively followed by `sync -f` (durable, as a commit is), through a bare overlayfs
# mount (no txbox: `unshare -Urm` + `mount -t overlay … userxattr`, the loop timed inside,
# nothing synced), and through `txbox run` (its sandbox and commit phases from TXBOX_TIMING;
# more txbox binaries may follow the first, each its own variant). Interleaved rounds, the
# order rotated every round, fresh directories, nothing deleted until the end (ext4 without a
# journal is slow to create files after bulk deletes). With EXISTING=1 the files go into one
# directory that exists before the run (each then committed by its own rename).
#
#   bench/overlay_ab.sh [TXBOX [TXBOX2 …]] [ROUNDS] [FILES]     (scratch under $TMPDIR or /var/tmp)
#
# The last two arguments are taken as ROUNDS and FILES when they are numbers.
set -euo pipefail
args=("$@")
FILES=10000
ROUNDS=7
if [ ${#args[@]} -ge 1 ] && [[ ${args[-1]} =~ ^[0-9]+$ ]] && [ ${#args[@]} -ge 2 ] && [[ ${args[-2]} =~ ^[0-9]+$ ]]; then
    ROUNDS=${args[-2]}; FILES=${args[-1]}; args=("${args[@]:0:${#args[@]}-2}")
elif [ ${#args[@]} -ge 1 ] && [[ ${args[-1]} =~ ^[0-9]+$ ]]; then
    ROUNDS=${args[-1]}; args=("${args[@]:0:${#args[@]}-1}")
fi
[ ${#args[@]} -eq 0 ] && args=(target/release/txbox)
TXBOXES=()
for t in "${args[@]}"; do TXBOXES+=("$(realpath "$t")"); done
EXISTING=${EXISTING:-0}
ROOT=$(mktemp -d "${TMPDIR:-/var/tmp}/txbox-overlay-ab.XXXXXX")
trap 'rm -rf "$ROOT"' EXIT

VARIANTS=(native nsync overlay)
for i in "${!TXBOXES[@]}"; do VARIANTS+=("txbox$i"); done
for v in "${VARIANTS[@]}"; do
    mkdir -p "$ROOT/$v/ws"
    for i in $(seq 100); do echo "$i" > "$ROOT/$v/ws/w$i"; done
    : > "$ROOT/$v.ms"
    if [ "$EXISTING" = 1 ]; then
        for r in $(seq "$ROUNDS"); do mkdir "$ROOT/$v/ws/d$r"; done
    fi
done
mkdir -p "$ROOT/overlay/upper" "$ROOT/overlay/work"
sync

LOOP="for i in \$(seq $FILES); do echo \$i > f\$i; done"
TIMED='s=$(date +%s%N); '"$LOOP"'; e=$(date +%s%N); echo $(( (e - s) / 1000000 ))'
TIMED_SYNC='s=$(date +%s%N); '"$LOOP"'; sync -f .; e=$(date +%s%N); echo $(( (e - s) / 1000000 ))'
now() { date +%s%N; }
into() { if [ "$EXISTING" = 1 ]; then echo "cd d$1"; else echo "mkdir d$1 && cd d$1"; fi; }

median() { sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }

run_variant() {
    local v=$1 r=$2
    case $v in
        native) (cd "$ROOT/native/ws" && bash -c "$(into "$r") && $TIMED") >> "$ROOT/native.ms" ;;
        nsync) (cd "$ROOT/nsync/ws" && bash -c "$(into "$r") && $TIMED_SYNC") >> "$ROOT/nsync.ms" ;;
        overlay)
            unshare -Urm bash -c "mount -t overlay overlay -o lowerdir=$ROOT/overlay/ws,upperdir=$ROOT/overlay/upper,workdir=$ROOT/overlay/work,userxattr $ROOT/overlay/ws && cd $ROOT/overlay/ws && $(into "$r") && $TIMED" >> "$ROOT/overlay.ms"
            ;;
        txbox*)
            local t=${TXBOXES[${v#txbox}]} s e
            s=$(now)
            (cd "$ROOT/$v/ws" && TXBOX_TIMING=1 "$t" run -c "$(into "$r") && $LOOP" 2> "$ROOT/timing")
            e=$(now)
            echo $(( (e - s) / 1000000 )) >> "$ROOT/$v.ms"
            sed -n 's/.*sandbox \([0-9.]*\),.*/\1/p' "$ROOT/timing" >> "$ROOT/$v.sandbox.ms"
            sed -n 's/.*commit \([0-9.]*\),.*/\1/p' "$ROOT/timing" >> "$ROOT/$v.commit.ms"
            ;;
    esac
    sync
}

load0=$(cut -d' ' -f1-3 /proc/loadavg)
n_var=${#VARIANTS[@]}
for r in $(seq "$ROUNDS"); do
    for k in $(seq 0 $((n_var - 1))); do
        run_variant "${VARIANTS[$(( (k + r) % n_var ))]}" "$r"
    done
done
load1=$(cut -d' ' -f1-3 /proc/loadavg)

n=$(median < "$ROOT/native.ms")
o=$(median < "$ROOT/overlay.ms")
printf 'rounds %s, %s files%s, medians in ms; load average %s at start, %s at end\n' "$ROUNDS" "$FILES" \
    "$([ "$EXISTING" = 1 ] && echo ' into an existing directory')" "$load0" "$load1"
printf '%-16s %8s  %7s  %7s   %s\n' variant median '÷native' '÷overlay' 'all rounds'
rows=(native nsync overlay)
for i in "${!TXBOXES[@]}"; do rows+=("txbox$i" "txbox$i.sandbox" "txbox$i.commit"); done
for v in "${rows[@]}"; do
    m=$(median < "$ROOT/$v.ms")
    printf '%-16s %8.1f  %6.2fx  %6.2fx   %s\n' "$v" "$m" "$(echo "$m / $n" | bc -l)" "$(echo "$m / $o" | bc -l)" \
        "$(tr '\n' ' ' < "$ROOT/$v.ms")"
done
for i in "${!TXBOXES[@]}"; do
    m=$(median < "$ROOT/txbox$i.ms"); s=$(median < "$ROOT/nsync.ms")
    printf 'txbox%s = %s: %.2fx native + sync\n' "$i" "${TXBOXES[$i]}" "$(echo "$m / $s" | bc -l)"
done
echo "(nsync: the loop then sync -f; overlay: the loop alone through bare overlayfs; txboxN: the whole"
echo " 'txbox run'; .sandbox, .commit: its phases)"
