#!/usr/bin/env python3
"""Random file operations on one file, checked against a model of its bytes after each one.

For tests/preload.rs, which runs it on a winefs mount with and without libwinefs_preload.so
(in the spirit of the fsx tool: whatever path a call takes, the file must read as the model).

    fsx.py FILE --seed N --ops N [--max-len BYTES] [--only write,read,...] [--mapping]
    fsx.py FILE --seed N --ops N --threads N [--mapping] [--region K]
    fsx.py FILE --seed N --ops N --kill-state DIR     (then, after a remount:)
    fsx.py FILE --verify DIR
    fsx.py FILE --seed N --ops N --enospc
    fsx.py FILE --seed N --ops N --client-state DIR     (killed; then:)
    fsx.py FILE --verify DIR --torn

Operations: pwrite and pread (up to 64 KiB), write(2) and read(2) at the offset after an
lseek, write(2) through a second descriptor opened with O_APPEND, copy_file_range from another
file, ftruncate, fallocate (plain, KEEP_SIZE, PUNCH_HOLE, ZERO_RANGE), stores and loads through
short-lived shared mappings, fsync, close and reopen. After each one the size must match (fstat); every read, load and check compares bytes.
With --mapping a shared mapping of the whole range stays open from the start (made while the
file is that long, then the file is truncated to zero) and must read as the model after every
operation, as a kernel mapping does: zeros where the file was punched, zeroed, or grown back.
With --threads, that many threads share a file of a fixed size, each with a region of 512
KiB of its own (a model each) and half of them through a descriptor of their own: pwrite,
pread, punch hole, zero range, stores and loads through short-lived mappings, and with
--mapping loads through one mapping of the whole file. One thread's munmap or mmap must never
disturb another's call in flight. With --region K the threads take regions K, K+1, ... of a
file the caller made (zero, large enough), so several processes can share it.
With --kill-state the run expects its file system's daemon to be killed under it (a strict
mount, so every call that returned is durable and atomic): after printing "ready" it runs the
operations that need no mapping until one fails as a dead daemon's mount answers (ENOTCONN,
ECONNABORTED, ECANCELED over io_uring, EIO, ENODEV), then writes DIR/before (the model with
every call that returned), for a call in flight DIR/after (the model had it completed), and
DIR/how, and exits with status 3 (0 if the daemon outlived the run). --verify compares the
file, once mounted again, with those: one model or the other whole, or for a punch each 2 MiB
unit as one or the other (punch hole is atomic per unit), for a plain fallocate the model's
bytes at a size between the two, or for a direct write (the library) from inside the file to
past its end the bytes it wrote inside at the old size (its size is pulled in later).
With --enospc the file system is nearly full: a call refused with ENOSPC must leave the file as
it was (a plain fallocate may have grown it by zeroed units), and a write cut short of space
must return what it wrote; no mapped operations (a store into a hole would fault).
With --client-state the run itself is expected to be killed: it keeps DIR/state (the model,
and for a call in flight the model had it completed) up to date around every call that
changes the file, and --verify --torn then allows, for the call in flight, each byte to be the
one before or after (a direct write is not atomic when its writer dies) at either size.
Exit status 1 and the last operations on the first difference.
"""
import argparse
import ctypes
import ctypes.util
import errno
import mmap
import os
import pickle
import random
import sys
import threading

LIBC = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
LIBC.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
KEEP_SIZE, PUNCH_HOLE, ZERO_RANGE = 0x1, 0x2, 0x10
WEIGHTS = {"write": 20, "read": 15, "trunc": 6, "punch": 5, "zero": 5, "falloc": 4,
           "mapwrite": 6, "mapread": 6, "fsync": 2, "reopen": 2, "check": 2,
           "append": 4, "seqio": 5, "copy": 3}
# What a dead daemon's mount answers: calls in flight at the kill, and calls after it.
GONE = (errno.ENOTCONN, errno.ECONNABORTED, errno.ECANCELED, errno.EIO, errno.ENODEV)
UNIT = 2 << 20


def grow(model, to):
    if to > len(model):
        model.extend(bytes(to - len(model)))


def fallocate(fd, mode, off, length):
    if LIBC.fallocate(fd, mode, off, length) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


