#!/usr/bin/env python3
"""Side-by-side throughput of this engine and llama.cpp on one generated
Qwen3.5-0.8B-shaped checkpoint (issue 17, item 6).

    python3 bench/llamacpp_compare.py [--rounds 5] [--threads 2]
        [--prefill 512,2048] [--decode 128] [--formats f32,bf16,int8]
        [--no-openblas] [--update] [--cache DIR] [--out DIR]

What it does, everything outside the repository under --cache
(default ~/.cache/hypic-llamabench), each step skipped when its result is
already there:
  1. llama.cpp's source: PyPI's llama-cpp-python source package, which
     vendors it (`pip download --no-binary :all:`); the newest one cached is
     used unless --update asks PyPI for a newer one.
  2. llama-bench built from it (cmake, Release, CPU only, GGML_NATIVE, at
     nice 19), once plainly and once with OpenBLAS (--no-openblas skips it).
  3. A venv with what llama.cpp's convert_hf_to_gguf.py needs (its own
     requirements file; torch comes from PyPI), plus numpy and tokenizers
     for tools/gen_model.py.
  4. The checkpoint: tools/gen_model.py, the bench/README.md shape, f32 and
     the same weights stored bf16; int8 from it by tools/convert_weights.py
     (`--to int8`, its default groups) when the tree has that converter.
  5. GGUF f32, bf16 and q8_0 from the f32 checkpoint by llama.cpp's own
     converter (--no-mtp when the config declares MTP layers it has no
     tensors for), through bench/llamacpp_convert.py, which names the
     pre-tokenizer of our generated tokenizer (the converter only knows
     released ones).
  6. Rounds, interleaved (ours f32, llama.cpp f32, llama.cpp+OpenBLAS f32,
     ours bf16, llama.cpp bf16, ours int8, llama.cpp q8_0, then again),
     after one short discarded run of each (64 prompt tokens, 4 generated).
     llama-bench runs `-p P -n N -r 1` (it warms each test up itself); ours
     runs build/bench/engine_throughput `--tokens P --decode N` (which warms
     up first too). pp = prompt tokens/s; decode = generation
     tokens/s (llama-bench: tg N from an empty context; ours: N tokens after
     the shortest prefill).
Prints the table (median and min-max per cell) with the ratio rows of the
issue's targets, and writes table.md, summary.tsv, runs.tsv (one row per
run and metric) and raw.log (every run's output) to --out.
"""
import argparse
import fcntl
import hashlib
import json
import os
import re
import shutil
import statistics
import struct
import subprocess
import sys
import tarfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the Qwen3.5-0.8B shape of bench/README.md
GEN_ARGS = ["--arch", "qwen3_5", "--hidden", "1024", "--layers", "24", "--heads", "8", "--kv-heads", "2",
            "--head-dim", "256", "--lin-k-heads", "16", "--lin-v-heads", "16", "--lin-k-dim", "128",
            "--lin-v-dim", "128", "--intermediate", "3584", "--vocab", "248320", "--tied", "--seed", "1",
            # Qwen3.5 checkpoints carry one MTP layer, and llama.cpp's converter
            # asserts that a qwen3_5 config declares one
            "--mtp"]
WARM = 64  # prompt tokens of the discarded warm-up run (and 4 generated)
GGUF_TYPE = {"f32": "f32", "bf16": "bf16", "int8": "q8_0"}  # ours -> llama.cpp at the same precision


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run(cmd, logfile=None, **kw):
    """Runs cmd, its output to logfile when given (its tail shown on failure)."""
    log("$ " + " ".join(cmd) + (f" > {logfile}" if logfile else ""))
    if not logfile:
        subprocess.run(cmd, check=True, **kw)
        return
    os.makedirs(os.path.dirname(logfile), exist_ok=True)
    with open(logfile, "w") as f:
        p = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, **kw)
    if p.returncode:
        with open(logfile) as f:
            sys.stderr.write("".join(f.readlines()[-30:]))
        sys.exit(f"llamacpp_compare: exit {p.returncode}: {' '.join(cmd)} (log: {logfile})")


