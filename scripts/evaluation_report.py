#!/usr/bin/env python3
"""Turn the outputs of scripts/evaluate.sh into one report: OUT/report.md and PNG plots.

For each figure of the WineFS paper that the evaluation reproduces, the report puts the
paper's claim beside winefs's number and the baselines measured in the same run, and says
whether the issue-18 target is met. The system-call figures come from `winefs bench workload
--json` (workload.json); the other benchmarks' reports are included as they printed them.
Plots need matplotlib (Debian: python3-matplotlib); without it the report says so and has
only tables.

    python3 scripts/evaluation_report.py OUT
"""

import json
import os
import sys

FILEBENCH = ["varmail", "fileserver", "webserver", "webproxy"]
MICRO = ["append-fsync", "seq-read", "rand-read", "seq-write", "rand-write"]
LABEL = {
    "lib-strict": "winefs library, strict",
    "lib-relaxed": "winefs library, relaxed",
    "lib-strict-aged": "winefs library, strict, aged",
    "fuse": "winefs FUSE",
    "fuse-aged": "winefs FUSE, aged",
    "tmpfs": "tmpfs",
    "passthrough": "passthrough_ll",
    "ext4": "ext4 (loop)",
    "xfs": "xfs (loop)",
}
# What the paper reports for each figure this evaluation reproduces (its words, summarised).
PAPER = {
    "fig9": "WineFS and NOVA-relaxed up to 5x ext4-DAX on Filebench; WineFS equal to or better "
            "than the best PM file system on every personality (Fig. 9 a, d)",
    "fig6": "WineFS equal or better throughput than the other PM file systems on 4 KiB reads "
            "and writes, sequential and random; up to 25% over NOVA on writes (Fig. 6 b, c)",
    "fig10": "WineFS and NOVA scale best with threads (per-CPU journals); ext4-DAX and "
             "xfs-DAX flatten (Fig. 10)",
    "recovery": "3.5 M files recovered in 7.8 s (about 450,000 files per second) by a "
                "parallel inode-table scan on many cores",
    "memory": "under 64 bytes of DRAM per directory entry",
}


def load(out, name):
    path = os.path.join(out, name)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return f.read()


def measured(runs, workload, setup, threads=None):
    for r in runs:
        if (r["workload"] == workload and r["setup"] == setup
                and (threads is None or r["threads"] == threads)
                and r["skipped"] is None and r["error"] is None and r["ops"] > 0):
            return r
    return None


def ratio(runs, w, a, b, threads=None):
    x = measured(runs, w, a, threads)
    if x is None:
        return None
    y = measured(runs, w, b, x["threads"])
    if y is None or y["ops_per_s"] <= 0:
        return None
    return x["ops_per_s"] / y["ops_per_s"]


def fmt(r):
    return "-" if r is None else f"{r:.2f}"


def verdict(r, want):
    if r is None:
        return "not measured"
    return f"{r:.2f} ({'met' if r >= want else '**not met**'})"


def setup_table(setups, names, cell):
    """A table of one row per setup and one column per workload, cells from cell(setup, name)."""
    lines = ["| setup | " + " | ".join(names) + " |", "|---|" + "--:|" * len(names)]
    for s in setups:
        lines.append(f"| {LABEL[s]} | " + " | ".join(cell(s, n) for n in names) + " |")
    return lines + [""]


