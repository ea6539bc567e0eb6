#!/usr/bin/env bash
# The paper's evaluation in one command (issue 18): every benchmark winefs has, each against
# the baselines it measures in the same run, then one report with the paper's claims beside
# the numbers (OUT/report.md, with PNG plots when matplotlib is there).
#
#   bash scripts/evaluate.sh [--quick] [OUT]      (root on Debian; OUT: evaluation-DATE)
#
# Steps: `winefs bench workload` (Filebench personalities, Fig. 6 microbenchmarks, Fig. 10
# scalability on the library, FUSE, tmpfs, passthrough_ll, ext4 and xfs), `bench syscall`,
# `bench fuse`, `bench mmap`, `bench app` (LMDB, RocksDB; clean and aged), mount and recovery
# time (examples/mount_time, and from the mount command to a usable mount point:
# scripts/mount_cli_time.sh), DRAM per file (examples/dram_per_file, and of the FUSE daemon:
# scripts/daemon_dram.sh). A full run takes about an hour on two cores; --quick runs every step small (a few minutes) to check the pipeline. A
# step that fails is listed in OUT/failed.txt and the report; the others still run.
set -uo pipefail
cd "$(dirname "$0")/.."

quick=0
if [ "${1:-}" = --quick ]; then
    quick=1
    shift
fi
OUT=${1:-evaluation-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

bash scripts/install-deps.sh || exit 1
if ! command -v cargo >/dev/null 2>&1; then export PATH="${HOME:-/root}/.cargo/bin:$PATH"; fi
# Debian's own Python, which sees the packages apt installs (a pyenv or venv python3 first in
# PATH would not).
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
if ! "$PY" -c 'import matplotlib' 2>/dev/null && [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends python3-matplotlib >/dev/null ||
        echo "evaluate: no matplotlib; the report will have tables only" >&2
fi
cargo build --release --quiet --examples || exit 1
cargo build --release --quiet || exit 1
W="$PWD/target/release/winefs"
E="$PWD/target/release/examples"

if [ "$quick" -eq 1 ]; then
    workload_args=(--seconds 1 --scale 0.1 --micro-size 32M)
    syscall_args=(--ops 5000 --repeats 1)
    fuse_args=(--files 1000 --dir-files 10000 --repeats 1)
    mmap_args=(--size 256M --repeats 1)
    app_args=(--records 20000 --ops 20000 --rocksdb-num 20000 --pool-size 1G)
    files=100000 dirs=100
else
    workload_args=()
    syscall_args=()
    fuse_args=()
    mmap_args=()
    app_args=()
    files=1000000 dirs=1000
fi

# FUSE over io_uring, where the kernel has it, is offered for the run (winefs mounts use it by
# default then; `bench fuse` measures both transports); the setting is restored at the end.
uring_param=/sys/module/fuse/parameters/enable_uring
uring_note="not in this kernel"
if [ -w "$uring_param" ]; then
    uring_was=$(cat "$uring_param")
    echo 1 > "$uring_param"
    trap 'echo "$uring_was" > "$uring_param"' EXIT
    uring_note="offered for this run (enable_uring was $uring_was, restored after)"
fi

{
    echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "FUSE over io_uring: $uring_note"
    echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with local changes)')"
    echo "kernel: $(uname -r); CPUs: $(nproc); memory: $(free -g | awk '/Mem:/ {print $2}') GiB"
    echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
    echo "mode: $([ "$quick" -eq 1 ] && echo 'quick (small runs: check the pipeline, not the numbers)' || echo full)"
} > "$OUT/meta.txt"
rm -f "$OUT/failed.txt"

# step NAME COMMAND...: run it with its output in OUT/NAME.txt (standard error in NAME.err).
step() {
    local name=$1
    shift
    echo "evaluate: $name: $*" >&2
    local start=$SECONDS
    if "$@" > "$OUT/$name.txt" 2> "$OUT/$name.err"; then
        echo "evaluate: $name done in $((SECONDS - start)) s" >&2
    else
        local rc=$?
        echo "$name: exit $rc after $((SECONDS - start)) s: $(tail -n 1 "$OUT/$name.err")" | tee -a "$OUT/failed.txt" >&2
    fi
}

step workload "$W" bench workload --quiet --json "$OUT/workload.json" "${workload_args[@]}"
step syscall "$W" bench syscall "${syscall_args[@]}"
step fuse "$W" bench fuse "${fuse_args[@]}"
step mmap "$W" bench mmap "${mmap_args[@]}"
step app "$W" bench app "${app_args[@]}"
step mount_time "$E/mount_time" "$files" "$dirs"
step mount_cli_time bash scripts/mount_cli_time.sh "$files" "$dirs" "$W" "$E/mount_time"
step dram "$E/dram_per_file" "$files"
step daemon_dram bash scripts/daemon_dram.sh "$files" "$W"

"$PY" scripts/evaluation_report.py "$OUT"
[ ! -s "$OUT/failed.txt" ]
