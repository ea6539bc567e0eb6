#!/usr/bin/env python3
"""Random name changes applied to two directories, the outcomes and the trees compared.

For tests/fuse_mount.rs: REFERENCE is a directory of a local file system, SUBJECT one on the
winefs mount (both emptied first). Each operation (create, mkdir, symlink, link, rename and
renameat2 with RENAME_NOREPLACE or RENAME_EXCHANGE, unlink, rmdir, chmod, rewrite, stat,
listdir) is made on paths up to three names deep from a small set of names, so most of them
meet existing names, the wrong kind of file, symlink loops or missing parents. The result, a
value or an errno, must be the same on both; every fifth operation the whole trees (kinds,
permissions, link counts of non-directories, symlink targets, file bytes) must be too (every
25th under --kill-state). The kernel's caches of the mount (names, attributes, missing names)
are in the path.

    nsdiff.py REFERENCE SUBJECT SEED OPERATIONS
    nsdiff.py --kill-state FILE REFERENCE SUBJECT SEED OPERATIONS     (then, after a remount:)
    nsdiff.py --verify FILE SUBJECT
    nsdiff.py --enospc REFERENCE SUBJECT SEED OPERATIONS

With --kill-state the subject's daemon is expected to be killed under the run (a strict mount:
every name change is durable and atomic when it returns): after printing "ready" the run goes
on until a call on the subject fails as a dead daemon's mount answers, then saves to FILE the
reference tree and, for a change in flight, the trees it may have left, and exits with status
3. --verify demands the subject, once mounted again, be one of those trees. A create (open,
write, close) or a rewrite (open with O_TRUNC, write) is several calls, so in flight it may
also have left the file empty.
With --enospc the subject's file system is nearly full: a change it refuses with ENOSPC is
not made on the reference, and the trees are compared at once: a refused change must have
changed nothing (a create or rewrite refused at its write keeps what its open did: an empty
file), and unlink, rmdir, chmod, stat and listdir must never be refused so.
Exit status 1 and the last operations on the first difference.
"""
import ctypes
import errno
import os
import pickle
import random
import shutil
import stat
import sys

LIBC = ctypes.CDLL(None, use_errno=True)
AT_FDCWD, RENAME_NOREPLACE, RENAME_EXCHANGE = -100, 1, 2
# What a dead daemon's mount answers (ECANCELED: a request in flight over io_uring).
GONE = (errno.ENOTCONN, errno.ECONNABORTED, errno.ECANCELED, errno.EIO, errno.ENODEV)
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


def raise_it(e):
    raise e


def tree(root):
    out = {}
    for top, dirs, files in os.walk(root, onerror=raise_it):
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


class Gone(Exception):
    pass


def outcome(root, kill_state, op, a, b, data, mode):
    try:
        return ("ok", apply(root, op, a, b, data, mode))
    except OSError as e:
        if kill_state and e.errno in GONE:
            raise Gone(e)
        return ("error", errno.errorcode.get(e.errno, e.errno))


def save(path, ref, change):
    """The --kill-state file: the trees the subject may hold, given the change in flight."""
    trees = [tree(ref)]
    if change:
        op, a, b, data, mode = change
        try:
            apply(ref, op, a, b, data, mode)
        except OSError:
            pass
        trees.append(tree(ref))
        pa = os.path.join(ref, a)
        if op in ("create", "rewrite") and os.path.isfile(pa) and not os.path.islink(pa):
            # Opened (created, or truncated) but not yet written: empty, under every link.
            ino = os.lstat(pa).st_ino
            empty_file = dict(trees[-1])
            for k, v in trees[-1].items():
                if os.lstat(os.path.join(ref, k)).st_ino == ino:
                    empty_file[k] = v[:3] + (b"",)
            trees.append(empty_file)
    with open(path, "wb") as f:
        pickle.dump(trees, f)


def verify(path, sub):
    with open(path, "rb") as f:
        trees = pickle.load(f)
    got = tree(sub)
    if got in trees:
        print(f"ok: {len(got)} names, the tree " + ("before the change in flight" if got == trees[0] else
                                                   "with the change in flight"))
        return
    want = trees[0]
    bad = sorted(k for k in set(want) | set(got) if want.get(k) != got.get(k))
    print("FAIL: the tree is none of the " + str(len(trees)) + " allowed; against the one before: " + ", ".join(
        f"{k!r} ({str(want.get(k))[:60]} / {str(got.get(k))[:60]})" for k in bad[:5]))
    sys.exit(1)


def main():
    args = sys.argv[1:]
    if args[0] == "--verify":
        verify(args[1], args[2])
        return
    kill_state, enospc, refused = None, False, 0
    if args[0] == "--kill-state":
        kill_state, args = args[1], args[2:]
    elif args[0] == "--enospc":
        enospc, args = True, args[1:]
    ref, sub, seed, count = args[0], args[1], int(args[2]), int(args[3])
    rnd = random.Random(seed)
    for root in (ref, sub):
        empty(root)
    # Under --kill-state most of the run's time would go to walking trees: compare fewer.
    every = 25 if kill_state else 5
    if kill_state:
        print("ready", flush=True)
    log = []
    for i in range(count):
        op = rnd.choice(OPS)
        a, b = ("/".join(rnd.choice(NAMES) for _ in range(rnd.choice([1, 1, 2, 2, 3]))) for _ in range(2))
        data, mode = rnd.randbytes(rnd.randrange(0, 100)), rnd.choice([0o644, 0o600, 0o755, 0o700])
        # The subject first: under --kill-state a change that fails there is in flight, and
        # the reference must not have it yet.
        try:
            got = outcome(sub, kill_state, op, a, b, data, mode)
        except Gone as e:
            print(f"the mount went away after {i} operations: {e}")
            save(kill_state, ref, (op, a, b, data, mode))
            sys.exit(3)
        no_space = enospc and got == ("error", "ENOSPC")
        if no_space and op in ("unlink", "rmdir", "chmod", "stat", "listdir"):
            print(f"FAIL seed {seed}, operation {i}: {op} {a!r} refused for lack of space")
            sys.exit(1)
        if no_space:
            refused += 1
            if op in ("create", "rewrite") and os.path.isfile(os.path.join(sub, a)) and \
                    os.path.getsize(os.path.join(sub, a)) == 0:
                # The open (create, truncate) was done; the write found no space.
                outcome(ref, None, op, a, b, b"", mode)
            results = [got, got]
        else:
            results = [outcome(ref, None, op, a, b, data, mode), got]
        log.append(f"{op} {a!r} {b!r}: {results[0]} / {results[1]}")
        differs = None
        if results[0] != results[1]:
            differs = "the results differ"
        elif no_space or i % every == every - 1 or i == count - 1:
            want = tree(ref)
            try:
                got = tree(sub)
            except OSError as e:
                if not (kill_state and e.errno in GONE):
                    raise
                print(f"the mount went away after {i + 1} operations: {e}")
                save(kill_state, ref, None)
                sys.exit(3)
            if want != got:
                bad = sorted(k for k in set(want) | set(got) if want.get(k) != got.get(k))
                differs = "the trees differ at " + ", ".join(
                    f"{k!r} ({str(want.get(k))[:60]} / {str(got.get(k))[:60]})" for k in bad[:5])
        if differs:
            print(f"FAIL seed {seed}, operation {i}: {differs}")
            print("\n".join(log[-15:]))
            sys.exit(1)
    if kill_state:
        save(kill_state, ref, None)
    print(f"ok: seed {seed}, {count} operations" + (f", {refused} refused for lack of space" if enospc else ""))


main()
