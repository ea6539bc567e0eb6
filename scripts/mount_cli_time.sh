#!/bin/bash
# Mount time as issue 18 measures it: from the `winefs mount` command to a usable mount point
# (the command returns once the kernel has the mount, then a lookup through it answers), on a
# pool of FILES empty files in DIRS directories; after a clean unmount and after a crash (a
# process that exits with the pool mounted). Root (FUSE), a pool in /dev/shm; the pool is made
# and filled by examples/mount_time, which also times the library's own mount.
#   scripts/mount_cli_time.sh [FILES] [DIRS] [WINEFS] [MOUNT_TIME]
#   (default 1000000 files in 1000 directories, target/release/winefs,
#    target/release/examples/mount_time)
set -e
FILES=${1:-1000000}
DIRS=${2:-1000}
HERE=$(dirname "$0")/..
BIN=${3:-$HERE/target/release/winefs}
EX=${4:-$HERE/target/release/examples/mount_time}
D=$(mktemp -d /dev/shm/mtime.XXXX)
P=$D/pool
M=$D/mnt
mkdir "$M"
trap 'umount "$M" 2>/dev/null || true; rm -rf "$D"' EXIT
SIZE=$(( FILES * 8192 > 1073741824 ? FILES * 8192 : 1073741824 ))
"$BIN" mkfs "$P" --size "$SIZE" --inodes $(( FILES + DIRS + 1024 )) > /dev/null
start=$(date +%s.%N)
"$EX" populate "$P" "$FILES" "$DIRS"
echo "made $FILES files in $DIRS directories in $(echo "$(date +%s.%N) - $start" | bc) s"

# Seconds from the mount command to a lookup that answers through the mount.
timed_mount() {
    local t0 t1
    t0=$(date +%s.%N)
    "$BIN" mount "$P" "$M" > /dev/null
    stat "$M/d00000" > /dev/null
    t1=$(date +%s.%N)
    echo "$t1 - $t0" | bc
}

# Unmount and wait until the daemon has let the pool go.
unmount() {
    umount "$M"
    while pgrep -f "mount $P $M" > /dev/null; do sleep 0.05; done
}

for round in 1 2 3; do
    clean=$(timed_mount)
    unmount
    "$EX" crash "$P" "crashed-$round"
    crashed=$(timed_mount)
    unmount
    n=$(( FILES + DIRS + round ))
    python3 -c "print('round $round: clean mount $clean s (%.0f files/s), mount after a crash $crashed s (%.0f files/s)' % ($n / $clean, $n / $crashed))"
done
