#!/usr/bin/env python3
"""Rewrites CUDA launches for the host emulator (emu/cuda_runtime.h).

    name<<<grid, block, smem, stream>>>(args)
becomes
    hk_emu_launch(grid, block, smem, stream, [=]() { name(args); })

name may carry template arguments (kernel<R>), and a macro's line
continuation may stand between it and <<< (clang-format breaks long
launches there); args may span lines, including backslash-continued macro
lines, which are kept verbatim.
Usage: emu_rewrite.py in.cu out.cpp
"""
import re
import sys


def rewrite(src):
    out, pos = [], 0
    name_re = re.compile(r"([A-Za-z_]\w*(?:<[^<>]*>)?)(?:\s|\\)*$")
    while True:
        i = src.find("<<<", pos)
        if i < 0:
            out.append(src[pos:])
            return "".join(out)
        m = name_re.search(src, pos, i)
        if not m:
            sys.exit("emu_rewrite: no kernel name before <<< at %d" % i)
        j = src.find(">>>", i)
        cfg = src[i + 3:j]
        k = j + 3
        while src[k].isspace() or src[k] == "\\":
            k += 1
        if src[k] != "(":
            sys.exit("emu_rewrite: no argument list after >>> at %d" % j)
        depth, e = 0, k
        while True:
            if src[e] == "(":
                depth += 1
            elif src[e] == ")":
                depth -= 1
                if depth == 0:
                    break
            e += 1
        args = src[k + 1:e]
        out.append(src[pos:m.start()])
        out.append("hk_emu_launch(%s, [=]() { %s(%s); })"
                   % (cfg, m.group(1), args))
        pos = e + 1


def main():
    with open(sys.argv[1]) as f:
        src = f.read()
    with open(sys.argv[2], "w") as f:
        f.write('#line 1 "%s"\n' % sys.argv[1])
        f.write(rewrite(src))


if __name__ == "__main__":
    main()
