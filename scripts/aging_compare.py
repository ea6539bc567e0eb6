#!/usr/bin/env python3
"""Age winefs, ext4 and xfs the same way and measure them side by side (issue: aging).

For each file system: age it with `winefs age` (winefs through the library; ext4 and xfs,
made on image files in a hugepage-free tmpfs and mounted with loop devices, through POSIX
calls), then measure
  * free space: the share of it in free 2 MiB-aligned extents (winefs frag, e2freefrag -c 2048,
    xfs_db freesp -d);
  * a fresh large file allocated the way an application would (fallocate; sequential 4 KiB
    writes; for winefs also ftruncate + a store to every page of a mapping): the share of its
    bytes in 2 MiB-aligned, 2 MiB-contiguous physical ranges (FIEMAP through filefrag on ext4
    and xfs, winefs filemap rules on winefs);
  * the mmap benchmark over that file, clean and aged, in one run: winefs's own files, and the
    ext4/xfs layouts replayed onto a hugepage tmpfs at their physical offsets
    (`winefs bench layout`).
Optionally (--sweep) the free aligned share at 50..90% utilization (Figure 3), and plots of
both figures (matplotlib). Everything lands in --out: results.json, tables.md, fig1.png, fig3.png.

Run as root on Debian (apt-get install xfsprogs e2fsprogs python3-matplotlib):
    python3 scripts/aging_compare.py --size 8G --util 75 --writes 10 --sweep
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time

MIB = 1 << 20
HUGE = 2 * MIB
IMG_DIR = "/mnt/winefs-age-img"
POSIX = ["ext4", "xfs", "xfs-su2m"]
# Every file system compared, in table order; winefs-nocompact is winefs aged with background
# work off (the allocator alone), measured but left out of the mmap run (memory).
KINDS = ["winefs", "winefs-nocompact"] + POSIX
BENCHED = ["winefs"] + POSIX
HUGE_DIR = "/mnt/winefs-huge"


def sh(cmd, check=True, capture=True):
    r = subprocess.run(cmd, shell=isinstance(cmd, str), text=True,
                       stdout=subprocess.PIPE if capture else None,
                       stderr=subprocess.PIPE if capture else None)
    if check and r.returncode != 0:
        sys.exit(f"failed: {cmd}\n{r.stdout or ''}{r.stderr or ''}")
    return r.stdout or ""


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def parse_size(s):
    m = re.fullmatch(r"(\d+)([KMGT]?)", s.strip().upper())
    if not m:
        sys.exit(f"bad size {s}")
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30, "T": 40}[m.group(2)]


def mounted(path):
    return any(l.split()[1] == path for l in open("/proc/mounts"))


def ensure_tmpfs(path, size, huge):
    os.makedirs(path, exist_ok=True)
    opts = f"size={size}" + (",huge=always" if huge else ",huge=never")
    if mounted(path):
        sh(["mount", "-o", f"remount,{opts}", path])
    else:
        sh(["mount", "-t", "tmpfs", "-o", opts, "none", path])


# ---------- layouts ----------

def filefrag_layout(path):
    """(file offset, physical offset, length) in bytes, from FIEMAP via filefrag -v."""
    out = sh(["filefrag", "-v", path])
    bs = int(re.search(r"blocks of (\d+) bytes", out).group(1))
    ext = []
    for l in out.splitlines():
        m = re.match(r"\s*\d+:\s+(\d+)\.\.\s*(\d+):\s+(\d+)\.\.\s*(\d+):\s+(\d+):", l)
        if m:
            lo, _, po, _, n = map(int, m.groups())
            ext.append((lo * bs, po * bs, n * bs))
    return ext


def mappable_share(ext, size):
    """Share of [0, size) in 2 MiB units backed by one extent at a 2 MiB-aligned address."""
    ok = 0
    for l, p, n in ext:
        u = -(-l // HUGE) * HUGE
        while u + HUGE <= l + n and u + HUGE <= size:
            if (p + (u - l)) % HUGE == 0:
                ok += HUGE
            u += HUGE
    return ok / size if size else 0.0


def write_layout(ext, path):
    with open(path, "w") as f:
        f.write("# file_offset physical_offset length (bytes)\n")
        for e in ext:
            f.write(f"{e[0]} {e[1]} {e[2]}\n")


# ---------- free space ----------

def aligned_chunks(extents_bytes):
    n = 0
    for s, l in extents_bytes:
        first = -(-s // HUGE)
        last = (s + l) // HUGE
        n += max(0, last - first)
    return n


def free_ext4(dev):
    out = sh(["e2freefrag", "-c", "2048", dev])
    bs = int(re.search(r"Blocksize: (\d+)", out).group(1))
    free = int(re.search(r"Free blocks: (\d+)", out).group(1)) * bs
    chunks = int(re.search(r"Free chunks: (\d+)", out).group(1))
    return {"free_bytes": free, "aligned_extents": chunks,
            "aligned_share": chunks * HUGE / free if free else 0.0}


def free_xfs(dev):
    geo = sh(["xfs_db", "-r", "-c", "sb 0", "-c", "p agblocks blocksize", dev])
    agblocks = int(re.search(r"agblocks = (\d+)", geo).group(1))
    bs = int(re.search(r"blocksize = (\d+)", geo).group(1))
    out = sh(["xfs_db", "-r", "-c", "freesp -d", dev])
    ext = []
    for l in out.splitlines():
        m = re.fullmatch(r"\s*(\d+)\s+(\d+)\s+(\d+)\s*", l)
        if m:
            ag, agbno, n = map(int, m.groups())
            ext.append(((ag * agblocks + agbno) * bs, n * bs))
    free = sum(e[1] for e in ext)
    chunks = aligned_chunks(ext)
    return {"free_bytes": free, "aligned_extents": chunks,
            "aligned_share": chunks * HUGE / free if free else 0.0}


def free_winefs(winefs, pool):
    out = sh([winefs, "frag", pool])
    m = re.search(r"total: free ([\d.]+) (B|KiB|MiB|GiB|TiB), aligned 2 MiB extents (\d+) "
                  r"\(([\d.]+)% of free space\)", out)
    if not m:
        sys.exit(f"cannot read winefs frag output:\n{out}")
    unit = {"B": 0, "KiB": 10, "MiB": 20, "GiB": 30, "TiB": 40}[m.group(2)]
    return {"free_bytes": int(float(m.group(1)) * (1 << unit)), "aligned_extents": int(m.group(3)),
            "aligned_share": float(m.group(4)) / 100.0}


# ---------- one POSIX file system ----------

class LoopFs:
    def __init__(self, kind, size, tag):
        self.kind, self.size = kind, size
        self.img = f"{IMG_DIR}/{kind}-{tag}.img"
        self.mnt = f"/mnt/winefs-age-{kind}-{tag}"
        self.dev = None

    def make(self):
        if os.path.exists(self.img):
            os.remove(self.img)
        sh(["truncate", "-s", str(self.size), self.img])
        if self.kind == "ext4":
            sh(["mkfs.ext4", "-q", "-F", self.img])
        elif self.kind == "xfs-su2m":
            # What xfs's DAX documentation recommends for 2 MiB faults: a 2 MiB stripe unit.
            sh(["mkfs.xfs", "-q", "-f", "-d", "su=2m,sw=1", self.img])
        else:
            sh(["mkfs.xfs", "-q", "-f", self.img])
        self.dev = sh(["losetup", "-f", "--show", self.img]).strip()
        os.makedirs(self.mnt, exist_ok=True)
        self.mount()

    def mount(self):
        sh(["mount", self.dev, self.mnt])

    def umount(self):
        sh(["umount", self.mnt])

    def free(self):
        self.umount()  # the tools read the device: let every change reach it
        r = free_ext4(self.dev) if self.kind == "ext4" else free_xfs(self.dev)
        self.mount()
        return r

    def destroy(self):
        if mounted(self.mnt):
            self.umount()
        if self.dev:
            sh(["losetup", "-d", self.dev])
        if os.path.exists(self.img):
            os.remove(self.img)

    def fresh(self, size, how, keep_layout=None):
        path = f"{self.mnt}/fresh-{how}"
        if how == "fallocate":
            sh(["fallocate", "-l", str(size), path])
        else:
            sh(["dd", "if=/dev/zero", f"of={path}", "bs=4k", f"count={size // 4096}", "status=none"])
        sh(["sync"])
        ext = filefrag_layout(path)
        if keep_layout:
            write_layout(ext, keep_layout)
        os.remove(path)
        sh(["sync"])
        return {"extents": len(ext), "mappable_share": mappable_share(ext, size)}


def age_args(a, util, writes):
    return ["--profile", a.profile, "--seed", str(a.seed), "--util", str(util),
            "--writes", str(writes), "-q"]


def run_posix(a, kind, out):
    log(f"{kind}: mkfs on a {a.size >> 30} GiB image in {IMG_DIR}")
    fs = LoopFs(kind, a.size, "main")
    fs.make()
    try:
        res = {}
        res["clean_fresh"] = fs.fresh(a.fresh, "fallocate", f"{out}/{kind}-clean.layout")
        log(f"{kind}: clean fresh file {res['clean_fresh']}")
        t = time.time()
        state = f"{out}/{kind}.age-state"
        if os.path.exists(state):
            os.remove(state)
        sh([a.winefs, "age", "--dir", fs.mnt, "--state", state, "--json", f"{out}/{kind}-age.json"]
           + age_args(a, a.util, a.writes))
        res["age"] = json.load(open(f"{out}/{kind}-age.json"))
        log(f"{kind}: aged in {time.time() - t:.0f} s: util {res['age']['utilization']:.3f}, "
            f"writes {res['age']['writes_x_capacity']:.1f}x")
        res["free"] = fs.free()
        log(f"{kind}: free space {res['free']}")
        res["fresh_fallocate"] = fs.fresh(a.fresh, "fallocate", f"{out}/{kind}-aged.layout")
        res["fresh_write4k"] = fs.fresh(a.fresh, "write4k")
        log(f"{kind}: fresh file fallocate {res['fresh_fallocate']}, 4 KiB writes {res['fresh_write4k']}")
        return res
    finally:
        fs.destroy()


def run_winefs(a, out, name="winefs", background=True):
    clean = f"{HUGE_DIR}/aging-{name}-clean.pool"
    aged = f"{HUGE_DIR}/aging-{name}-aged.pool"
    for p in (clean, aged):
        if os.path.exists(p):
            os.remove(p)
    res = {}
    sh([a.winefs, "mkfs", clean, "--size", str(a.size)])
    res["clean_fresh"] = fresh_winefs(a, clean, "fallocate", keep=True)
    log(f"{name}: clean fresh file {res['clean_fresh']}")
    t = time.time()
    state = f"{out}/{name}.age-state"
    if os.path.exists(state):
        os.remove(state)
    sh([a.winefs, "age", aged, "--size", str(a.size), "--state", state, "--json",
        f"{out}/{name}-age.json"] + age_args(a, a.util, a.writes)
       + ([] if background else ["--no-background"]))
    res["age"] = json.load(open(f"{out}/{name}-age.json"))
    log(f"{name}: aged in {time.time() - t:.0f} s: util {res['age']['utilization']:.3f}, "
        f"writes {res['age']['writes_x_capacity']:.1f}x")
    res["free"] = free_winefs(a.winefs, aged)
    log(f"{name}: free space {res['free']}")
    res["fresh_write4k"] = fresh_winefs(a, aged, "write4k", keep=False)
    res["fresh_touch"] = fresh_winefs(a, aged, "touch", keep=False)
    res["fresh_fallocate"] = fresh_winefs(a, aged, "fallocate", keep=True)
    log(f"{name}: fresh file fallocate {res['fresh_fallocate']}, 4 KiB writes "
        f"{res['fresh_write4k']}, ftruncate+touch {res['fresh_touch']}")
    return res, clean, aged


def fresh_winefs(a, pool, how, keep):
    path = "/fresh" if keep else f"/fresh-{how}"
    cmd = [a.winefs, "fresh", pool, path, "--size", str(a.fresh), "--how",
           {"fallocate": "fallocate", "write4k": "write4k", "touch": "touch"}[how]]
    if not keep:
        cmd.append("--remove")
    out = sh(cmd)
    m = re.search(r"in (\d+) extents; hugepage-mappable ([\d.]+)%", out)
    return {"extents": int(m.group(1)), "mappable_share": float(m.group(2)) / 100.0}


# ---------- Figure 3 sweep ----------

def sweep(a, out):
    utils = [50, 60, 70, 80, 90]
    res = {"utils": utils, "size": a.sweep_size, "writes_per_step": a.sweep_writes}
    for kind in KINDS:
        shares = []
        state = f"{out}/sweep-{kind}.age-state"
        if os.path.exists(state):
            os.remove(state)
        winefs = kind.startswith("winefs")
        if winefs:
            pool = f"{HUGE_DIR}/aging-sweep.pool"
            if os.path.exists(pool):
                os.remove(pool)
            sh([a.winefs, "mkfs", pool, "--size", str(a.sweep_size)])
        else:
            fs = LoopFs(kind, a.sweep_size, "sweep")
            fs.make()
        try:
            for i, u in enumerate(utils):
                writes = a.sweep_writes * (i + 1)  # cumulative: each step churns sweep_writes more
                target = [pool] if winefs else ["--dir", fs.mnt]
                if kind == "winefs-nocompact":
                    target.append("--no-background")
                sh([a.winefs, "age"] + target + ["--state", state] + age_args(a, u, writes))
                free = free_winefs(a.winefs, pool) if winefs else fs.free()
                shares.append(free["aligned_share"])
                log(f"sweep {kind} {u}%: aligned share of free space {free['aligned_share']:.3f}")
        finally:
            if winefs:
                os.remove(pool)
            else:
                fs.destroy()
        res[kind] = shares
    return res


# ---------- output ----------

def tables(R):
    a = R["args"]
    s = []
    s.append(f"Aged with profile {a['profile']} to {a['util']}% utilization, {a['writes']}x capacity "
             f"of writes, {a['size'] >> 30} GiB each, seed {a['seed']}; fresh file "
             f"{a['fresh'] >> 20} MiB ({a['fresh'] // HUGE} 2 MiB extents).\n")
    s.append("| file system | utilization | writes (x capacity) | aging time s | free space | free in aligned 2 MiB extents | fresh file: fallocate mappable | 4 KiB writes mappable | ftruncate + touch mappable |")
    s.append("|---|--:|--:|--:|--:|--:|--:|--:|--:|")
    for k in KINDS:
        r = R[k]
        touch = r.get("fresh_touch")
        s.append(f"| {k} | {100 * r['age']['utilization']:.1f}% | {r['age']['writes_x_capacity']:.1f} | "
                 f"{r['age']['seconds']:.0f} | {r['free']['free_bytes'] / (1 << 30):.2f} GiB | "
                 f"{100 * r['free']['aligned_share']:.1f}% ({r['free']['aligned_extents']}) | "
                 f"{100 * r['fresh_fallocate']['mappable_share']:.1f}% ({r['fresh_fallocate']['extents']} ext) | "
                 f"{100 * r['fresh_write4k']['mappable_share']:.1f}% | "
                 + (f"{100 * touch['mappable_share']:.1f}% |" if touch else "n/a |"))
    s.append("")
    s.append("mmap benchmark over the fresh (fallocated) file, clean and aged, one run "
             "(ext4 and xfs: their layouts replayed on a hugepage tmpfs):\n")
    s.append("| case | extents | seq write GB/s | rand 4K write GB/s | seq read GB/s | 8 B read ns | first-touch faults | PMD-mapped |")
    s.append("|---|--:|--:|--:|--:|--:|--:|--:|")
    for c in R["bench"]:
        s.append(f"| {c['name']} | {c['extents']} | {c['seq_write']:.2f} | {c['rand_write_cold']:.2f} | "
                 f"{c['seq_read']:.2f} | {c['read8_ns']:.1f} | {c['faults']} | {100 * c['pmd_share']:.0f}% |")
    s.append("")
    by = {c["name"]: c for c in R["bench"]}
    for k in BENCHED:
        c, g = by[f"{k}-clean"], by[f"{k}-aged"]
        s.append(f"- {k}: aged/clean seq write {g['seq_write'] / c['seq_write']:.2f}, "
                 f"random 4K write {g['rand_write_cold'] / c['rand_write_cold']:.2f}")
    w = R["winefs"]
    wb = by["winefs-aged"]["seq_write"] / by["winefs-clean"]["seq_write"]
    checks = [
        ("winefs free space in aligned 2 MiB extents >= 90%", w["free"]["aligned_share"] >= 0.9),
        ("winefs fresh file hugepage-mappable >= 95%", w["fresh_fallocate"]["mappable_share"] >= 0.95),
        ("winefs aged mmap seq write within 10% of clean", wb >= 0.9),
    ]
    s.append("")
    for name, ok in checks:
        s.append(f"- {name}: {'met' if ok else 'MISSED'}")
    if "sweep" in R:
        sw = R["sweep"]
        s.append("")
        s.append(f"Free space in aligned 2 MiB extents by utilization ({sw['size'] / (1 << 30):g} GiB, "
                 f"{sw['writes_per_step']}x capacity of writes per step, cumulative):\n")
        s.append("| utilization | " + " | ".join(f"{u}%" for u in sw["utils"]) + " |")
        s.append("|---|" + "--:|" * len(sw["utils"]))
        for k in KINDS:
            s.append(f"| {k} | " + " | ".join(f"{100 * x:.1f}%" for x in sw[k]) + " |")
    return "\n".join(s) + "\n"


def plots(R, out):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib missing (apt-get install python3-matplotlib): no plots")
        return
    by = {c["name"]: c for c in R["bench"]}
    kinds = BENCHED
    fig, ax = plt.subplots(figsize=(7, 3.8))
    xs = range(len(kinds))
    ax.bar([x - 0.2 for x in xs], [by[f"{k}-clean"]["seq_write"] for k in kinds], 0.4, label="clean")
    ax.bar([x + 0.2 for x in xs], [by[f"{k}-aged"]["seq_write"] for k in kinds], 0.4, label="aged")
    ax.set_xticks(list(xs), kinds)
    ax.set_ylabel("mmap sequential write, GB/s")
    a = R["args"]
    ax.set_title(f"Figure 1: mmap writes, clean vs aged ({a['profile']}, {a['util']}%)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(f"{out}/fig1.png", dpi=120)
    if "sweep" in R:
        sw = R["sweep"]
        fig, ax = plt.subplots(figsize=(7, 3.8))
        for k, m in zip(KINDS, "oxs^v"):
            ax.plot(sw["utils"], [100 * x for x in sw[k]], marker=m, label=k)
        ax.set_xlabel("utilization, %")
        ax.set_ylabel("free space in aligned 2 MiB extents, %")
        ax.set_ylim(0, 105)
        ax.set_title("Figure 3: free aligned 2 MiB extents vs utilization")
        ax.legend()
        fig.tight_layout()
        fig.savefig(f"{out}/fig3.png", dpi=120)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="8G", help="capacity of each file system (default 8G)")
    p.add_argument("--util", type=float, default=75.0)
    p.add_argument("--writes", type=float, default=10.0, help="multiple of capacity")
    p.add_argument("--profile", default="agrawal")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--fresh", default=None, help="fresh file size (default: 70%% of the free space, 2 MiB multiple)")
    p.add_argument("--sweep", action="store_true", help="also the Figure 3 sweep over 50..90%% utilization")
    p.add_argument("--sweep-size", default="4G")
    p.add_argument("--sweep-writes", type=float, default=2.0, help="writes per sweep step, x capacity")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default="results/aging")
    p.add_argument("--winefs", default="target/release/winefs")
    a = p.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root (loop devices, mounts)")
    for tool in ("mkfs.ext4", "mkfs.xfs", "xfs_db", "e2freefrag", "filefrag", "losetup"):
        if not shutil.which(tool):
            sys.exit(f"{tool} is missing: apt-get install xfsprogs e2fsprogs util-linux")
    if not os.path.exists(a.winefs):
        sh(["cargo", "build", "--release"], capture=False)
    a.size = parse_size(a.size)
    a.sweep_size = parse_size(a.sweep_size)
    a.fresh = parse_size(a.fresh) if a.fresh else int(a.size * (1 - a.util / 100) * 0.7) // HUGE * HUGE
    os.makedirs(a.out, exist_ok=True)
    ensure_tmpfs(IMG_DIR, a.size + 2 * (1 << 30), huge=False)
    ensure_tmpfs(HUGE_DIR, 2 * a.size + 4 * a.fresh + 2 * (1 << 30), huge=True)
    R = {"args": {k: getattr(a, k) for k in ("size", "util", "writes", "profile", "seed", "fresh")}}
    R["winefs-nocompact"], c2, g2 = run_winefs(a, a.out, "winefs-nocompact", background=False)
    os.remove(c2)
    os.remove(g2)
    R["winefs"], clean, aged = run_winefs(a, a.out)
    for kind in POSIX:
        R[kind] = run_posix(a, kind, a.out)
    log("mmap benchmark over every clean and aged layout (one run)")
    cases = [f"winefs-clean=winefs:{clean}:/fresh", f"winefs-aged=winefs:{aged}:/fresh"]
    for kind in POSIX:
        for st in ("clean", "aged"):
            cases.append(f"{kind}-{st}=replay:{a.out}/{kind}-{st}.layout:{a.size}")
    cmd = [a.winefs, "bench", "layout", "--size", str(a.fresh), "--repeats", str(a.repeats),
           "--json", f"{a.out}/bench.json"]
    for c in cases:
        cmd += ["--case", c]
    print(sh(cmd))
    R["bench"] = [json.loads(l) for l in open(f"{a.out}/bench.json")]
    os.remove(clean)
    os.remove(aged)
    if a.sweep:
        R["sweep"] = sweep(a, a.out)
    json.dump(R, open(f"{a.out}/results.json", "w"), indent=1)
    t = tables(R)
    open(f"{a.out}/tables.md", "w").write(t)
    print(t)
    plots(R, a.out)
    log(f"results in {a.out}/ (results.json, tables.md, fig1.png" + (", fig3.png)" if a.sweep else ")"))


if __name__ == "__main__":
    main()
