#!/usr/bin/env python3
"""Rewrites CUDA launches for the host emulator (emu/cuda_runtime.h).

    name<<<grid, block, smem, stream>>>(args)
becomes
    hk_emu_launch(reinterpret_cast<const void *>(&name), grid, block, smem,
                  stream, [=]() { name(args); })
(the kernel's address: what cudaFuncSetAttribute allowed it; nullptr
where the launch takes no dynamic shared memory, or the kernel is a
template whose arguments the call deduces), and each
static shared declaration
    __shared__ float a[N], b;
is followed, on its line, by
    hk_emu_shared(&a, sizeof(a)); hk_emu_shared(&b, sizeof(b));
so that a launch knows its kernel's static shared bytes (the 48 KB rule).

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
        out.append("hk_emu_launch(%s, %s, [=]() { %s(%s); })"
                   % (address(src, m.group(1), cfg), cfg, m.group(1), args))
        pos = e + 1


def split_top(text, opening, closing):
    """text split at the commas outside the brackets given."""
    depth, parts, cur = 0, [], ""
    for ch in text:
        depth += ch in opening
        depth -= ch in closing
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    return parts + [cur]


def address(src, name, cfg):
    """The kernel's address, or nullptr (no shared-memory check) for a
    launch without dynamic shared memory (nothing to check), and for a
    template launched with its arguments deduced (no address to take)."""
    parts = split_top(cfg, "(<", ")>")
    if len(parts) < 3 or parts[2].strip() == "0":
        return "nullptr"
    if "<" not in name and re.search(
            r"template\s*<[^<>]*>\s*(?:static\s+)?__global__\b[^;{}]*?\b"
            + re.escape(name) + r"\s*\(", src):
        return "nullptr"
    return "reinterpret_cast<const void *>(&%s)" % name


SHARED = re.compile(r"(?<!extern )__shared__\s+([^;]*);")
NAME = re.compile(r"([A-Za-z_]\w*)\s*(?:\[|$)")


def register_shared(src):
    """Each static __shared__ declaration registers its variables."""
    def names(decl):
        out = []
        for p in split_top(decl, "[", "]"):  # the declarators
            m = NAME.search(p.strip())
            if not m:
                sys.exit("emu_rewrite: no name in __shared__ %s" % decl)
            out.append(m.group(1))
        return out

    def add(m):
        reg = " ".join("hk_emu_shared(&%s, sizeof(%s));" % (n, n)
                       for n in names(m.group(1)))
        return m.group(0) + " " + reg
    return SHARED.sub(add, src)


def main():
    with open(sys.argv[1]) as f:
        src = f.read()
    with open(sys.argv[2], "w") as f:
        f.write('#line 1 "%s"\n' % sys.argv[1])
        f.write(rewrite(register_shared(src)))


if __name__ == "__main__":
    main()
