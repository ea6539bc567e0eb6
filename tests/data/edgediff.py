#!/usr/bin/env python3
"""Edge cases of POSIX calls, one line each, for comparing two file systems (tests/fuse_mount.rs
runs it on ext4 on a loop device and on the winefs mount, and the outputs must be equal).

    edgediff.py DIR

Each check prints its name and its result: a value, or the errno it failed with. Names (long,
trailing slashes, symlink loops and long targets), rename and rmdir rules, sparse files and
SEEK_DATA/SEEK_HOLE, limits of offsets, fallocate modes the kernel passes to FUSE, copy_file_range
and sendfile, times (nanoseconds, before the epoch, which calls change which times), extended
attributes and their limits, special files, O_TMPFILE, permissions as another user (sticky
directories, set-group-ID directories, set-ID bits dropped by chown, write and truncate,
search permission, write permission on directories for creates, removals and renames, device
nodes, trusted and security attributes), RLIMIT_FSIZE, the largest offsets, mmap against write
and truncate (SIGBUS), locks, readdir while the directory changes and telldir/seekdir,
renameat2 flags, link counts after renames, links of symlinks, utimensat with UTIME_OMIT, open
flags, chattr flags, removed working directories, unlinked open files, FIFOs, O_APPEND from
three processes, statfs accounting.

Left out as well: how many extended attributes fit (ext4 keeps them in the inode and one 4 KiB
block, winefs in one block of its own), a size limit rather than a rule.

Left out where the kernel's FUSE client itself answers differently from ext4, whatever the
server does: lseek past ext4's largest offset, FALLOC_FL_COLLAPSE_RANGE and INSERT_RANGE (refused
by the kernel), O_DIRECT at unaligned offsets (FUSE has no alignment rule), ext4's own inode
flags.
"""
import ctypes, errno, fcntl, hashlib, mmap, os, resource, shutil, signal, socket, stat, struct, sys, time

LIBC = ctypes.CDLL(None, use_errno=True)
root = sys.argv[1]
d = os.path.join(root, "probe")
shutil.rmtree(d, ignore_errors=True)
os.mkdir(d)
os.chmod(d, 0o777)
os.chdir(d)
out = []


def chk(name, f):
    try:
        r = f()
        out.append(f"{name}: ok {r!r}")
    except OSError as e:
        out.append(f"{name}: {errno.errorcode.get(e.errno, e.errno)}")
    except Exception as e:
        out.append(f"{name}: EXC {type(e).__name__} {e}")


def as_user(uid, gid, f):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            os.setgroups([])
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
            res = "ok " + repr(f())
        except OSError as e:
            res = errno.errorcode.get(e.errno, str(e.errno))
        except Exception as e:
            res = "EXC " + repr(e)
        os.write(w, res.encode())
        os._exit(0)
    os.close(w)
    data = b""
    while True:
        b = os.read(r, 4096)
        if not b:
            break
        data += b
    os.waitpid(pid, 0)
    os.close(r)
    return data.decode()


def opened(p, flags, mode=0o644):
    """Open and close: "opened" (a descriptor's number would differ with the process)."""
    os.close(os.open(p, flags, mode))
    return "opened"


def wr(p, data=b"x", mode=0o644):
    fd = os.open(p, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, mode)
    os.write(fd, data)
    os.close(fd)


def rd(p):
    with open(p, "rb") as f:
        return f.read()


