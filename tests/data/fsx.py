#!/usr/bin/env python3
"""Random file operations on one file, checked against a model of its bytes after each one.

For tests/preload.rs, which runs it on a winefs mount with and without libwinefs_preload.so
(in the spirit of the fsx tool: whatever path a call takes, the file must read as the model).

    fsx.py FILE --seed N --ops N [--max-len BYTES] [--only write,read,...] [--mapping]
    fsx.py FILE --seed N --ops N --threads N [--mapping]

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
disturb another's call in flight.
Exit status 1 and the last operations on the first difference.
"""
import argparse
import ctypes
import ctypes.util
import mmap
import os
import random
import sys
import threading

LIBC = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
LIBC.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
KEEP_SIZE, PUNCH_HOLE, ZERO_RANGE = 0x1, 0x2, 0x10
WEIGHTS = {"write": 20, "read": 15, "trunc": 6, "punch": 5, "zero": 5, "falloc": 4,
           "mapwrite": 6, "mapread": 6, "fsync": 2, "reopen": 2, "check": 2,
           "append": 4, "seqio": 5, "copy": 3}


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
        if to > len(self.model):
            self.model.extend(bytes(to - len(self.model)))

    def step(self, op):
        size, rnd = len(self.model), self.rnd
        if op == "write":
            off, n = self.span(self.max_len, 65536)
            data = rnd.randbytes(n)
            self.log.append(f"pwrite {off}+{n} (size {size})")
            if os.pwrite(self.fd, data, off) != n:
                self.fail("short write")
            self.grow_model(off)
            self.model[off:off + n] = data
        elif op == "read":
            off, n = rnd.randrange(0, size + 4096), rnd.randrange(1, 65536)
            self.log.append(f"pread {off}+{n} (size {size})")
            self.compare(os.pread(self.fd, n, off), off, "pread")
        elif op == "trunc":
            to = rnd.randrange(0, self.max_len)
            self.log.append(f"ftruncate {to} (size {size})")
            os.ftruncate(self.fd, to)
            del self.model[to:]
            self.grow_model(to)
        elif op == "punch" and size:
            off, n = rnd.randrange(0, size), rnd.randrange(1, 3 * 65536)
            self.log.append(f"punch hole {off}+{n} (size {size})")
            fallocate(self.fd, PUNCH_HOLE | KEEP_SIZE, off, n)
            end = min(off + n, size)
            self.model[off:end] = bytes(end - off)
        elif op in ("zero", "falloc"):
            off, n = self.span(self.max_len, 3 * 65536)
            keep = rnd.random() < 0.4
            self.log.append(f"{op} {off}+{n} keep_size={keep} (size {size})")
            fallocate(self.fd, (ZERO_RANGE if op == "zero" else 0) | (KEEP_SIZE if keep else 0), off, n)
            if not keep:
                self.grow_model(off + n)
            if op == "zero":
                end = min(off + n, len(self.model))
                if off < end:
                    self.model[off:end] = bytes(end - off)
        elif op == "mapwrite":
            off, n = self.span(self.max_len, 65536)
            self.log.append(f"store through a mapping {off}+{n} (size {size})")
            if off + n > size:
                os.ftruncate(self.fd, off + n)
                self.grow_model(off + n)
            page = off - off % mmap.PAGESIZE
            m = mmap.mmap(self.fd, off + n - page, offset=page)
            data = rnd.randbytes(n)
            m[off - page:off - page + n] = data
            if rnd.random() < 0.5:
                m.flush()
            m.close()
            self.model[off:off + n] = data
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
            if os.write(self.append_fd, data) != n:
                self.fail("short append")
            self.model.extend(data)
        elif op == "seqio":
            off, n = self.span(self.max_len, 65536)
            os.lseek(self.fd, off, os.SEEK_SET)
            if rnd.random() < 0.5:
                data = rnd.randbytes(n)
                self.log.append(f"lseek {off}, write {n} (size {size})")
                if os.write(self.fd, data) != n:
                    self.fail("short write")
                self.grow_model(off)
                self.model[off:off + n] = data
                moved = n
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
            done = os.copy_file_range(self.source_fd, self.fd, n, src, off)
            self.grow_model(off)
            self.model[off:off + done] = self.source_bytes[src:src + done]
            if done != n:
                self.fail(f"copy_file_range copied {done} of {n}")
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

    def after(self):
        st = os.fstat(self.fd)
        if st.st_size != len(self.model):
            self.fail(f"size {st.st_size}, {len(self.model)} expected")
        if self.mapping is not None and self.model:
            self.compare(self.mapping[:len(self.model)], 0, "the long-lived mapping")


REGION = 512 << 10


def threads(args):
    """The --threads run; returns the first failure, or None."""
    size = REGION * args.threads
    fd = os.open(args.file, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    os.ftruncate(fd, size)
    whole = mmap.mmap(fd, size) if args.mapping else None
    failures = []

    def worker(t):
        rnd = random.Random(args.seed * 1000 + t)
        base, model = t * REGION, bytearray(REGION)
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
    args = p.parse_args()
    if args.threads:
        failure = threads(args)
        if failure:
            print(f"FAIL {failure}")
            sys.exit(1)
        print(f"ok: {args.threads} threads, {args.ops} operations each")
        return
    names = list(WEIGHTS)
    weights = [WEIGHTS[n] if not args.only or n in args.only.split(",") else 0 for n in names]
    run = Run(args)
    for _ in range(args.ops):
        op = run.rnd.choices(names, weights)[0]
        try:
            run.step(op)
        except OSError as e:
            run.fail(f"{run.log[-1] if run.log else op}: {e}")
        run.after()
    run.step("check")
    for fd in (run.fd, run.append_fd, run.source_fd):
        os.close(fd)
    os.unlink(run.source)
    print(f"ok: {args.ops} operations, final size {len(run.model)}")


main()
