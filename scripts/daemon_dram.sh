#!/bin/bash
# DRAM of the FUSE daemon per file (issue 18): the daemon's RssAnon (/proc/PID/status) on an empty
# pool, after N empty files are created through the mount, after a fresh mount, and after
# `ls -l` of every file; printed per file above the empty pool's. Root (FUSE), a pool in /dev/shm.
#   scripts/daemon_dram.sh [N] [WINEFS]    (default 200000 files, target/release/winefs)
set -e
N=${1:-200000}
BIN=${2:-$(dirname "$0")/../target/release/winefs}
D=$(mktemp -d /dev/shm/ddram.XXXX)
P=$D/pool; M=$D/mnt; mkdir $M
$BIN mkfs $P --size 2G --inodes $((N + 4096)) > /dev/null
anon() { grep RssAnon /proc/$1/status | awk '{print $2}'; }
pid_of() { pgrep -f "winefs mount $P" | head -1; }
$BIN mount $P $M > /dev/null; sleep 1
Z=$(anon $(pid_of)); echo "empty pool: daemon RssAnon $Z KiB"
python3 -c "
import os
d='$M/d'; os.mkdir(d)
for i in range($N): os.close(os.open(f'{d}/f{i:08}', os.O_CREAT|os.O_WRONLY, 0o644))
"
sleep 1; A=$(anon $(pid_of)); echo "after $N creates: daemon RssAnon $A KiB"
umount $M; sleep 1
$BIN mount $P $M > /dev/null; sleep 1
B=$(anon $(pid_of)); echo "fresh mount: daemon RssAnon $B KiB"
ls -l $M/d > /dev/null
C=$(anon $(pid_of)); echo "after ls -l of all: daemon RssAnon $C KiB"
python3 -c "print('per file, above the empty pool: after creates %.0f B, fresh mount %.0f B, after ls -l %.0f B' % (($A-$Z)*1024/$N, ($B-$Z)*1024/$N, ($C-$Z)*1024/$N))"
umount $M; sleep 1; rm -rf $D
