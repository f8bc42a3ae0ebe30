#!/usr/bin/env python3
"""What ptxas gave each CUDA kernel at sm_90a, checked against a baseline.

The Makefile's nvcc rule keeps ptxas's -v report of each object beside it
(build/obj/kernels/cuda/X.cu.o.log). This reads those reports and lists,
per kernel at sm_90a, its registers, stack frame and spill bytes:

  ptxas_report.py LOG...                        the table (demangled names)
  ptxas_report.py --check BASELINE LOG...       exit 1 where a kernel's stack
                                                or spills grew, or a kernel
                                                is new or gone
  ptxas_report.py --update BASELINE LOG...      rewrite the baseline

Why: a kernel that starts to spill, or a new kernel that spills, is a
slowdown no test without a GPU sees (session 16's PIPEA made the default
decode step spill, unnoticed for three sessions). Registers are reported,
not checked: they move with every change. The baseline is
kernels/cuda/ptxas-sm90a.tsv: mangled name, registers, stack, spill stores,
spill loads.
"""
import argparse
import re
import subprocess
import sys

ARCH = "sm_90a"
ENTRY = re.compile(r"Compiling entry function '([^']+)' for '([^']+)'")
PROPS = re.compile(r"Function properties for (\S+)")
FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, "
                   r"(\d+) bytes spill loads")
USED = re.compile(r"Used (\d+) registers")


def parse(paths):
    """{mangled: (regs, stack, spill stores, spill loads)} at ARCH."""
    out = {}
    for path in paths:
        name = arch = props = None
        frame = (0, 0, 0)
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                m = ENTRY.search(line)
                if m:
                    name, arch = m.group(1), m.group(2)
                    frame = (0, 0, 0)
                    continue
                m = PROPS.search(line)
                if m:
                    props = m.group(1)
                    continue
                m = FRAME.search(line)
                if m and name and props == name:  # not a callee's
                    frame = tuple(int(x) for x in m.groups())
                    continue
                m = USED.search(line)
                if m and name and arch == ARCH:
                    out[name] = (int(m.group(1)),) + frame
                    name = None
    return out


def demangle(names):
    try:
        r = subprocess.run(["c++filt"], input="\n".join(names), text=True,
                           capture_output=True, check=True)
        return dict(zip(names, r.stdout.split("\n")))
    except (OSError, subprocess.CalledProcessError):
        return {n: n for n in names}


def read_baseline(path):
    base = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            name, *vals = line.rstrip("\n").split("\t")
            base[name] = tuple(int(v) for v in vals)
    return base


def write_baseline(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        f.write("# ptxas at %s (tools/ptxas_report.py --update): kernel\t"
                "registers\tstack\tspill stores\tspill loads\n" % ARCH)
        for name in sorted(rows):
            f.write("\t".join([name] + [str(v) for v in rows[name]]) + "\n")


def check(base, rows):
    """Lines saying what grew, appeared or went, against the baseline."""
    dm = demangle(sorted(set(base) | set(rows)))
    bad = []
    for name in sorted(rows):
        if name not in base:
            bad.append("new kernel (not in the baseline): %s: %d registers, "
                       "%d stack, %d/%d spill bytes" % ((dm[name],) +
                                                        rows[name]))
            continue
        was, now = base[name], rows[name]
        what = [label for label, i in (("stack", 1), ("spill stores", 2),
                                       ("spill loads", 3)) if now[i] > was[i]]
        if what:
            bad.append("%s: %s grew: stack %d -> %d, spills %d/%d -> %d/%d"
                       % (dm[name], ", ".join(what), was[1], now[1], was[2],
                          was[3], now[2], now[3]))
    for name in sorted(set(base) - set(rows)):
        bad.append("gone (still in the baseline): %s" % dm[name])
    return bad


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", metavar="BASELINE")
    ap.add_argument("--update", metavar="BASELINE")
    ap.add_argument("logs", nargs="+")
    a = ap.parse_args()
    rows = parse(a.logs)
    if not rows:
        print("no %s kernels in %s" % (ARCH, " ".join(a.logs)),
              file=sys.stderr)
        return 1
    if a.update:
        write_baseline(a.update, rows)
        print("%d kernels into %s" % (len(rows), a.update))
        return 0
    if a.check:
        bad = check(read_baseline(a.check), rows)
        for line in bad:
            print(line)
        print("%d kernels at %s; %d against %s" %
              (len(rows), ARCH, len(bad), a.check))
        return 1 if bad else 0
    dm = demangle(sorted(rows))
    print("regs\tstack\tspill_st\tspill_ld\tkernel")
    for name in sorted(rows, key=lambda n: dm[n]):
        print("%d\t%d\t%d\t%d\t%s" % (rows[name] + (dm[name],)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