class Run:
    def __init__(self, args):
        self.path, self.max_len = args.file, args.max_len
        self.rnd = random.Random(args.seed)
        self.model = bytearray()
        self.log = []
        self.pending = None
        self.kill_state = args.kill_state
        self.client_state = args.client_state
        if self.client_state:
            os.makedirs(self.client_state, exist_ok=True)
        self.enospc, self.refused = args.enospc, 0
        self.pull_at_fstat = "winefs_preload" in os.environ.get("LD_PRELOAD", "")
        if os.path.exists(self.path):
            os.unlink(self.path)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        self.append_fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        self.source = self.path + ".source"
        with open(self.source, "wb") as f:
            f.write(self.rnd.randbytes(256 << 10))
        with open(self.source, "rb") as f:
            self.source_bytes = f.read()
        self.source_fd = os.open(self.source, os.O_RDONLY)
        self.mapping = None
        if args.mapping:
            span = self.max_len + (2 << 20)
            os.ftruncate(self.fd, span)
            self.mapping = mmap.mmap(self.fd, span)
            os.ftruncate(self.fd, 0)

    def fail(self, what):
        print(f"FAIL after {len(self.log)} operations: {what}")
        for line in self.log[-20:]:
            print("   ", line)
        sys.exit(1)

    def compare(self, got, off, what):
        want = bytes(self.model[off:off + len(got)])
        if got != want:
            n = min(len(got), len(want))
            k = next((j for j in range(n) if got[j] != want[j]), n)
            self.fail(f"{what} at {off}: {len(got)} bytes, {len(want)} expected; first difference "
                      f"at {off + k}: {got[k:k + 8].hex()} instead of {want[k:k + 8].hex()}")

    def span(self, limit, most):
        off = self.rnd.randrange(0, limit)
        return off, max(1, min(self.rnd.randrange(1, most), self.max_len - off))

    def grow_model(self, to):
        grow(self.model, to)

    def change(self, effect, call, how="whole"):
        """Make a call that changes the file: `effect` applies it to a model. Under
        --kill-state the model it would leave is kept until the call returns, so that a call
        in flight at the kill is known."""
        before, after = self.model, bytearray(self.model)
        effect(after)
        self.pending = (how, before, after)
        self.record(how, before, after)
        # A call cut short (a short write) returns the model it left.
        cut = call()
        self.model = cut if isinstance(cut, bytearray) else after
        self.record("none", self.model, None)
        if not self.pull_at_fstat:
            self.pending = None

    def record(self, how, before, after):
        """Under --client-state: what the file may hold if this process dies now."""
        if not self.client_state:
            return
        tmp = os.path.join(self.client_state, "state.tmp")
        with open(tmp, "wb") as f:
            pickle.dump((how, bytes(before), None if after is None else bytes(after), self.log[-20:]), f)
        os.rename(tmp, os.path.join(self.client_state, "state"))

    def written(self, off, data, call, what):
        """A write of `data` at `off` made by `call`, which returns the count written."""
        n = len(data)

        def effect(m):
            grow(m, off)
            m[off:off + n] = data

        def checked():
            done = call()
            self.moved = done
            if done == n:
                return None
            if self.enospc and 0 < done < n:
                # Short of space a write is cut into pieces and returns what it wrote.
                self.log.append(f"    wrote {done} of {n} bytes")
                first = bytearray(self.model)
                grow(first, off)
                first[off:off + done] = data[:done]
                return first
            # Through an open the kernel caches, a write that starts inside a page the kernel
            # does not hold reaches the daemon as two requests: to that page's end, then the
            # rest (DESIGN §7, "Atomicity holds per FUSE request"). A daemon killed between
            # them leaves the first, and write(2) returns its length.
            if self.kill_state and 0 < done < n and (off + done) % mmap.PAGESIZE == 0:
                first = bytearray(self.model)
                grow(first, off)
                first[off:off + done] = data[:done]
                self.pending = ("whole", first, self.pending[2])
                raise OSError(errno.ECONNABORTED, f"{what} wrote {done} of {n} bytes")
            self.fail(f"{what} wrote {done} of {n} bytes")
        # A direct write (the library) that starts inside the file and ends past it stores
        # the inside bytes durably at once and the rest with the size at the daemon's next
        # pull (DESIGN §7b, "Crash semantics"): a daemon killed between leaves the first part.
        self.change(effect, checked, "extend" if self.pull_at_fstat and off < len(self.model) < off + n else "whole")

    def step(self, op):
        size, rnd = len(self.model), self.rnd
        if op == "write":
            off, n = self.span(self.max_len, 65536)
            data = rnd.randbytes(n)
            self.log.append(f"pwrite {off}+{n} (size {size})")
            self.written(off, data, lambda: os.pwrite(self.fd, data, off), "pwrite")
        elif op == "read":
            off, n = rnd.randrange(0, size + 4096), rnd.randrange(1, 65536)
            self.log.append(f"pread {off}+{n} (size {size})")
            self.compare(os.pread(self.fd, n, off), off, "pread")
        elif op == "trunc":
            to = rnd.randrange(0, self.max_len)
            self.log.append(f"ftruncate {to} (size {size})")

            def effect(m):
                del m[to:]
                grow(m, to)
            self.change(effect, lambda: os.ftruncate(self.fd, to))
        elif op == "punch" and size:
            off, n = rnd.randrange(0, size), rnd.randrange(1, 3 * 65536)
            self.log.append(f"punch hole {off}+{n} (size {size})")
            end = min(off + n, size)

            def effect(m):
                m[off:end] = bytes(end - off)
            self.change(effect, lambda: fallocate(self.fd, PUNCH_HOLE | KEEP_SIZE, off, n), "units")
        elif op in ("zero", "falloc"):
            off, n = self.span(self.max_len, 3 * 65536)
            keep = rnd.random() < 0.4
            self.log.append(f"{op} {off}+{n} keep_size={keep} (size {size})")

            def effect(m):
                if not keep:
                    grow(m, off + n)
                if op == "zero":
                    end = min(off + n, len(m))
                    if off < end:
                        m[off:end] = bytes(end - off)
            mode = (ZERO_RANGE if op == "zero" else 0) | (KEEP_SIZE if keep else 0)
            self.change(effect, lambda: fallocate(self.fd, mode, off, n),
                        "whole" if op == "zero" else "grown")
        elif op == "mapwrite":
            off, n = self.span(self.max_len, 65536)
            self.log.append(f"store through a mapping {off}+{n} (size {size})")
            data, flush = rnd.randbytes(n), rnd.random() < 0.5

            def effect(m):
                grow(m, off + n)
                m[off:off + n] = data

            def call():
                if off + n > size:
                    os.ftruncate(self.fd, off + n)
                page = off - off % mmap.PAGESIZE
                m = mmap.mmap(self.fd, off + n - page, offset=page)
                m[off - page:off - page + n] = data
                if flush:
                    m.flush()
                m.close()
            self.change(effect, call)
        elif op == "mapread" and size:
            off = rnd.randrange(0, size)
            n = rnd.randrange(1, min(65536, size - off) + 1)
            self.log.append(f"load through a mapping {off}+{n} (size {size})")
            page = off - off % mmap.PAGESIZE
            m = mmap.mmap(self.fd, off + n - page, offset=page, prot=mmap.PROT_READ)
            got = m[off - page:off - page + n]
            m.close()
            self.compare(got, off, "load through a mapping")
        elif op == "append":
            n = rnd.randrange(1, 20000)
            if size + n > self.max_len:
                return
            data = rnd.randbytes(n)
            self.log.append(f"write {n} bytes with O_APPEND (size {size})")
            self.written(size, data, lambda: os.write(self.append_fd, data), "write with O_APPEND")
        elif op == "seqio":
            off, n = self.span(self.max_len, 65536)
            os.lseek(self.fd, off, os.SEEK_SET)
            if rnd.random() < 0.5:
                data = rnd.randbytes(n)
                self.log.append(f"lseek {off}, write {n} (size {size})")
                self.written(off, data, lambda: os.write(self.fd, data), "write")
                moved = self.moved
            else:
                self.log.append(f"lseek {off}, read {n} (size {size})")
                got = os.read(self.fd, n)
                self.compare(got, off, "read at the offset")
                moved = len(got)
            at = os.lseek(self.fd, 0, os.SEEK_CUR)
            if at != off + moved:
                self.fail(f"the offset is {at} after the call, {off + moved} expected")
        elif op == "copy":
            off, n = self.span(self.max_len, 65536)
            src = rnd.randrange(0, len(self.source_bytes) - n)
            self.log.append(f"copy_file_range {n} bytes from {src} to {off} (size {size})")
            self.written(off, self.source_bytes[src:src + n],
                         lambda: os.copy_file_range(self.source_fd, self.fd, n, src, off), "copy_file_range")
        elif op == "fsync":
            self.log.append("fsync")
            os.fsync(self.fd)
        elif op == "reopen":
            self.log.append("close and reopen")
            os.close(self.fd)
            self.fd = os.open(self.path, os.O_RDWR)
        elif op == "check":
            self.log.append(f"read everything (size {size})")
            self.compare(os.pread(self.fd, size + 10, 0), 0, "read of the whole file")

    def no_space(self, e):
        """A call refused with ENOSPC must have left the file as it was (a plain fallocate
        may have grown it by whole units, zeros)."""
        if self.pending is None:
            self.fail(f"ENOSPC from a call that changes nothing: {e}")
        how, before, after = self.pending
        self.pending = None
        self.log.append("    refused: no space")
        if len(after) < len(before) and self.log[-2].startswith("ftruncate"):
            self.fail("a truncate to a smaller size was refused for lack of space")
        self.refused += 1
        got = os.pread(self.fd, len(after) + len(before) + 10, 0)
        if got == before:
            self.model = before
        elif how == "grown" and len(before) < len(got) <= len(after) and \
                got == before + bytes(len(got) - len(before)):
            self.model = bytearray(got)
        else:
            self.model = before
            self.compare(got, 0, "the file after a call refused for lack of space")
            self.fail(f"the file is {len(got)} bytes after a call refused for lack of space, "
                      f"{len(before)} before")

    def save(self, into):
        """The --kill-state files: the model, and the one a call in flight would leave."""
        os.makedirs(into, exist_ok=True)
        how, before, after = self.pending or ("none", self.model, None)
        with open(os.path.join(into, "before"), "wb") as f:
            f.write(before)
        if after is not None:
            with open(os.path.join(into, "after"), "wb") as f:
                f.write(after)
        with open(os.path.join(into, "how"), "w") as f:
            f.write(how + "\n" + "\n".join(self.log[-20:]) + "\n")

    def after(self):
        st = os.fstat(self.fd)
        # With the preload library a direct append's size is durable once the daemon pulls
        # it in, which this fstat does (DESIGN §7b, "Crash semantics").
        self.pending = None
        if st.st_size != len(self.model):
            self.fail(f"size {st.st_size}, {len(self.model)} expected")
        if self.mapping is not None and self.model:
            self.compare(self.mapping[:len(self.model)], 0, "the long-lived mapping")