def vkey(v):
    return tuple(int(x) if x.isdigit() else x for x in re.split(r"[.+-]", v))


# ---- 1. source -------------------------------------------------------------

def llama_source(cache, update):
    """(version, path of the vendored llama.cpp tree)."""
    sd = os.path.join(cache, "sdist")
    os.makedirs(sd, exist_ok=True)

    def cached():
        got = [m.group(1) for f in os.listdir(sd) if (m := re.fullmatch(r"llama_cpp_python-(.+)\.tar\.gz", f))]
        return max(got, key=vkey) if got else None

    if update or not cached():
        run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
             "llama-cpp-python", "-d", sd])
    ver = cached()
    tree = os.path.join(cache, f"llama.cpp-{ver}")
    if not os.path.isfile(os.path.join(tree, "CMakeLists.txt")):
        log(f"extracting llama.cpp from llama_cpp_python-{ver}.tar.gz")
        tmp = tree + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        with tarfile.open(os.path.join(sd, f"llama_cpp_python-{ver}.tar.gz")) as tf:
            pre = f"llama_cpp_python-{ver}/vendor/llama.cpp/"
            members = []
            for m in tf.getmembers():
                if m.name.startswith(pre):
                    m.name = m.name[len(pre):]
                    members.append(m)
            if not members:
                sys.exit(f"llamacpp_compare: llama_cpp_python-{ver} vendors no llama.cpp")
            try:
                tf.extractall(tmp, members=members, filter="data")
            except TypeError:  # Python < 3.11.4: no extraction filters
                tf.extractall(tmp, members=members)
        shutil.rmtree(tree, ignore_errors=True)
        os.rename(tmp, tree)
    return ver, tree


# ---- 2. build --------------------------------------------------------------

def build_llama_bench(cache, ver, tree, variant):
    """llama-bench of one build variant ('cpu' or 'openblas'); returns its path
    and the build time (None when it was cached)."""
    bdir = os.path.join(cache, f"build-{ver}-{variant}")
    exe = os.path.join(bdir, "bin", "llama-bench")
    stamp = os.path.join(bdir, ".built")
    if os.path.exists(stamp) and os.access(exe, os.X_OK):
        return exe, None
    flags = ["-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DBUILD_SHARED_LIBS=OFF",
             "-DGGML_CUDA=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
             "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF"]
    if variant == "openblas":
        flags += ["-DGGML_BLAS=ON", "-DGGML_BLAS_VENDOR=OpenBLAS"]
    t0 = time.time()
    os.makedirs(bdir, exist_ok=True)
    run(["nice", "-n", "19", "cmake", "-S", tree, "-B", bdir] + flags, os.path.join(bdir, "configure.log"))
    run(["nice", "-n", "19", "cmake", "--build", bdir, "--target", "llama-bench", "-j", str(os.cpu_count() or 2)],
        os.path.join(bdir, "build.log"))
    dt = time.time() - t0
    with open(stamp, "w") as f:
        f.write(f"{dt:.0f} s\n")
    log(f"built llama-bench ({variant}) in {dt / 60:.1f} min")
    return exe, dt


# ---- 3. venv ---------------------------------------------------------------

def requirements(path):
    """Package lines of a pip requirements file, following -r includes;
    index options are dropped (only PyPI is used) and so is gguf (the
    converter imports the gguf-py of its own tree)."""
    out = []
    with open(path) as f:
        for line in f:
            line = line.split("#")[0].strip()
            if line.startswith("-r"):
                out += requirements(os.path.join(os.path.dirname(path), line[2:].strip()))
            elif line and not line.startswith("-") and not re.match(r"gguf\b", line):
                out.append(line)
    return out


