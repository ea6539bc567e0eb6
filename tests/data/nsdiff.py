#!/usr/bin/env python3
"""Random name changes applied to two directories, the outcomes and the trees compared.

For tests/fuse_mount.rs: REFERENCE is a directory of a local file system, SUBJECT one on the
winefs mount (both emptied first). Each operation (create, mkdir, symlink, link, rename and
renameat2 with RENAME_NOREPLACE or RENAME_EXCHANGE, unlink, rmdir, chmod, rewrite, stat,
listdir) is made on paths up to three names deep from a small set of names, so most of them
meet existing names, the wrong kind of file, symlink loops or missing parents. The result, a
value or an errno, must be the same on both; every fifth operation the whole trees (kinds,
permissions, link counts of non-directories, symlink targets, file bytes) must be too. The
kernel's caches of the mount (names, attributes, missing names) are in the path.

    nsdiff.py REFERENCE SUBJECT SEED OPERATIONS

Exit status 1 and the last operations on the first difference.
"""
import ctypes
import errno
import os
import random
import shutil
import stat
import sys

LIBC = ctypes.CDLL(None, use_errno=True)
AT_FDCWD, RENAME_NOREPLACE, RENAME_EXCHANGE = -100, 1, 2
NAMES = ["a", "b", "c", "d1", "d2", "x y", "é"]
OPS = ["create", "mkdir", "symlink", "link", "rename", "rename_noreplace", "exchange", "unlink",
       "rmdir", "chmod", "rewrite", "stat", "listdir"]


def renameat2(a, b, flags):
    if LIBC.renameat2(AT_FDCWD, a.encode(), AT_FDCWD, b.encode(), flags) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def apply(root, op, a, b, data, mode):
    pa, pb = os.path.join(root, a), os.path.join(root, b)
    if op == "create":
        fd = os.open(pa, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        os.write(fd, data)
        os.close(fd)
    elif op == "mkdir":
        os.mkdir(pa, 0o755)
    elif op == "symlink":
        os.symlink(b, pa)
    elif op == "link":
        os.link(pa, pb, follow_symlinks=False)
    elif op == "rename":
        os.rename(pa, pb)
    elif op == "rename_noreplace":
        renameat2(pa, pb, RENAME_NOREPLACE)
    elif op == "exchange":
        renameat2(pa, pb, RENAME_EXCHANGE)
    elif op == "unlink":
        os.unlink(pa)
    elif op == "rmdir":
        os.rmdir(pa)
    elif op == "chmod":
        os.chmod(pa, mode)
    elif op == "rewrite":
        fd = os.open(pa, os.O_WRONLY | os.O_TRUNC)
        os.write(fd, data)
        os.close(fd)
    elif op == "stat":
        st = os.stat(pa)
        is_dir = stat.S_ISDIR(st.st_mode)
        # A directory's size is the file system's own (tmpfs counts entries, ext4 blocks).
        return stat.S_IFMT(st.st_mode), None if is_dir else st.st_size, None if is_dir else st.st_nlink
    elif op == "listdir":
        return sorted(os.listdir(pa))
    return None


def tree(root):
    out = {}
    for top, dirs, files in os.walk(root):
        for name in dirs + files:
            p = os.path.join(top, name)
            st = os.lstat(p)
            info = (stat.S_IFMT(st.st_mode), oct(st.st_mode & 0o7777))
            if stat.S_ISLNK(st.st_mode):
                info += (st.st_nlink, os.readlink(p))
            elif stat.S_ISREG(st.st_mode):
                with open(p, "rb") as f:
                    info += (st.st_nlink, f.read())
            out[os.path.relpath(p, root)] = info
    return out


def empty(root):
    for name in os.listdir(root):
        p = os.path.join(root, name)
        if os.path.isdir(p) and not os.path.islink(p):
            shutil.rmtree(p)
        else:
            os.unlink(p)


def main():
    ref, sub, seed, count = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    rnd = random.Random(seed)
    for root in (ref, sub):
        empty(root)
    log = []
    for i in range(count):
        op = rnd.choice(OPS)
        a, b = ("/".join(rnd.choice(NAMES) for _ in range(rnd.choice([1, 1, 2, 2, 3]))) for _ in range(2))
        data, mode = rnd.randbytes(rnd.randrange(0, 100)), rnd.choice([0o644, 0o600, 0o755, 0o700])
        results = []
        for root in (ref, sub):
            try:
                results.append(("ok", apply(root, op, a, b, data, mode)))
            except OSError as e:
                results.append(("error", errno.errorcode.get(e.errno, e.errno)))
        log.append(f"{op} {a!r} {b!r}: {results[0]} / {results[1]}")
        differs = None
        if results[0] != results[1]:
            differs = "the results differ"
        elif i % 5 == 4 or i == count - 1:
            want, got = tree(ref), tree(sub)
            if want != got:
                bad = sorted(k for k in set(want) | set(got) if want.get(k) != got.get(k))
                differs = "the trees differ at " + ", ".join(
                    f"{k!r} ({str(want.get(k))[:60]} / {str(got.get(k))[:60]})" for k in bad[:5])
        if differs:
            print(f"FAIL seed {seed}, operation {i}: {differs}")
            print("\n".join(log[-15:]))
            sys.exit(1)
    print(f"ok: seed {seed}, {count} operations")


main()