def verify(path, state, torn=False):
    """The --verify check; exits with status 1 and the reason on a difference."""
    if os.path.exists(os.path.join(state, "state")):
        with open(os.path.join(state, "state"), "rb") as f:
            how, before, after, last = pickle.load(f)
    else:
        with open(os.path.join(state, "how")) as f:
            how, *last = f.read().splitlines()
        with open(os.path.join(state, "before"), "rb") as f:
            before = f.read()
        after = None
        if how != "none":
            with open(os.path.join(state, "after"), "rb") as f:
                after = f.read()
    with open(path, "rb") as f:
        got = f.read()

    def first_difference(a, b):
        n = min(len(a), len(b))
        k = next((j for j in range(n) if a[j] != b[j]), n)
        return f"{len(a)} bytes against {len(b)}, first difference at {k}"

    if got == before or got == after:
        why = None
    elif torn and after is not None and min(len(before), len(after)) <= len(got) <= max(len(before), len(after)):
        # Each byte the one before or the one after (past either model's end: zero).
        size = len(got)
        b, a = before[:size].ljust(size, b"\0"), after[:size].ljust(size, b"\0")
        k = next((i for i in range(size) if got[i] != b[i] and got[i] != a[i]), None)
        why = None if k is None else f"byte {k} is neither the model's nor the call in flight's"
    elif how == "extend" and got == after[:len(before)]:
        why = None
    elif how == "units" and len(got) == len(before):
        # Punch hole: each 2 MiB unit is wholly before or wholly after.
        why = next((f"the 2 MiB unit at {u} is neither the model's nor the punched one's"
                    for u in range(0, len(got), UNIT)
                    if got[u:u + UNIT] not in (before[u:u + UNIT], after[u:u + UNIT])), None)
    elif how == "grown" and len(before) <= len(got) <= len(after):
        # A plain fallocate grows the size unit by unit; the bytes stay the model's.
        padded = before + bytes(len(got) - len(before))
        why = None if got == padded else "fallocate changed bytes: " + first_difference(got, padded)
    else:
        why = "the file is neither the model nor the model with the call in flight: " + \
            first_difference(got, before)
    if why:
        print(f"FAIL ({how}): {why}")
        for line in last:
            print("   ", line)
        sys.exit(1)
    made = "the model" if got == before else "the call in flight made" if got == after else "the call in flight in part"
    print(f"ok: {len(got)} bytes, {made}")