def venv(cache, tree):
    req = requirements(os.path.join(tree, "requirements", "requirements-convert_hf_to_gguf.txt"))
    req += ["tokenizers"]  # tools/gen_model.py: numpy (above) and tokenizers
    vd = os.path.join(cache, "venv")
    py = os.path.join(vd, "bin", "python")
    stamp = os.path.join(vd, ".req-" + hashlib.sha256("\n".join(req).encode()).hexdigest()[:12])
    if not os.path.exists(stamp):
        if not os.path.exists(py):
            run([sys.executable, "-m", "venv", vd])
        run([py, "-m", "pip", "install", "--no-cache-dir"] + req, os.path.join(cache, "venv-install.log"))
        open(stamp, "w").close()
    return py


# ---- 4. checkpoints --------------------------------------------------------

def file_hash(*paths):
    h = hashlib.sha256()
    for p in paths:
        with open(p, "rb") as f:
            h.update(f.read())
    return h


def safetensors_names(d):
    names = []
    for f in sorted(os.listdir(d)):
        if f.endswith(".safetensors"):
            with open(os.path.join(d, f), "rb") as fh:
                (n,) = struct.unpack("<Q", fh.read(8))
                names += [k for k in json.loads(fh.read(n)) if k != "__metadata__"]
    return names


INT8_TOOL = os.path.join(REPO, "tools", "convert_weights.py")  # `--to int8 SRC DST`


def checkpoints(cache, py, formats):
    """(cache dir of this checkpoint, {format: HF-layout model dir}): f32 and
    bf16 always (the GGUFs are made from f32), int8 when asked and a
    converter exists."""
    gen = os.path.join(REPO, "tools", "gen_model.py")
    key = file_hash(gen, os.path.join(REPO, "tools", "hflib.py"))
    key.update(" ".join(GEN_ARGS).encode())
    md = os.path.join(cache, "models", "q35-08b-" + key.hexdigest()[:12])
    dirs = {}
    for fmt in ("f32", "bf16"):
        d = os.path.join(md, fmt)
        if not os.path.exists(os.path.join(d, ".done")):
            shutil.rmtree(d, ignore_errors=True)
            run([py, gen] + GEN_ARGS + ["--dtype", fmt, "--out", d], d + ".log")
            open(os.path.join(d, ".done"), "w").close()
        dirs[fmt] = d
    if "int8" in formats:
        if not os.path.exists(INT8_TOOL):
            log("int8: no tools/convert_weights.py in this tree: skipping our int8 row")
        else:
            tkey = file_hash(INT8_TOOL).hexdigest()[:12]
            d = os.path.join(md, f"int8-{tkey}")
            if not os.path.exists(os.path.join(d, ".done")):
                shutil.rmtree(d, ignore_errors=True)
                run([py, INT8_TOOL, "--to", "int8", dirs["f32"], d], d + ".log")
                open(os.path.join(d, ".done"), "w").close()
            dirs["int8"] = d
    return md, dirs


# ---- 5. GGUF ---------------------------------------------------------------

def to_gguf(py, tree, ver, md, src, outtype):
    out = os.path.join(md, f"llama.cpp-{ver}-{outtype}.gguf")
    if os.path.exists(out):
        return out
    conv = os.path.join(tree, "convert_hf_to_gguf.py")
    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    n_mtp = cfg.get("text_config", cfg).get("mtp_num_hidden_layers", 0)
    has_mtp = any(re.match(r"(model\.)?mtp\.", n) for n in safetensors_names(src))
    extra = []
    if n_mtp and not has_mtp:
        with open(conv) as f:
            if "--no-mtp" not in f.read():
                sys.exit("llamacpp_compare: the config declares MTP layers without MTP tensors and this "
                         "convert_hf_to_gguf.py has no --no-mtp")
        log(f"config declares {n_mtp} MTP layer(s) without mtp.* tensors: converting with --no-mtp")
        extra = ["--no-mtp"]
    shim = os.path.join(REPO, "bench", "llamacpp_convert.py")
    run([py, shim, tree, src, "--outtype", outtype, "--outfile", out + ".tmp"] + extra, out + ".log")
    os.rename(out + ".tmp", out)
    return out


# ---- 6. runs ---------------------------------------------------------------