# names
chk("name255", lambda: wr("n" * 255))
chk("name256", lambda: wr("n" * 256))
chk("trailing slash create", lambda: opened("tsf/", os.O_CREAT | os.O_WRONLY, 0o644))
wr("f")
chk("file/ stat", lambda: os.stat("f/"))
chk("O_DIRECTORY file", lambda: opened("f", os.O_RDONLY | os.O_DIRECTORY))
chk("mkdir exists", lambda: os.mkdir("f"))
os.mkdir("D")
chk("open dir wr", lambda: opened("D", os.O_WRONLY))
chk("link dir", lambda: os.link("D", "Dl"))
chk("rmdir dot", lambda: os.rmdir("D/."))
chk("rmdir dotdot", lambda: os.rmdir("D/.."))
os.mkdir("D/E")
chk("rename into own sub", lambda: os.rename("D", "D/E/F"))
chk("rename dir over file", lambda: os.rename("D/E", "f"))
wr("D/g")
chk("rename file over dir", lambda: os.rename("f", "D/E"))
os.mkdir("N"); wr("N/x")
chk("rename dir over nonempty", lambda: os.rename("D/E", "N"))
chk("rmdir nonempty", lambda: os.rmdir("N"))
chk("nlink dir", lambda: os.stat("D").st_nlink)
chk("nlink root after", lambda: os.stat(".").st_nlink)
chk("rename to self", lambda: os.rename("f", "f"))
os.link("f", "f2")
chk("rename hardlink same inode", lambda: (os.rename("f", "f2"), os.path.exists("f"), os.stat("f2").st_nlink))
chk("unlink dir", lambda: os.unlink("D"))
chk("rmdir file", lambda: os.rmdir("f2"))
os.symlink("loop1", "loop2"); os.symlink("loop2", "loop1")
chk("symlink loop", lambda: os.stat("loop1"))
chk("O_NOFOLLOW symlink", lambda: opened("loop1", os.O_RDONLY | os.O_NOFOLLOW))
chk("O_CREAT|O_EXCL on dangling symlink", lambda: opened("loop1", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
os.symlink("target_new", "dang")
chk("O_CREAT via dangling symlink", lambda: (os.close(os.open("dang", os.O_CREAT | os.O_WRONLY, 0o600)), os.path.exists("target_new")))
chk("symlink long target", lambda: (os.symlink("t" * 4095, "longsym"), len(os.readlink("longsym"))))
chk("symlink too long target", lambda: os.symlink("t" * 4096, "longsym2"))
def lchmod(p, mode):
    """fchmodat(2) with AT_SYMLINK_NOFOLLOW (Linux refuses it for a symlink)."""
    if LIBC.fchmodat(-100, p.encode(), mode, 0x100) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
chk("lchmod symlink", lambda: lchmod("dang", 0o700))
chk("symlink size", lambda: os.lstat("dang").st_size)
chk("symlink mode", lambda: oct(os.lstat("dang").st_mode))

# files
wr("h", b"")
fd = os.open("h", os.O_RDWR)
os.pwrite(fd, b"end", 10 * 1024 * 1024)
chk("sparse size", lambda: os.fstat(fd).st_size)
chk("sparse blocks small", lambda: os.fstat(fd).st_blocks < 100)
chk("seek data", lambda: os.lseek(fd, 0, os.SEEK_DATA))
chk("seek hole", lambda: os.lseek(fd, 0, os.SEEK_HOLE))
chk("seek data past end", lambda: os.lseek(fd, 11 * 1024 * 1024, os.SEEK_DATA))
chk("seek hole at end-1", lambda: os.lseek(fd, 10 * 1024 * 1024 + 2, os.SEEK_HOLE))
chk("read hole zeros", lambda: os.pread(fd, 16, 4096) == b"\0" * 16)
chk("read past end", lambda: os.pread(fd, 16, 20 * 1024 * 1024))
chk("ftruncate negative", lambda: os.ftruncate(fd, -1))
chk("pwrite negative", lambda: os.pwrite(fd, b"a", -1))
chk("ftruncate huge", lambda: os.ftruncate(fd, 1 << 62))
chk("pwrite at 2^63-2", lambda: os.pwrite(fd, b"ab", (1 << 63) - 2))
os.close(fd)
fd = os.open("h", os.O_RDONLY)
chk("ftruncate rdonly", lambda: os.ftruncate(fd, 0))
chk("write rdonly", lambda: os.write(fd, b"x"))
os.close(fd)
fd = os.open("h", os.O_WRONLY | os.O_APPEND)
chk("pwrite O_APPEND", lambda: (os.pwrite(fd, b"Z", 0), os.fstat(fd).st_size))
os.close(fd)

# fallocate
FALLOC_FL_KEEP_SIZE, PUNCH, COLLAPSE, ZERO, INSERT = 1, 2, 8, 16, 32


def falloc(fd, mode, off, ln):
    if LIBC.fallocate(fd, mode, ctypes.c_long(off), ctypes.c_long(ln)) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return os.fstat(fd).st_size


wr("fa", bytes(range(256)) * 64)  # 16 KiB
fd = os.open("fa", os.O_RDWR)
chk("falloc keep size", lambda: falloc(fd, FALLOC_FL_KEEP_SIZE, 0, 1 << 20))
chk("falloc keep size blocks", lambda: os.fstat(fd).st_blocks >= 2048)
chk("falloc punch no keep", lambda: falloc(fd, PUNCH, 0, 4096))
chk("falloc punch", lambda: falloc(fd, PUNCH | FALLOC_FL_KEEP_SIZE, 0, 4096))
chk("after punch", lambda: os.pread(fd, 4, 4094))
chk("falloc punch unaligned", lambda: falloc(fd, PUNCH | FALLOC_FL_KEEP_SIZE, 100, 10))
chk("after punch2", lambda: os.pread(fd, 12, 4096 + 98) if False else os.pread(fd, 12, 98))
chk("falloc zero", lambda: falloc(fd, ZERO, 8000, 100))
chk("falloc zero extend", lambda: falloc(fd, ZERO, 16000, 1000))
chk("falloc bad mode", lambda: falloc(fd, PUNCH, 0, 4096))
chk("falloc zero len", lambda: falloc(fd, 0, 0, 0))
chk("falloc neg", lambda: falloc(fd, 0, -1, 10))
chk("content", lambda: hashlib.sha256(os.pread(fd, 1 << 20, 0)).hexdigest()[:16])
os.close(fd)
chk("posix_fallocate dir", lambda: os.posix_fallocate(os.open(".", os.O_RDONLY), 0, 10))

# copy_file_range
wr("cf1", b"hello world" * 1000)
a = os.open("cf1", os.O_RDONLY); b = os.open("cf2", os.O_CREAT | os.O_WRONLY, 0o644)
chk("copy_file_range", lambda: os.copy_file_range(a, b, 5000, 100, 200))
chk("copy result", lambda: (os.stat("cf2").st_size, rd("cf2")[200:210]))
chk("copy_file_range same file overlap", lambda: os.copy_file_range(a, a, 10, 0, 5))
os.close(a); os.close(b)
# FICLONE
a = os.open("cf1", os.O_RDONLY); b = os.open("cf3", os.O_CREAT | os.O_WRONLY, 0o644)
chk("FICLONE", lambda: fcntl.ioctl(b, 0x40049409, a))
os.close(a); os.close(b)

# times
wr("t")
chk("utime ns", lambda: (os.utime("t", ns=(1, 123456789)), os.stat("t").st_mtime_ns))
chk("utime neg", lambda: (os.utime("t", ns=(-5_000_000_000, -1)), os.stat("t").st_mtime_ns, os.stat("t").st_atime_ns))
chk("utime big", lambda: (os.utime("t", ns=(1 << 62, 1 << 62)), os.stat("t").st_mtime_ns))
before = os.stat("t")
time.sleep(0.02)
os.chmod("t", 0o600)
chk("chmod bumps ctime only", lambda: (os.stat("t").st_ctime_ns > before.st_ctime_ns, os.stat("t").st_mtime_ns == before.st_mtime_ns))
st = os.stat(".")
time.sleep(0.02)
wr("newfile")
chk("create bumps dir mtime", lambda: os.stat(".").st_mtime_ns > st.st_mtime_ns)
st = os.stat("t")
time.sleep(0.02)
os.link("t", "tl")
chk("link bumps ctime", lambda: os.stat("t").st_ctime_ns > st.st_ctime_ns)
st = os.stat("t")
time.sleep(0.02)
os.rename("tl", "tl2")
chk("rename bumps ctime", lambda: os.stat("t").st_ctime_ns > st.st_ctime_ns)
st = os.stat("t")
time.sleep(0.02)
fd = os.open("t", os.O_WRONLY); os.write(fd, b""); os.close(fd)
chk("empty write no mtime", lambda: os.stat("t").st_mtime_ns == st.st_mtime_ns)
time.sleep(0.02)
fd = os.open("t", os.O_WRONLY | os.O_TRUNC); os.close(fd)
chk("O_TRUNC bumps mtime", lambda: os.stat("t").st_mtime_ns > st.st_mtime_ns)
st = os.stat("t")
time.sleep(0.02)
os.truncate("t", 0)
chk("truncate same size bumps mtime", lambda: os.stat("t").st_mtime_ns > st.st_mtime_ns)
st = os.stat("t")
time.sleep(0.02)
os.setxattr("t", "user.a", b"1")
chk("setxattr bumps ctime", lambda: os.stat("t").st_ctime_ns > st.st_ctime_ns)
chk("statx btime", lambda: hasattr(os.stat("t"), "st_birthtime"))

# xattrs
chk("getxattr missing", lambda: os.getxattr("t", "user.none"))
chk("setxattr create exists", lambda: os.setxattr("t", "user.a", b"2", os.XATTR_CREATE))
chk("setxattr replace missing", lambda: os.setxattr("t", "user.b", b"2", os.XATTR_REPLACE))
chk("setxattr empty value", lambda: (os.setxattr("t", "user.e", b""), os.getxattr("t", "user.e")))
chk("setxattr name 255", lambda: os.setxattr("t", "user." + "a" * 250, b"1"))
chk("setxattr name 256", lambda: os.setxattr("t", "user." + "a" * 251, b"1"))
chk("setxattr big value 4000", lambda: os.setxattr("t", "user.big", b"v" * 4000))
chk("setxattr big value 65536", lambda: os.setxattr("t", "user.big2", b"v" * 65536))
chk("setxattr bad ns", lambda: os.setxattr("t", "foo.a", b"1"))
chk("setxattr trusted", lambda: os.setxattr("t", "trusted.a", b"1"))
chk("listxattr", lambda: sorted(x for x in os.listxattr("t") if len(x) < 20))
chk("removexattr missing", lambda: os.removexattr("t", "user.zz"))
chk("xattr on symlink user", lambda: os.setxattr("dang", "user.a", b"1", follow_symlinks=False))
os.mkfifo("fifo")
chk("xattr on fifo user", lambda: os.setxattr("fifo", "user.a", b"1"))
chk("getxattr ERANGE", lambda: LIBC.getxattr(b"t", b"user.big", ctypes.create_string_buffer(10), 10) or ctypes.get_errno())
chk("getxattr size query", lambda: LIBC.getxattr(b"t", b"user.big", None, 0))

# special files
chk("mknod char", lambda: (os.mknod("cdev", 0o600 | stat.S_IFCHR, os.makedev(1, 3)), os.major(os.stat("cdev").st_rdev), os.minor(os.stat("cdev").st_rdev)))
chk("mknod block", lambda: (os.mknod("bdev", 0o600 | stat.S_IFBLK, os.makedev(7, 0)), oct(os.stat("bdev").st_mode)))
chk("socket bind", lambda: (socket.socket(socket.AF_UNIX).bind("sock"), stat.S_ISSOCK(os.stat("sock").st_mode)))
chk("fifo mode", lambda: oct(os.stat("fifo").st_mode))
chk("truncate fifo", lambda: os.truncate("fifo", 0))

# O_TMPFILE
def tmpfile():
    fd = os.open(".", os.O_TMPFILE | os.O_RDWR, 0o600)
    os.write(fd, b"tmpdata")
    n = os.fstat(fd).st_nlink
    os.link(f"/proc/self/fd/{fd}", "from_tmp", follow_symlinks=True)
    os.close(fd)
    return n, rd("from_tmp"), os.stat("from_tmp").st_nlink
chk("O_TMPFILE", tmpfile)
def tmpfile_excl():
    fd = os.open(".", os.O_TMPFILE | os.O_RDWR | os.O_EXCL, 0o600)
    try:
        os.link(f"/proc/self/fd/{fd}", "from_tmp2", follow_symlinks=True)
    finally:
        os.close(fd)
chk("O_TMPFILE excl link", tmpfile_excl)

# permissions
os.mkdir("sticky"); os.chmod("sticky", 0o1777)
wr("sticky/rootfile")
chk("sticky unlink other", lambda: as_user(65534, 65534, lambda: os.unlink("sticky/rootfile")))
chk("sticky rename other", lambda: as_user(65534, 65534, lambda: os.rename("sticky/rootfile", "sticky/x")))
chk("user create in sticky", lambda: as_user(65534, 65534, lambda: wr("sticky/nobody")))
chk("user own unlink sticky", lambda: as_user(65534, 65534, lambda: os.unlink("sticky/nobody")))
os.mkdir("sgid"); os.chown("sgid", 0, 1234); os.chmod("sgid", 0o2775)
wr("sgid/f")
os.mkdir("sgid/sub")
chk("sgid inherit file gid", lambda: os.stat("sgid/f").st_gid)
chk("sgid inherit dir", lambda: (os.stat("sgid/sub").st_gid, oct(os.stat("sgid/sub").st_mode)))
wr("suid", b"#!/bin/sh\n", 0o6755)
os.chmod("suid", 0o6755)
os.chown("suid", 65534, 65534)
chk("chown clears suid", lambda: oct(os.stat("suid").st_mode))
os.chmod("suid", 0o6777)
chk("write by other clears suid", lambda: (as_user(1000, 1000, lambda: os.write(os.open("suid", os.O_WRONLY | os.O_APPEND), b"x")), oct(os.stat("suid").st_mode)))
os.chmod("suid", 0o6777)
chk("truncate by other clears suid", lambda: (as_user(1000, 1000, lambda: os.truncate("suid", 1)), oct(os.stat("suid").st_mode)))
os.chmod("suid", 0o2777)
os.chown("suid", 65534, 65534)
os.chmod("suid", 0o2767)
chk("sgid no group x write", lambda: (as_user(1000, 1000, lambda: os.write(os.open("suid", os.O_WRONLY | os.O_APPEND), b"x")), oct(os.stat("suid").st_mode)))
wr("priv", b"x", 0o600)
chk("other read 600", lambda: as_user(65534, 65534, lambda: rd("priv")))
chk("other chmod", lambda: as_user(65534, 65534, lambda: os.chmod("priv", 0o777)))
chk("other utime now", lambda: as_user(65534, 65534, lambda: os.utime("priv")))
os.chmod("priv", 0o666)
chk("other utime now writable", lambda: as_user(65534, 65534, lambda: os.utime("priv")))
chk("other utime explicit writable", lambda: as_user(65534, 65534, lambda: os.utime("priv", (1, 1))))
chk("root access X no x", lambda: os.access("priv", os.X_OK))
chk("root exec no x", lambda: os.execv if False else as_user(0, 0, lambda: os.access("priv", os.X_OK)))
os.mkdir("noexec_dir", 0o700)
wr("noexec_dir/f")
chk("search perm", lambda: as_user(65534, 65534, lambda: os.stat("noexec_dir/f")))
os.chmod("noexec_dir", 0o755)
chk("search perm after chmod", lambda: as_user(65534, 65534, lambda: os.stat("noexec_dir/f").st_size))
os.chmod("noexec_dir", 0o700)
chk("search perm after chmod back", lambda: as_user(65534, 65534, lambda: os.stat("noexec_dir/f")))
chk("other chown to self", lambda: as_user(65534, 65534, lambda: os.chown("priv", 65534, -1)))

# O_APPEND / O_TRUNC / RLIMIT_FSIZE
def fsize():
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (10000, 10000))
    fd = os.open("fs", os.O_CREAT | os.O_WRONLY, 0o644)
    n = os.pwrite(fd, b"a" * 20000, 0)
    try:
        os.pwrite(fd, b"a", 10000)
        r = "wrote past"
    except OSError as e:
        r = errno.errorcode[e.errno]
    try:
        os.ftruncate(fd, 20000)
        t = "trunc past"
    except OSError as e:
        t = errno.errorcode[e.errno]
    return n, r, t
chk("RLIMIT_FSIZE", lambda: as_user(0, 0, fsize))

# mmap
wr("mm", b"\0" * 8192)
fd = os.open("mm", os.O_RDWR)
m = mmap.mmap(fd, 8192)
m[100:105] = b"hello"
chk("mmap write visible", lambda: os.pread(fd, 5, 100))
os.pwrite(fd, b"WORLD", 200)
chk("pwrite visible in mmap", lambda: m[200:205])
os.ftruncate(fd, 4096)
m.close(); os.close(fd)

# locks
fd = os.open("lk", os.O_CREAT | os.O_RDWR, 0o644)
fcntl.lockf(fd, fcntl.LOCK_EX)
def trylock():
    f2 = os.open("lk", os.O_RDWR)
    fcntl.lockf(f2, fcntl.LOCK_EX | fcntl.LOCK_NB)
chk("posix lock conflict", lambda: as_user(0, 0, trylock))
fcntl.flock(fd, fcntl.LOCK_EX)
def tryflock():
    f2 = os.open("lk", os.O_RDWR)
    fcntl.flock(f2, fcntl.LOCK_EX | fcntl.LOCK_NB)
chk("flock conflict", lambda: as_user(0, 0, tryflock))
os.close(fd)

# readdir
os.mkdir("rd")
for i in range(300):
    wr(f"rd/{i:04d}", b"")
def readdir_while_unlinking():
    seen = []
    it = os.scandir("rd")
    for i, e in enumerate(it):
        seen.append(e.name)
        if i == 10:
            for j in range(150, 300):
                os.unlink(f"rd/{j:04d}")
    return len(set(seen)) == len(seen), len(seen) >= 150
chk("readdir unlink during", readdir_while_unlinking)
chk("readdir dots", lambda: sorted(x for x in os.listdir("rd") if x.startswith(".")))

# statfs
chk("statvfs namemax", lambda: os.statvfs(".").f_namemax)
chk("statvfs nonzero", lambda: os.statvfs(".").f_bsize > 0 and os.statvfs(".").f_blocks > 0)

# rename flags
def renameat2(a, b, flags):
    if LIBC.renameat2(-100, a.encode(), -100, b.encode(), flags) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
wr("ra"); wr("rb", b"bb")
chk("RENAME_WHITEOUT", lambda: renameat2("ra", "rc", 4))
chk("RENAME_EXCHANGE missing", lambda: renameat2("ra", "missing", 2))
chk("RENAME_NOREPLACE|EXCHANGE", lambda: renameat2("ra", "rb", 3))
chk("RENAME bad flag", lambda: renameat2("ra", "rb", 8))
chk("EXCHANGE file dir", lambda: (renameat2("rb", "D", 2), os.path.isdir("rb")))
chk("EXCHANGE dir into own sub", lambda: renameat2("rb", "rb/E", 2))

# open flags
chk("O_CREAT dir", lambda: opened("D", os.O_CREAT | os.O_RDONLY))
chk("O_TRUNC rdonly", lambda: (os.close(os.open("cf1", os.O_RDONLY | os.O_TRUNC)), os.stat("cf1").st_size))
chk("O_PATH fstat", lambda: os.fstat(os.open("cf1", os.O_PATH)).st_size)
chk("O_DIRECT", lambda: (lambda f: os.pwrite(f, mmap.mmap(-1, 4096), 0))(os.open("od", os.O_CREAT | os.O_RDWR | os.O_DIRECT, 0o644)))
chk("O_NOATIME other", lambda: as_user(65534, 65534, lambda: opened("cf1", os.O_RDONLY | os.O_NOATIME)))

# ioctl flags
FS_IOC_GETFLAGS, FS_IOC_SETFLAGS = 0x80086601, 0x40086602
def getflags(p):
    fd = os.open(p, os.O_RDONLY)
    buf = bytearray(8)
    fcntl.ioctl(fd, FS_IOC_GETFLAGS, buf)
    os.close(fd)
    return struct.unpack("q", buf)[0] & 0xff
def setflags(p, v):
    fd = os.open(p, os.O_RDONLY)
    fcntl.ioctl(fd, FS_IOC_SETFLAGS, struct.pack("q", v))
    os.close(fd)
wr("imm")
chk("getflags", lambda: getflags("imm"))
chk("set immutable", lambda: setflags("imm", 0x10))
chk("write immutable", lambda: opened("imm", os.O_WRONLY))
chk("unlink immutable", lambda: os.unlink("imm"))
chk("chmod immutable", lambda: os.chmod("imm", 0o600))
chk("link immutable", lambda: os.link("imm", "imm2"))
chk("setxattr immutable", lambda: os.setxattr("imm", "user.q", b"1"))
chk("utime immutable", lambda: os.utime("imm"))
chk("chown -1 -1 immutable", lambda: os.chown("imm", -1, -1))
chk("clear immutable", lambda: setflags("imm", 0))
chk("set append", lambda: setflags("imm", 0x20))
chk("open wr no append", lambda: opened("imm", os.O_WRONLY))
chk("open append", lambda: os.close(os.open("imm", os.O_WRONLY | os.O_APPEND)))
chk("truncate append only", lambda: os.truncate("imm", 0))
chk("chown -1 -1 append only", lambda: os.chown("imm", -1, -1))
chk("rename append-only", lambda: os.rename("imm", "imm3"))
chk("clear", lambda: setflags("imm3" if os.path.exists("imm3") else "imm", 0))
chk("set flags other", lambda: as_user(65534, 65534, lambda: setflags("cf1", 0x10)))

# dirs
chk("mkdir mode umask", lambda: (os.umask(0o022), os.mkdir("um", 0o777), oct(os.stat("um").st_mode))[2])
chk("rmdir cwd", lambda: (os.mkdir("cw"), os.chdir("cw"), os.rmdir("../cw"), os.listdir("."))[3] if True else None)
os.chdir(d)
chk("create in removed cwd", lambda: (os.mkdir("cw2"), os.chdir("cw2"), os.rmdir("../cw2"), wr("x"))[3])
os.chdir(d)
chk("getcwd deleted", lambda: (os.mkdir("cw3"), os.chdir("cw3"), os.rmdir("../cw3"), os.getcwd().endswith("(deleted)") or os.getcwd())[3])
os.chdir(d)
chk("unlink open file read", lambda: (wr("uo", b"data"), (lambda f: (os.unlink("uo"), os.pread(f, 4, 0), os.fstat(f).st_nlink))(os.open("uo", os.O_RDONLY)))[1])
chk("fchmod unlinked", lambda: (wr("uo2", b"data"), (lambda f: (os.unlink("uo2"), os.fchmod(f, 0o600), oct(os.fstat(f).st_mode)))(os.open("uo2", os.O_RDWR)))[1])
chk("ftruncate unlinked", lambda: (wr("uo3", b"data"), (lambda f: (os.unlink("uo3"), os.ftruncate(f, 100), os.fstat(f).st_size))(os.open("uo3", os.O_RDWR)))[1])
chk("fsetxattr unlinked", lambda: (wr("uo4", b"data"), (lambda f: (os.unlink("uo4"), os.setxattr(f, "user.x", b"1"), os.listxattr(f)))(os.open("uo4", os.O_RDWR)))[1])


# Second part, in a directory of its own.
d = os.path.join(root, "probe2")
shutil.rmtree(d, ignore_errors=True)
os.mkdir(d)
os.chdir(d)

# shrink then grow exposes zeros
def shrink_grow():
    wr("sg", b"a" * 10000)
    os.truncate("sg", 100)
    os.truncate("sg", 10000)
    b = open("sg", "rb").read()
    return b[:100] == b"a" * 100, b[100:] == b"\0" * 9900
chk("shrink grow zeros", shrink_grow)

def shrink_grow_mmap():
    wr("sgm", b"a" * 10000)
    fd = os.open("sgm", os.O_RDWR)
    os.ftruncate(fd, 100)
    os.ftruncate(fd, 10000)
    m = mmap.mmap(fd, 10000)
    r = m[100:10000] == b"\0" * 9900
    m.close(); os.close(fd)
    return r
chk("shrink grow mmap zeros", shrink_grow_mmap)

def sigbus():
    wr("sb", b"a" * 8192)
    pid = os.fork()
    if pid == 0:
        fd = os.open("sb", os.O_RDWR)
        m = mmap.mmap(fd, 8192)
        os.ftruncate(fd, 100)
        try:
            x = m[5000]
        except Exception:
            os._exit(3)
        os._exit(0)
    _, st = os.waitpid(pid, 0)
    return os.WIFSIGNALED(st) and os.WTERMSIG(st), os.WIFEXITED(st) and os.WEXITSTATUS(st)
chk("SIGBUS past EOF", sigbus)

def zeroed_partial(name, mode):
    """fallocate(mode) of bytes 1000..6000 of a 10,000-byte file: those read as zeros, no more."""
    wr(name, b"b" * 10000)
    fd = os.open(name, os.O_RDWR)
    LIBC.fallocate(fd, mode, ctypes.c_long(1000), ctypes.c_long(5000))
    b = os.pread(fd, 10000, 0)
    os.close(fd)
    return b[:1000] == b"b" * 1000, b[1000:6000] == b"\0" * 5000, b[6000:] == b"b" * 4000
chk("punch partial", lambda: zeroed_partial("pp", PUNCH | FALLOC_FL_KEEP_SIZE))
chk("zero range partial", lambda: zeroed_partial("zr", ZERO))

def append_procs():
    wr("ap", b"")
    pids = []
    for k in range(3):
        pid = os.fork()
        if pid == 0:
            fd = os.open("ap", os.O_WRONLY | os.O_APPEND)
            rec = bytes([65 + k]) * 99 + b"\n"
            for i in range(500):
                os.write(fd, rec)
            os._exit(0)
        pids.append(pid)
    for p in pids:
        os.waitpid(p, 0)
    b = open("ap", "rb").read()
    recs = [b[i:i + 100] for i in range(0, len(b), 100)]
    good = all(r[:99] == bytes([r[0]]) * 99 and r[99:] == b"\n" for r in recs)
    return len(b), good
chk("O_APPEND 3 procs", append_procs)

def big_dir():
    os.mkdir("bd")
    n = 5000
    for i in range(n):
        open(f"bd/file-{i:05d}-{'x' * (i % 50)}", "w").close()
    names = os.listdir("bd")
    ok1 = len(names) == n and len(set(names)) == n
    # delete every other during iteration
    seen = []
    with os.scandir("bd") as it:
        for j, e in enumerate(it):
            seen.append(e.name)
            if j == 100:
                for k in range(0, n, 2):
                    try:
                        os.unlink(f"bd/file-{k:05d}-{'x' * (k % 50)}")
                    except FileNotFoundError:
                        pass
    ok2 = len(set(seen)) == len(seen)
    rest = os.listdir("bd")
    return ok1, ok2, len(rest)
chk("big dir", big_dir)

def telldir_seekdir():
    libc = LIBC
    libc.opendir.restype = ctypes.c_void_p
    libc.readdir.restype = ctypes.c_void_p
    libc.telldir.restype = ctypes.c_long
    dp = libc.opendir(b"bd")
    names = []
    pos = None
    for i in range(50):
        if i == 20:
            pos = libc.telldir(ctypes.c_void_p(dp))
        ent = libc.readdir(ctypes.c_void_p(dp))
        if not ent:
            break
        names.append(ctypes.string_at(ent + 19))
    libc.seekdir(ctypes.c_void_p(dp), ctypes.c_long(pos))
    ent = libc.readdir(ctypes.c_void_p(dp))
    again = ctypes.string_at(ent + 19)
    libc.closedir(ctypes.c_void_p(dp))
    return again == names[20]
chk("telldir seekdir", telldir_seekdir)

def dotdot_after_move():
    os.makedirs("mv/a/b")
    os.mkdir("mv/c")
    os.rename("mv/a/b", "mv/c/b")
    return os.stat("mv/c/b/..").st_ino == os.stat("mv/c").st_ino, os.stat("mv/a").st_nlink, os.stat("mv/c").st_nlink
chk("dotdot after move", dotdot_after_move)

def chown_noop():
    wr("co")
    st = os.stat("co")
    time.sleep(0.02)
    os.chown("co", -1, -1)
    st2 = os.stat("co")
    return st2.st_ctime_ns == st.st_ctime_ns

def chown_noop():
    wr("co")
    st = os.stat("co")
    time.sleep(0.02)
    os.chown("co", -1, -1)
    return os.stat("co").st_ctime_ns > st.st_ctime_ns
chk("chown -1 -1 changes ctime", chown_noop)

def chown_noop_set_id():
    res = []
    for mode, owner, group in ((0o6755, 0, 0), (0o6745, 1000, 1000), (0o6745, 1000, 0)):
        wr("cs")
        os.chown("cs", owner, group)
        os.chmod("cs", mode)
        res.append(as_user(1000, 1000, lambda: os.chown("cs", -1, -1)) if owner else os.chown("cs", -1, -1))
        res.append(oct(os.stat("cs").st_mode))
    return res
chk("chown -1 -1 drops set-ID bits", chown_noop_set_id)

def chown_same():
    wr("co2")
    st = os.stat("co2")
    time.sleep(0.02)
    os.chown("co2", 0, 0)
    return os.stat("co2").st_ctime_ns > st.st_ctime_ns
chk("chown same ctime", chown_same)

def fsync_dir():
    fd = os.open(".", os.O_RDONLY)
    os.fsync(fd)
    os.fdatasync(fd)
    os.close(fd)
    return True
chk("fsync dir", fsync_dir)

def sendfile_splice():
    wr("sf", b"0123456789" * 1000)
    a = os.open("sf", os.O_RDONLY)
    b = os.open("sf2", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    n = os.sendfile(b, a, 5, 9000)
    os.close(a); os.close(b)
    return n, open("sf2", "rb").read() == (b"0123456789" * 1000)[5:9005]
chk("sendfile", sendfile_splice)

def cfr_past_eof():
    wr("cp1", b"abc")
    a = os.open("cp1", os.O_RDONLY); b = os.open("cp2", os.O_CREAT | os.O_WRONLY, 0o644)
    n = os.copy_file_range(a, b, 100, 10, 0)
    return n
chk("copy_file_range past eof", cfr_past_eof)

def odirect_rw():
    fd = os.open("od", os.O_CREAT | os.O_RDWR | os.O_DIRECT, 0o644)
    m = mmap.mmap(-1, 8192)
    m[:] = b"z" * 8192
    os.pwrite(fd, m, 4096)
    m2 = mmap.mmap(-1, 8192)
    n = os.preadv(fd, [m2], 4096)
    os.close(fd)
    return n, m2[:] == b"z" * 8192, os.stat("od").st_size
chk("O_DIRECT rw", odirect_rw)

def write_read_large():
    data = os.urandom(3 * 1024 * 1024 + 17)
    wr("lg", data)
    return hashlib.md5(open("lg", "rb").read()).hexdigest() == hashlib.md5(data).hexdigest()
chk("large write read", write_read_large)

def overwrite_middle():
    data = bytearray(os.urandom(5 * 1024 * 1024))
    wr("om", bytes(data))
    fd = os.open("om", os.O_RDWR)
    for off in (0, 4095, 2 * 1024 * 1024 - 3, 4 * 1024 * 1024 + 1):
        patch = os.urandom(10000)
        os.pwrite(fd, patch, off)
        data[off:off + len(patch)] = patch
    os.close(fd)
    return open("om", "rb").read() == bytes(data)
chk("overwrite middle", overwrite_middle)

def rename_open_dir_cwd():
    os.makedirs("rc/x")
    os.chdir("rc/x")
    os.rename("../x", "../y")
    p = os.getcwd()
    os.chdir(d)
    return p.endswith("/rc/y")
chk("getcwd after rename", rename_open_dir_cwd)

def statfs_after_write():
    s1 = os.statvfs(".")
    wr("sfw", b"q" * (8 * 1024 * 1024))
    os.sync()
    s2 = os.statvfs(".")
    used = (s1.f_bfree - s2.f_bfree) * s1.f_frsize
    return 8 * 1024 * 1024 <= used <= 10 * 1024 * 1024
chk("statfs accounts write", statfs_after_write)

def st_blocks():
    wr("bl", b"q" * 10000)
    os.sync()
    return os.stat("bl").st_blocks
chk("st_blocks 10000", st_blocks)

def dir_size():
    return os.stat("bd").st_size > 0, stat.S_ISDIR(os.stat("bd").st_mode)
chk("dir size", dir_size)

def link_count_file_after_links():
    wr("lc")
    os.link("lc", "lc2"); os.link("lc", "lc3")
    os.unlink("lc2")
    return os.stat("lc").st_nlink
chk("link count", link_count_file_after_links)

def utimes_symlink_nofollow():
    os.symlink("nonexistent", "sl")
    os.utime("sl", ns=(5, 7), follow_symlinks=False)
    return os.lstat("sl").st_mtime_ns
chk("utime symlink nofollow", utimes_symlink_nofollow)

def chmod_sgid_nonmember():
    wr("sg2")
    os.chown("sg2", 65534, 4242)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.setgroups([]); os.setresgid(65534, 65534, 65534); os.setresuid(65534, 65534, 65534)
        os.chmod("sg2", 0o2755)
        os._exit(0)
    os.waitpid(pid, 0)
    return oct(os.stat("sg2").st_mode)
chk("chmod g+s by non-member owner clears sgid", chmod_sgid_nonmember)


# Third part: permissions of directory changes, set-group-ID directories, limits, links of
# symlinks, utimensat with UTIME_OMIT, renames and link counts, FIFOs.
d = os.path.join(root, "probe3")
shutil.rmtree(d, ignore_errors=True)
os.mkdir(d)
os.chmod(d, 0o777)
os.chdir(d)

os.mkdir("ro", 0o755)
wr("ro/f")
chk("create in dir without w", lambda: as_user(1000, 1000, lambda: wr("ro/g")))
chk("unlink in dir without w", lambda: as_user(1000, 1000, lambda: os.unlink("ro/f")))
chk("rename out of dir without w", lambda: as_user(1000, 1000, lambda: os.rename("ro/f", "x")))
chk("mkdir in dir without w", lambda: as_user(1000, 1000, lambda: os.mkdir("ro/d")))
chk("symlink in dir without w", lambda: as_user(1000, 1000, lambda: os.symlink("a", "ro/s")))
chk("link into dir without w", lambda: as_user(1000, 1000, lambda: os.link("ro/f", "ro/f2")))
os.mkdir("mine", 0o755)
os.chown("mine", 1000, 1000)
os.mkdir("mine/sub", 0o755)
chk("rename dir by other: needs w on dir itself for ..", lambda: as_user(1000, 1000, lambda: os.rename("mine/sub", "mine/sub2")))
os.mkdir("rootsub", 0o755)
os.rename("rootsub", "mine/rootsub")
chk("move root's dir between user's dirs", lambda: as_user(1000, 1000, lambda: os.rename("mine/rootsub", "mine/sub2/rootsub")))
chk("rename root's dir in place", lambda: as_user(1000, 1000, lambda: os.rename("mine/rootsub", "mine/rs2")))
chk("mknod char as user", lambda: as_user(1000, 1000, lambda: os.mknod("mine/c", 0o600 | stat.S_IFCHR, os.makedev(1, 3))))
chk("mknod fifo as user", lambda: as_user(1000, 1000, lambda: os.mknod("mine/p", 0o600 | stat.S_IFIFO)))
wr("xf")
chk("trusted xattr as user", lambda: as_user(1000, 1000, lambda: os.setxattr("mine", "trusted.a", b"1")))
chk("security xattr as user on own", lambda: as_user(1000, 1000, lambda: os.setxattr("mine", "security.a", b"1")))
chk("user xattr on other's file", lambda: as_user(1000, 1000, lambda: os.setxattr("xf", "user.a", b"1")))
os.chmod("xf", 0o666)
chk("user xattr on other's writable file", lambda: as_user(1000, 1000, lambda: os.setxattr("xf", "user.a", b"1")))
chk("readlink non-symlink", lambda: os.readlink("xf"))
chk("truncate dir", lambda: os.truncate("mine", 0))
chk("write dir fd", lambda: os.write(os.open("mine", os.O_RDONLY), b"x"))
chk("read dir fd", lambda: os.read(os.open("mine", os.O_RDONLY), 10))
os.symlink("xf", "sl")
chk("link of symlink (no follow)", lambda: (LIBC.linkat(-100, b"sl", -100, b"sl2", 0), stat.S_ISLNK(os.lstat("sl2").st_mode)))
chk("link of symlink follow", lambda: (LIBC.linkat(-100, b"sl", -100, b"sl3", 0x400), stat.S_ISREG(os.lstat("sl3").st_mode)))
chk("nlink after links", lambda: (os.stat("xf").st_nlink, os.lstat("sl").st_nlink))
def utime_omit():
    wr("uo")
    os.utime("uo", ns=(10, 20))
    class TS(ctypes.Structure):
        _fields_ = [("s", ctypes.c_long), ("ns", ctypes.c_long)]
    ts = (TS * 2)(TS(0, (1 << 30) - 2), TS(5, 6))  # UTIME_OMIT for atime
    r = LIBC.utimensat(-100, b"uo", ts, 0)
    st = os.stat("uo")
    return r, st.st_atime_ns, st.st_mtime_ns
chk("utimensat omit atime", utime_omit)
def utime_now_other_owner_writable():
    wr("un")
    os.chmod("un", 0o666)
    os.utime("un", ns=(10, 20))
    r = as_user(1000, 1000, lambda: os.utime("un"))
    return r, os.stat("un").st_mtime_ns > 20
chk("utime now by non-owner with w", utime_now_other_owner_writable)
chk("access W_OK root on 444", lambda: (wr("r4"), os.chmod("r4", 0o444), os.access("r4", os.W_OK))[2])
chk("access X_OK root on 644", lambda: os.access("r4", os.X_OK))
chk("access user R_OK 600 root file", lambda: (os.chmod("r4", 0o600), as_user(1000, 1000, lambda: os.access("r4", os.R_OK)))[1])
os.mkdir("sg", 0o2775)
os.chown("sg", 0, 4242)
os.chmod("sg", 0o2777)
chk("mkdir in sgid dir by other", lambda: (as_user(1000, 1000, lambda: os.mkdir("sg/u")), oct(os.stat("sg/u").st_mode), os.stat("sg/u").st_gid))
chk("create in sgid dir by other", lambda: (as_user(1000, 1000, lambda: wr("sg/f")), oct(os.stat("sg/f").st_mode), os.stat("sg/f").st_gid))
chk("chmod g+s by owner non-member", lambda: (as_user(1000, 1000, lambda: os.chmod("sg/f", 0o2755)), oct(os.stat("sg/f").st_mode)))
chk("file create mode with sgid dir and mode 2755", lambda: (as_user(1000, 1000, lambda: wr("sg/f2", b"", 0o2755)), oct(os.stat("sg/f2").st_mode)))
def big_offset():
    fd = os.open("bo", os.O_CREAT | os.O_RDWR, 0o644)
    res = []
    for off in ((1 << 44) - 1, 1 << 44, (1 << 48), (1 << 62)):
        try:
            os.pwrite(fd, b"z", off)
            res.append("ok")
        except OSError as e:
            res.append(errno.errorcode[e.errno])
    os.close(fd)
    return res
chk("writes at large offsets", big_offset)
chk("truncate to 1 TiB", lambda: (os.truncate("bo", 1 << 40), os.stat("bo").st_size)[1])
def rename_dir_nlinks():
    os.makedirs("na/x")
    os.mkdir("nb")
    os.rename("na/x", "nb/x")
    return os.stat("na").st_nlink, os.stat("nb").st_nlink
chk("rename dir nlinks", rename_dir_nlinks)
def exchange_dirs_nlinks():
    os.makedirs("ea/x")
    os.makedirs("eb")
    wr("eb/y")
    if LIBC.renameat2(-100, b"ea/x", -100, b"eb/y", 2) != 0:
        raise OSError(ctypes.get_errno(), "")
    return os.stat("ea").st_nlink, os.stat("eb").st_nlink, stat.S_ISDIR(os.stat("eb/y").st_mode)
chk("exchange dir and file nlinks", exchange_dirs_nlinks)
def dir_mtime_on_rename_within():
    os.mkdir("rm1")
    wr("rm1/a")
    st = os.stat("rm1")
    time.sleep(0.02)
    os.rename("rm1/a", "rm1/b")
    st2 = os.stat("rm1")
    return st2.st_mtime_ns > st.st_mtime_ns, st2.st_ctime_ns > st.st_ctime_ns
chk("rename within dir bumps dir times", dir_mtime_on_rename_within)
def moved_dir_ctime():
    os.makedirs("mc/a")
    st = os.stat("mc/a")
    time.sleep(0.02)
    os.rename("mc/a", "mc/b")
    return os.stat("mc/b").st_ctime_ns > st.st_ctime_ns
chk("renamed dir ctime", moved_dir_ctime)
def xattr_list_size():
    wr("xl")
    for i in range(30):
        os.setxattr("xl", f"user.attr{i:03d}", b"v" * 50)
    n = LIBC.listxattr(b"xl", None, 0)
    return n, len(os.listxattr("xl"))
chk("listxattr size", xattr_list_size)
def fifo_rw():
    os.mkfifo("ff")
    pid = os.fork()
    if pid == 0:
        fd = os.open("ff", os.O_WRONLY)
        os.write(fd, b"hello")
        os._exit(0)
    fd = os.open("ff", os.O_RDONLY)
    data = os.read(fd, 10)
    os.waitpid(pid, 0)
    return data
chk("fifo read write", fifo_rw)
for line in out:
    print(line)
