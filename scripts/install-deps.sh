#!/usr/bin/env bash
# Install what building, mounting and testing winefs needs on Debian/Ubuntu (run as root, or
# with sudo available): a C toolchain and pkg-config for the build, fuse3 for mounting,
# libfuse3-dev for the example `winefs bench fuse` measures beside winefs, and the
# tools the FUSE integration tests drive (rsync, git, sqlite3, fio, attr, acl), and the unmodified
# programs and libraries the preload tests run (lmdb-utils, liblmdb-dev, python3-lmdb,
# librocksdb-dev, rocksdb-tools, libleveldb-dev), and the NFS server and client the export test
# runs (nfs-ganesha with its VFS backend, which brings rpcbind; libnfs-utils, a user-space
# client, since the kernel here has none), and e2fsprogs and xfsprogs for the ext4 and xfs loop
# images `winefs bench workload` compares against. Checks that cargo is new enough for Rust
# edition 2024. Installs nothing that is already there.
set -euo pipefail

MIN_RUST_MINOR=88 # edition 2024 and its let chains (`if let ... && let ...`) need Rust 1.88

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; elif command -v sudo >/dev/null 2>&1; then sudo "$@"; else
        echo "install-deps: need root to run: $*" >&2
        exit 1
    fi
}

# A rustup toolchain in the usual place counts even if this shell's PATH lacks it.
if ! command -v cargo >/dev/null 2>&1 && [ -x "${HOME:-/root}/.cargo/bin/cargo" ]; then
    export PATH="${HOME:-/root}/.cargo/bin:$PATH"
fi

missing=()
for pkg in build-essential pkg-config ca-certificates fuse3 libfuse3-dev rsync git sqlite3 fio attr acl tar \
    lmdb-utils liblmdb-dev python3-lmdb librocksdb-dev rocksdb-tools libleveldb-dev \
    nfs-ganesha nfs-ganesha-vfs rpcbind libnfs-utils e2fsprogs xfsprogs; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
command -v cargo >/dev/null 2>&1 || missing+=(cargo rustc)
if [ "${#missing[@]}" -gt 0 ]; then
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "install-deps: missing ${missing[*]} and no apt-get to install them" >&2
        exit 1
    fi
    echo "install-deps: installing ${missing[*]}"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

ver="$(cargo --version | awk '{print $2}')"
minor="$(echo "$ver" | cut -d. -f2)"
if [ "$(echo "$ver" | cut -d. -f1)" -lt 1 ] || [ "${minor:-0}" -lt "$MIN_RUST_MINOR" ]; then
    echo "install-deps: cargo $ver is too old: winefs uses Rust edition 2024 (Rust 1.$MIN_RUST_MINOR or newer)." >&2
    echo "install-deps: install a newer toolchain (rustup, or Debian backports) and put its cargo first on PATH." >&2
    exit 1
fi
if [ ! -e /dev/fuse ]; then
    as_root modprobe fuse 2>/dev/null || true
    [ -e /dev/fuse ] || echo "install-deps: warning: /dev/fuse is missing; mounting will fail" >&2
fi
echo "install-deps: ok ($(cargo --version))"