REGION = 512 << 10


def threads(args):
    """The --threads run; returns the first failure, or None."""
    first = args.region or 0
    size = REGION * (first + args.threads)
    if args.region is None:
        fd = os.open(args.file, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        os.ftruncate(fd, size)
    else:
        # Regions of a file other processes share: made zero and large enough by the caller.
        fd = os.open(args.file, os.O_RDWR)
        if os.fstat(fd).st_size < size:
            print(f"FAIL the file is smaller than its {first + args.threads} regions")
            sys.exit(1)
    whole = mmap.mmap(fd, size) if args.mapping else None
    failures = []

    def worker(t):
        rnd = random.Random(args.seed * 1000 + first + t)
        base, model = (first + t) * REGION, bytearray(REGION)
        own = os.open(args.file, os.O_RDWR) if t % 2 else fd
        for i in range(args.ops):
            op = rnd.choice(["write", "read", "punch", "zero", "mapwrite", "mapread", "whole"])
            off = rnd.randrange(0, REGION - 1)
            n = rnd.randrange(1, min(65536, REGION - off) + 1)
            at = base + off
            try:
                if op == "write":
                    data = rnd.randbytes(n)
                    os.pwrite(own, data, at)
                    model[off:off + n] = data
                elif op in ("punch", "zero"):
                    mode = PUNCH_HOLE | KEEP_SIZE if op == "punch" else ZERO_RANGE | KEEP_SIZE
                    fallocate(own, mode, at, n)
                    model[off:off + n] = bytes(n)
                elif op in ("mapwrite", "mapread"):
                    page = at - at % mmap.PAGESIZE
                    m = mmap.mmap(own, at + n - page, offset=page)
                    if op == "mapwrite":
                        data = rnd.randbytes(n)
                        m[at - page:at - page + n] = data
                        model[off:off + n] = data
                        got = None
                    else:
                        got = m[at - page:at - page + n]
                    m.close()
                else:
                    got = os.pread(own, n, at) if op == "read" else whole[at:at + n] if whole else None
                if op in ("read", "mapread", "whole") and got is not None and got != model[off:off + n]:
                    failures.append(f"thread {t}, operation {i}: {op} {at}+{n} differs from the model")
                    return
            except OSError as e:
                failures.append(f"thread {t}, operation {i}: {op} {at}+{n}: {e}")
                return
        if os.pread(own, REGION, base) != model:
            failures.append(f"thread {t}: its region differs from the model at the end")
        if own != fd:
            os.close(own)

    workers = [threading.Thread(target=worker, args=(t,)) for t in range(args.threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    if whole is not None:
        whole.close()
    os.close(fd)
    return failures[0] if failures else None


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("file")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--ops", type=int, default=2000)
    p.add_argument("--max-len", type=int, default=1 << 20)
    p.add_argument("--only", help="comma-separated operation names")
    p.add_argument("--mapping", action="store_true")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--region", type=int, help="with --threads: the first region (the file is shared)")
    p.add_argument("--kill-state", metavar="DIR")
    p.add_argument("--verify", metavar="DIR")
    p.add_argument("--enospc", action="store_true")
    p.add_argument("--client-state", metavar="DIR")
    p.add_argument("--torn", action="store_true")
    args = p.parse_args()
    if args.verify:
        verify(args.file, args.verify, args.torn)
        return
    if args.threads:
        failure = threads(args)
        if failure:
            print(f"FAIL {failure}")
            sys.exit(1)
        print(f"ok: {args.threads} threads, {args.ops} operations each")
        return
    names = list(WEIGHTS)
    only = args.only.split(",") if args.only else names
    if args.kill_state or args.enospc:
        # A mapping of a file whose daemon died, or a store into a hole of a full file
        # system, faults (SIGBUS): no mapped operations.
        only = [n for n in only if n not in ("mapwrite", "mapread")]
    weights = [WEIGHTS[n] if n in only else 0 for n in names]
    run = Run(args)
    if args.kill_state or args.client_state:
        print("ready", flush=True)
    for _ in range(args.ops):
        op = run.rnd.choices(names, weights)[0]
        try:
            run.step(op)
            run.after()
        except OSError as e:
            if args.kill_state and e.errno in GONE:
                print(f"the mount went away after {len(run.log)} operations: {e}")
                run.save(args.kill_state)
                sys.exit(3)
            if args.enospc and e.errno == errno.ENOSPC:
                run.no_space(e)
                run.after()
                continue
            run.fail(f"{run.log[-1] if run.log else op}: {e}")
    run.step("check")
    if args.kill_state:
        run.save(args.kill_state)
    for fd in (run.fd, run.append_fd, run.source_fd):
        os.close(fd)
    os.unlink(run.source)
    refused = f", {run.refused} refused for lack of space" if args.enospc else ""
    print(f"ok: {args.ops} operations, final size {len(run.model)}{refused}")


main()