def md_tables(text):
    """Each markdown table in text as a list of {header: cell} rows."""
    tables, head = [], None
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("|"):
            head = None
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if head is None:
            head = [c.lower() for c in cells]
            tables.append([])
        elif not all(re.fullmatch(r":?-+:?", c) for c in cells):
            tables[-1].append(dict(zip(head, cells)))
    return tables


def parse_ours(text, prefill):
    """{'pp<T>': tok/s, 'tg': tok/s} from engine_throughput's output: the rows
    whose 'tokens' cell is a measured count (warm-up rows, if printed, are
    labelled otherwise and ignored); decode is the one after the shortest
    prefill."""
    res, dec = {}, {}
    for t in md_tables(text):
        for row in t:
            tok = next((v for k, v in row.items() if k.startswith("tokens")), "")
            if not tok.isdigit():
                continue
            for k, v in row.items():
                num = re.match(r"[0-9.]+", v)
                if not num:
                    continue
                if k.startswith("prefill") and "tok/s" in k:
                    res[f"pp{tok}"] = float(num.group())
                elif k.startswith("decode") and "tok/s" in k:
                    dec[int(tok)] = float(num.group())
    missing = [f"pp{p}" for p in prefill if f"pp{p}" not in res]
    if missing or not dec:
        raise ValueError(f"engine_throughput output lacks {missing or 'decode'}:\n{text}")
    res["tg"] = dec[min(dec)]
    return res


def parse_llama(text):
    res = {}
    for r in json.loads(text):
        if r["n_prompt"] and not r["n_gen"]:
            res[f"pp{r['n_prompt']}"] = r["avg_ts"]
        elif r["n_gen"] and not r["n_prompt"]:
            res["tg"] = r["avg_ts"]
    return res


class Crash(RuntimeError):
    """a run killed by a signal"""


class Arm:
    """One row of the table: a command, how to read its output, and a short
    form of it for the discarded warm-up run (pages in the weights, starts
    the thread pools; a full-size warm-up would double the preparation)."""

    def __init__(self, name, cmd, warm, parse, env, fallback=None):
        self.name, self.cmd, self.warm, self.parse, self.env = name, cmd, warm, parse, env
        self.label = name  # the table's row; name stays the key of the ratio rows
        # (options, why): tried once when the warm-up run dies by a signal
        self.fallback = fallback
        self.raw = []  # stdout of every run, warm-up first

    def warm_up(self):
        try:
            self.once(warm=True)
        except Crash:
            if not self.fallback:
                raise
            opts, why = self.fallback
            log(f"{self.name}: {why}; trying {' '.join(opts)}")
            self.cmd, self.warm = self.cmd + opts, self.warm + opts
            self.label = f"{self.name} ({' '.join(opts)})"
            self.once(warm=True)

    def once(self, warm=False):
        t0 = time.time()
        p = subprocess.run(self.warm if warm else self.cmd, capture_output=True, text=True, env=self.env)
        if p.returncode:
            err = Crash if p.returncode < 0 else RuntimeError
            raise err(f"{self.name}: exit {p.returncode}\n{p.stderr[-3000:]}")
        self.raw.append(p.stdout)
        res = self.parse(p.stdout, WARM if warm else None)
        log(f"  {self.name}: " + ", ".join(f"{k} {v:.1f}" for k, v in res.items()) +
            f" ({time.time() - t0:.0f} s)")
        return res


