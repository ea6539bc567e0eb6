#!/usr/bin/env bash
# The first run: install what is needed, build, mount winefs on its embedded default pool (a
# pool on a hugepage tmpfs it sets up itself as root) and use it with ordinary tools. The file
# system stays mounted afterwards; the last lines say how to unmount it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
if ! command -v cargo >/dev/null 2>&1; then export PATH="${HOME:-/root}/.cargo/bin:$PATH"; fi
cargo build --release --quiet
W="$PWD/target/release/winefs"

if [ "$(id -u)" -eq 0 ]; then M=/mnt/winefs; else M="$HOME/winefs"; fi
if grep -qs " $M fuse" /proc/self/mounts; then
    echo "winefs is already mounted on $M; using it"
else
    "$W" mount
fi

echo
echo "== ordinary tools on $M =="
run() { echo "\$ $*"; "$@"; }
run mkdir -p "$M/demo"
run cp -a /usr/share/common-licenses "$M/demo/"
run sh -c "echo 'hello from winefs' > '$M/demo/hello.txt'"
run ln -sf hello.txt "$M/demo/link"
run cat "$M/demo/link"
run dd if=/dev/urandom of="$M/demo/big.bin" bs=1M count=16 status=none
run sha256sum "$M/demo/big.bin"
run ls -la "$M/demo"
run du -sh "$M/demo"
run df -h "$M"
echo
echo "winefs stays mounted on $M. Unmount with: umount $M   (as a user: fusermount3 -u $M)"
echo "Then inspect the pool with: $W info /mnt/winefs-huge/winefs.pool"