def workload_tables(wl):
    runs = wl["runs"]
    setups = [s for s in LABEL if any(r["setup"] == s for r in runs)]
    lines = []

    def ops(s, n):
        r = measured(runs, n, s)
        return "-" if r is None else f"{r['ops_per_s']:,.0f} ({fmt(ratio(runs, n, s, 'tmpfs'))})"

    def pieces(s, n):
        p = (measured(runs, n, s) or {}).get("pieces")
        return "-" if not p else f"{p['pieces'] / max(p['files'], 1):.2f} ({p['most']})"

    for title, names, key in [("Filebench personalities (Fig. 9)", FILEBENCH, "fig9"),
                              ("Microbenchmarks (Fig. 6 b, c)", MICRO, "fig6")]:
        names = [n for n in names if any(r["workload"] == n for r in runs)]
        if not names:
            continue
        lines += [f"### {title}", "", f"Paper: {PAPER[key]}.", "",
                  "ops/s of this run (ratio to tmpfs in brackets):", ""]
        lines += setup_table(setups, names, ops)
        # How many pieces the allocator left the file sets in (winefs setups only).
        counted = [s for s in setups
                   if any((measured(runs, n, s) or {}).get("pieces") for n in names)]
        if counted:
            lines += ["Extents per file after the run (physically contiguous runs; the most "
                      "in one file in brackets):", ""]
            lines += setup_table(counted, names, pieces)
    scale = [r for r in runs if r["workload"] == "scale"]
    if scale:
        counts = sorted({r["threads"] for r in scale})
        lines += ["### Scalability (Fig. 10)", "", f"Paper: {PAPER['fig10']}.", "",
                  "ops/s by threads (speed-up over one thread in brackets):", "",
                  "| setup | " + " | ".join(f"{c} thread{'' if c == 1 else 's'}" for c in counts) + " |",
                  "|---|" + "--:|" * len(counts)]
        for s in setups:
            base = measured(runs, "scale", s, 1)
            cells = []
            for c in counts:
                r = measured(runs, "scale", s, c)
                if r is None:
                    cells.append("-")
                elif base:
                    cells.append(f"{r['ops_per_s']:,.0f} ({r['ops_per_s'] / base['ops_per_s']:.2f}x)")
                else:
                    cells.append(f"{r['ops_per_s']:,.0f}")
            lines.append(f"| {LABEL[s]} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["### Targets (issue 18)", ""]
    for w in ["varmail", "append-fsync"]:
        lines.append(f"- {w}: winefs library (strict) / tmpfs >= 2.0: "
                     + verdict(ratio(runs, w, "lib-strict", "tmpfs"), 2.0))
    for w in FILEBENCH + MICRO + ["scale"]:
        if not any(r["workload"] == w for r in runs):
            continue
        top = max(r["threads"] for r in runs if r["workload"] == w) if w == "scale" else None
        lines.append(f"- {w}: winefs FUSE / passthrough_ll >= 1.0: "
                     + verdict(ratio(runs, w, "fuse", "passthrough", top), 1.0)
                     + "; aged / clean >= 0.9: library "
                     + verdict(ratio(runs, w, "lib-strict-aged", "lib-strict", top), 0.9)
                     + ", FUSE " + verdict(ratio(runs, w, "fuse-aged", "fuse", top), 0.9))
    lines.append("")
    return lines


def plots(wl, out):
    """Fig. 9-, 6- and 10-like plots; returns the file names made (none without matplotlib)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    runs = wl["runs"]
    setups = [s for s in LABEL if any(r["setup"] == s for r in runs)]
    made = []
    for name, names in [("fig9.png", FILEBENCH), ("fig6.png", MICRO)]:
        names = [n for n in names if any(r["workload"] == n for r in runs)]
        if not names:
            continue
        fig, ax = plt.subplots(figsize=(10, 4))
        width = 0.8 / max(len(setups), 1)
        for i, s in enumerate(setups):
            ys = [ratio(runs, n, s, "tmpfs") or 0 for n in names]
            ax.bar([j + i * width for j in range(len(names))], ys, width, label=LABEL[s])
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(names))])
        ax.set_xticklabels(names)
        ax.set_ylabel("ops/s relative to tmpfs")
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.legend(fontsize=7, ncol=3)
        fig.tight_layout()
        fig.savefig(os.path.join(out, name), dpi=110)
        plt.close(fig)
        made.append(name)
    scale = [r for r in runs if r["workload"] == "scale"]
    if scale:
        fig, ax = plt.subplots(figsize=(6, 4))
        for s in setups:
            pts = sorted((r["threads"], r["ops_per_s"]) for r in scale
                         if r["setup"] == s and r["skipped"] is None and r["error"] is None)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] / 1e3 for p in pts], marker="o", label=LABEL[s])
        ax.set_xlabel("threads")
        ax.set_ylabel("thousand ops/s")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(os.path.join(out, "fig10.png"), dpi=110)
        plt.close(fig)
        made.append("fig10.png")
    return made


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: evaluation_report.py OUT (the directory scripts/evaluate.sh wrote)")
    out = sys.argv[1]
    if not os.path.isdir(out):
        sys.exit(f"evaluation_report.py: {out} is not a directory (run scripts/evaluate.sh first)")
    lines = ["# winefs evaluation", ""]
    meta = load(out, "meta.txt")
    if meta:
        lines += ["```", meta.strip(), "```", ""]
    wl_text = load(out, "workload.json")
    if wl_text:
        wl = json.loads(wl_text)
        lines += ["## System-call workloads (`winefs bench workload`)", "",
                  f"{wl['cpus']} CPUs, {wl['seconds']} s per timed run, pools and baselines in "
                  f"{wl['dir']} ({wl['dir_fs']}); aged pools at {wl['util_pct']}%.", ""]
        lines += workload_tables(wl)
        made = plots(wl, out)
        if made:
            lines += [f"![{m}]({m})" for m in made] + [""]
        else:
            lines += ["(No plots: matplotlib is not installed; Debian: python3-matplotlib.)", ""]
    sections = [
        ("workload.txt", "`winefs bench workload`, as printed", None),
        ("syscall.txt", "System calls, 4 KiB (`winefs bench syscall`)", None),
        ("fuse.txt", "The FUSE door (`winefs bench fuse`)", None),
        ("mmap.txt", "Memory-mapped access (`winefs bench mmap`)", None),
        ("app.txt", "LMDB and RocksDB (`winefs bench app`)", None),
        ("mount_time.txt", "Recovery and mount time (`examples/mount_time`)", PAPER["recovery"]),
        ("mount_cli_time.txt", "Mount time from `winefs mount` to a usable mount point (`scripts/mount_cli_time.sh`)", None),
        ("dram.txt", "DRAM per file (`examples/dram_per_file`)", PAPER["memory"]),
        ("daemon_dram.txt", "DRAM per file of the FUSE daemon (`scripts/daemon_dram.sh`)", None),
    ]
    for name, title, paper in sections:
        text = load(out, name)
        if text is None:
            continue
        lines += [f"## {title}", ""]
        if paper:
            lines += [f"Paper: {paper}.", ""]
        lines += ["```", text.rstrip(), "```", ""]
    failed = load(out, "failed.txt")
    if failed:
        lines += ["## Steps that failed", "", "```", failed.rstrip(), "```", ""]
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write("\n".join(lines))
    print(os.path.join(out, "report.md"))


if __name__ == "__main__":
    main()