def cell(xs):
    if not xs:
        return "-"
    med = statistics.median(xs)
    fmt = "{:.2f}" if med < 10 else "{:.1f}" if med < 100 else "{:.0f}"
    s = fmt.format(med)
    return s if len(xs) == 1 else s + " (" + fmt.format(min(xs)) + "–" + fmt.format(max(xs)) + ")"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prefill", default="512,2048")
    ap.add_argument("--decode", type=int, default=128)
    ap.add_argument("--formats", default="f32,bf16,int8", help="ours, each against llama.cpp at the same precision")
    ap.add_argument("--no-openblas", action="store_true", help="skip llama.cpp built with OpenBLAS")
    ap.add_argument("--update", action="store_true", help="ask PyPI for a newer llama-cpp-python")
    ap.add_argument("--cache", default=os.path.join(os.path.expanduser("~"), ".cache", "hypic-llamabench"))
    ap.add_argument("--out", help="where table.md, summary.tsv and runs.tsv go (default CACHE/results/DATE)")
    ap.add_argument("--prepare-only", action="store_true", help="build and convert, run nothing")
    a = ap.parse_args()
    prefill = [int(x) for x in a.prefill.split(",")]
    formats = [f for f in a.formats.split(",") if f]
    if set(formats) - set(GGUF_TYPE):
        sys.exit(f"llamacpp_compare: formats are {', '.join(GGUF_TYPE)}")
    os.makedirs(a.cache, exist_ok=True)
    lock = open(os.path.join(a.cache, ".lock"), "w")
    try:  # one at a time: two would build into the same folders (and share 2 cores)
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        sys.exit(f"llamacpp_compare: another run holds {a.cache}/.lock")

    ver, tree = llama_source(a.cache, a.update)
    log(f"llama.cpp from llama-cpp-python {ver}: {tree}")
    variants = ["cpu"] + ([] if a.no_openblas else ["openblas"])
    bench = {v: build_llama_bench(a.cache, ver, tree, v) for v in variants}
    py = venv(a.cache, tree)
    md, dirs = checkpoints(a.cache, py, formats)
    ours_dirs = {f: d for f, d in dirs.items() if f in formats}
    gguf = {f: to_gguf(py, tree, ver, md, dirs["f32"], GGUF_TYPE[f]) for f in formats}
    run(["nice", "-n", "19", "make", "-C", REPO, "-j2", "build/bench/engine_throughput"],
        os.path.join(a.cache, "engine-make.log"))
    if a.prepare_only:
        return

    # ours as bench/README.md runs it; llama.cpp with its own defaults and the
    # same OpenBLAS core type (0.3.21 does not know recent AVX-512 cores)
    base = dict(os.environ)
    if "avx512f" in open("/proc/cpuinfo").read():
        base.setdefault("OPENBLAS_CORETYPE", "SkylakeX")
    # the engine's own default (engine/cli/main.c): a bounded spin, then sleep
    ours_env = dict(base, OMP_NUM_THREADS=str(a.threads), GOMP_SPINCOUNT="20000")
    eng = os.path.join(REPO, "build", "bench", "engine_throughput")
    pp = ",".join(map(str, prefill))
    arms = []
    for f in formats:
        if f in ours_dirs:
            cmd = lambda p, n: [eng, "--model", ours_dirs[f], "--tokens", str(p), "--decode", str(n)]  # noqa: E731
            arms.append(Arm(f"ours {f}", cmd(pp, a.decode), cmd(WARM, 4),
                            lambda s, w: parse_ours(s, [w] if w else prefill), ours_env))
        for v in variants if f == "f32" else ["cpu"]:
            name = f"llama.cpp {GGUF_TYPE[f]}" + (" built with OpenBLAS" if v == "openblas" else "")
            cmd = lambda p, n: [bench[v][0], "-m", gguf[f], "-p", str(p), "-n", str(n),  # noqa: E731
                                "-t", str(a.threads), "-r", "1", "-o", "json"]
            # llama.cpp 0.3.36's AMX q8_0 kernels (used through --repack 1, the default, on CPUs with
            # AMX) die with SIGILL/SIGSEGV here; without repacking it takes its AVX-512 path
            fb = (["--repack", "0"], "it crashed (AMX kernels?)")
            arms.append(Arm(name, cmd(pp, a.decode), cmd(WARM, 4), lambda s, w: parse_llama(s), base, fb))

    load0 = os.getloadavg()[0]
    commit = subprocess.run(["git", "-C", REPO, "describe", "--always", "--dirty"], capture_output=True,
                            text=True).stdout.strip()
    log("warm-up: one discarded run of each")
    for arm in list(arms):
        try:
            arm.warm_up()
        except (RuntimeError, ValueError) as e:
            log(f"{arm.name}: dropped, its warm-up run failed: {e}")
            arms.remove(arm)
    runs = []  # (round, arm, metric, tok/s)
    t0 = time.time()
    for r in range(a.rounds):
        log(f"round {r + 1}/{a.rounds}")
        for arm in arms:
            runs += [(r, arm.name, k, v) for k, v in arm.once().items()]
    log(f"{a.rounds} rounds in {(time.time() - t0) / 60:.1f} min")

    metrics = [f"pp{p}" for p in prefill] + ["tg"]
    heads = [f"prefill {p}" for p in prefill] + [f"decode {a.decode}"]
    get = lambda name, m: [v for _, n, k, v in runs if n == name and k == m]  # noqa: E731

    def ratio(num, den, m):
        """per-round ratios: the rows ran back to back, so drift cancels"""
        by = {(r, n): v for r, n, k, v in runs if k == m}
        return [by[r, num] / by[r, den] for r in range(a.rounds) if (r, num) in by and (r, den) in by]

    lines = [f"| tok/s, median (min–max) of {a.rounds} | " + " | ".join(heads) + " |",
             "|---|" + "---|" * len(heads)]
    summary = [("row", "metric", "median", "min", "max", "n")]
    for arm in arms:
        lines.append(f"| {arm.label} | " + " | ".join(cell(get(arm.name, m)) for m in metrics) + " |")
        summary += [(arm.label, m, statistics.median(xs), min(xs), max(xs), len(xs))
                    for m in metrics if (xs := get(arm.name, m))]
    targets = [(f"decode: ours {f} ÷ llama.cpp {GGUF_TYPE[f]}", f"ours {f}", f"llama.cpp {GGUF_TYPE[f]}", "tg")
               for f in ours_dirs]
    if "bf16" in ours_dirs:
        targets += [(f"prefill {p}: ours bf16 ÷ llama.cpp bf16", "ours bf16", "llama.cpp bf16", f"pp{p}")
                    for p in prefill]
    lines += ["", "| target ratio (≥ 1 meets it), per-round pairs | median (min–max) | met |", "|---|---|---|"]
    for label, num, den, m in targets:
        xs = ratio(num, den, m)
        met = "-" if not xs else "yes" if statistics.median(xs) >= 1 else "no"
        lines.append(f"| {label} | {cell(xs)} | {met} |")
        if xs:
            summary.append((label, m, statistics.median(xs), min(xs), max(xs), len(xs)))
    note = (f"{a.threads} threads, {a.rounds} interleaved rounds after a discarded warm-up run each; "
            f"ours at {commit}; llama.cpp from llama-cpp-python {ver} (llama-bench -p {pp} -n {a.decode} -r 1); "
            f"checkpoint {md}; load average {load0:.1f} at the start, {os.getloadavg()[0]:.1f} at the end")
    table = "\n".join(lines)
    print(table + "\n\n" + note)

    out = a.out or os.path.join(a.cache, "results", time.strftime("%Y%m%d-%H%M%S"))
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "table.md"), "w") as f:
        f.write(table + "\n\n" + note + "\n")
    with open(os.path.join(out, "summary.tsv"), "w") as f:
        f.writelines("\t".join(map(str, r)) + "\n" for r in summary)
    with open(os.path.join(out, "runs.tsv"), "w") as f:
        f.write("round\trow\tmetric\ttok_s\n")
        f.writelines(f"{r + 1}\t{n}\t{k}\t{v}\n" for r, n, k, v in runs)
    with open(os.path.join(out, "raw.log"), "w") as f:
        for arm in arms:
            f.write(f"==== {arm.label}: {' '.join(arm.cmd)}\n" + "\n".join(arm.raw) + "\n")
    log(f"wrote {out}/table.md, summary.tsv, runs.tsv, raw.log")


if __name__ == "__main__":
    main()
