#!/usr/bin/env python3
"""tokenizer_parity.py - our tokenizer against Hugging Face `tokenizers`.

    tokenizer_parity.py                  TAP: encode/decode parity on a
                                         generated corpus (t/020 runs this)
    tokenizer_parity.py --gen-unicode F  regenerate engine/tokenizer/tokenizer_unicode.c

Environment: HYPIC_BUILD (default ./build) for bin/hypic-engine,
HYPIC_SHARED (default ../shared from the repo root) for the Qwen3
tokenizer.json, HYPIC_PARITY_TOKENIZER to compare another tokenizer.json.
"""

import os
import random
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# ---------------------------------------------------------------------------
# TAP


class Tap:
    def __init__(self):
        self.n = 0
        self.failed = 0

    def ok(self, cond, name):
        self.n += 1
        print("%sok %d - %s" % ("" if cond else "not ", self.n, name))
        if not cond:
            self.failed += 1
        sys.stdout.flush()
        return cond

    def diag(self, msg):
        for line in str(msg).splitlines() or [""]:
            print("# " + line)

    def done(self):
        print("1..%d" % self.n)
        return 1 if self.failed else 0


def skip_all(why):
    print("1..0 # SKIP %s" % why)
    sys.exit(0)


def import_tokenizers():
    try:
        import tokenizers  # noqa: F401
        return True
    except ImportError:
        pass
    try:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q",
                        "tokenizers"], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=300)
        import importlib
        importlib.invalidate_caches()
        import tokenizers  # noqa: F401,F811
        return True
    except Exception:
        return False


# ---------------------------------------------------------------------------
# --gen-unicode: the Unicode data HF tokenizers effectively uses.
#
# HF runs the pre-tokenizer regex with Oniguruma, whose \p{L} etc. follow
# Unicode 16.0 in tokenizers 0.2x; PCRE2's own tables are older (10.42:
# Unicode 14), so we hand PCRE2 explicit ranges from Unicode 16.0 data
# (package unicodedata2==16.0.0). HF's NFC (unicode-normalization-alignments)
# carries much older data (about Unicode 9): marks and compositions added
# since are left untouched by HF but reordered/composed by utf8proc. Those
# code points are measured here against HF itself and emitted as "opaque":
# our normaliser copies them verbatim and normalises the runs between them.

GC_NAMES = ["Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Me", "Nd", "Nl", "No",
            "Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po", "Sm", "Sc", "Sk", "So",
            "Zs", "Zl", "Zp", "Cc", "Cf", "Cs", "Co", "Cn"]
UNICODE_VERSION = "16.0.0"


def load_unicodedata2():
    try:
        import unicodedata2
    except ImportError:
        d = tempfile.mkdtemp(prefix="ucd2-")
        subprocess.run([sys.executable, "-m", "pip", "install", "-q",
                        "--target", d, "unicodedata2==" + UNICODE_VERSION],
                       check=True)
        sys.path.insert(0, d)
        import unicodedata2
    if unicodedata2.unidata_version != UNICODE_VERSION:
        sys.exit("need unicodedata2 %s, have %s" %
                 (UNICODE_VERSION, unicodedata2.unidata_version))
    return unicodedata2


def nfc_opaque(U):
    from tokenizers.normalizers import NFC
    hf = NFC().normalize_str
    # reference marks of many combining classes (1 ... 240)
    refs = ["\u0334", "\u093c", "\u094d", "\u0321", "\u031b", "\u0328",
            "\u0316", "\u0301", "\u035d", "\u0345", "\u302a", "\u302e",
            "\u0f71", "\u0e38", "\u05b0", "\u0591"]
    opaque = set()
    for cp in range(0x110000):
        if 0xD800 <= cp < 0xE000 or U.combining(chr(cp)) == 0:
            continue
        c = chr(cp)
        differs = False
        untouched = True
        for r in refs:
            for s in ("x" + c + r, "x" + r + c):
                h = hf(s)
                if h != U.normalize("NFC", s):
                    differs = True
                if h != s:
                    untouched = False
        if differs:
            if not untouched:
                sys.exit("U+%04X: HF uses another non-zero class" % cp)
            opaque.add(cp)
    for cp in range(0x110000):
        if 0xD800 <= cp < 0xE000:
            continue
        c = chr(cp)
        d = U.decomposition(c)
        if not d or d.startswith("<"):
            continue
        nfd = U.normalize("NFD", c)
        if hf(nfd) == U.normalize("NFC", nfd) and hf(c) == U.normalize(
                "NFC", c):
            continue
        if hf(c) != c:
            sys.exit("U+%04X: HF changes a composite it cannot compose" % cp)
        # HF knows neither the composite nor its new parts; the marks it
        # does know (non-zero class, not opaque) stay normal.
        opaque.add(cp)
        for part in d.split():
            p = int(part, 16)
            if U.combining(chr(p)) == 0 or p in opaque:
                opaque.add(p)
    return sorted(opaque)


def gen_unicode(path):
    U = load_unicodedata2()
    if not import_tokenizers():
        sys.exit("HF tokenizers is needed to measure its NFC data")
    starts, cats = [], []
    prev = None
    for cp in range(0x110000):
        c = GC_NAMES.index(U.category(chr(cp)))
        if c != prev:
            starts.append(cp)
            cats.append(c)
            prev = c
    opaque = nfc_opaque(U)
    out = []
    out.append("/*\n * tokenizer_unicode.c - Unicode %s general categories "
               "and the code points\n * HF's NFC leaves alone, for the "
               "tokenizer. Generated by\n * tools/tokenizer_parity.py "
               "--gen-unicode; do not edit.\n */\n" % UNICODE_VERSION)
    out.append('#include "engine/tokenizer/tokenizer_impl.h"\n\n')
    out.append('const char hp_tokenizer_unicode_version[] = "%s";\n\n'
               % UNICODE_VERSION)
    out.append("/* clang-format off */\n")
    out.append("const char hp_tokenizer_gc_names[][3] = {\n")
    out.append("    " + ", ".join('"%s"' % n for n in GC_NAMES) + "};\n")
    out.append("const size_t hp_tokenizer_gc_n_names = %d;\n\n"
               % len(GC_NAMES))
    out.append("const uint32_t hp_tokenizer_gc_start[%d] = {\n" % len(starts))
    for i in range(0, len(starts), 8):
        out.append("    " + ", ".join("0x%x" % s for s in starts[i:i + 8])
                   + ",\n")
    out.append("};\n")
    out.append("const uint8_t hp_tokenizer_gc_cat[%d] = {\n" % len(cats))
    for i in range(0, len(cats), 20):
        out.append("    " + ",".join("%d" % c for c in cats[i:i + 20])
                   + ",\n")
    out.append("};\n")
    out.append("const size_t hp_tokenizer_gc_n = %d;\n\n" % len(starts))
    out.append("const uint32_t hp_tokenizer_nfc_opaque[%d] = {\n"
               % len(opaque))
    for i in range(0, len(opaque), 8):
        out.append("    " + ", ".join("0x%x" % s for s in opaque[i:i + 8])
                   + ",\n")
    out.append("};\n")
    out.append("/* clang-format on */\n")
    out.append("const size_t hp_tokenizer_nfc_n_opaque = %d;\n" % len(opaque))
    with open(path, "w") as f:
        f.write("".join(out))
    print("wrote %s: %d category runs, %d opaque code points"
          % (path, len(starts), len(opaque)))


# ---------------------------------------------------------------------------
# The corpus: (group, item) pairs; an item is str, or bytes for malformed
# UTF-8 (HF then sees bytes.decode("utf-8", "replace"), as our encoder
# does the same replacement itself).

SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>",
            "</think>", "<tool_call>", "</tool_call>", "<|vision_start|>",
            "<|fim_prefix|>", "<|box_start|>"]

PROSE = [
    "Hello world! This is a test of the HYPIC tokenizer.",
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure you'll see they've done it; he'd say it's 'fine', we're OK.",
    "DON'T SHOUT. I'LL GO. You'RE late, it'S, we'Ve, I'M, they'LL, he'D.",
    "rock'n'roll o'clock y'all ma'am 'tis '90s ''quoted'' can't won't",
    "  leading spaces and trailing spaces   ",
    "Mr. Smith paid $1,234.56 (USD) on 2024-06-01 at 10:30am -- 15% off!",
    "e-mail: someone@example.com, url: https://example.org/a/b?c=d&e=f#g",
    "Ünïcödé àccénts: naïve café résumé coöperate Zürich São Paulo",
    "Ελληνικά κείμενα, русский текст, українська мова, ქართული",
    "Version 3.14159, 1e-9, -0.5, +42, 0x1F, 0b1010, 1_000_000, 2^64",
]

CODE = [
    "#include <stdio.h>\nint main(void)\n{\n    printf(\"%d\\n\", 42);\n"
    "    return 0;\n}\n",
    "def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, "
    "a + b\n    return a\n\n\nprint([fib(i) for i in range(10)])\n",
    "fn main() {\n\tlet v: Vec<u32> = (0..10).map(|x| x * x).collect();\n\t"
    "println!(\"{:?}\", v);\n}\n",
    "const f = async (x) => { await fetch(`/api/${x}`); return x ?? null; };",
    "SELECT id, name FROM users WHERE age >= 18 AND name LIKE 'A%' "
    "ORDER BY id DESC;",
    "<html>\r\n  <body class=\"main\">\r\n    <p>Hi &amp; bye</p>\r\n"
    "  </body>\r\n</html>\r\n",
    "{\"key\": [1, 2.5, true, null], \"nested\": {\"a\": \"b\"}}",
    "#!/bin/sh\nfor f in *.txt; do\n  wc -l \"$f\" | awk '{print $1}'\n"
    "done 2>&1 >/dev/null\n",
    "main :: IO ()\nmain = mapM_ print $ takeWhile (< 100) $ map (^2) [1..]",
    "    if (x->y != NULL && *p++ == '\\0') { /* comment */ }\t\t// end",
    "\tindented\twith\ttabs\n\t\tand more\n",
]

SCRIPTS = [
    "中文分词测试：我们今天去公园散步，天气很好。",
    "日本語のテキスト、ひらがなとカタカナと漢字。東京都",
    "한국어 텍스트입니다. 안녕하세요!",
    "مَرْحَبًا بِكُمْ فِي الْعَالَمِ الْعَرَبِيِّ",
    "नमस्ते दुनिया! हिन्दी में लिखा गया पाठ। क्षत्रिय",
    "ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ",
    "שָׁלוֹם עוֹלָם",
    "Tiếng Việt có nhiều dấu: ệ ở ữ ặ",
    "ᚠᛇᚻ᛫ᛒᛦᚦ ꦧꦱꦗꦮ 𓀀𓀁 𐌰𐌱𐌲 ∀x∈ℝ: x²≥0 ∑∫∂",
    "Ｆｕｌｌｗｉｄｔｈ　ｔｅｘｔ　１２３ and ١٢٣٤ and ०१२३",
]

EMOJI = [
    "I love 🍕 and 🍣! 😀😃😄",
    "Family: 👨‍👩‍👧‍👦 couple: 👩‍❤️‍👨 flags: 🇯🇵🇺🇸🇩🇪 tone: 👍🏽👋🏿",
    "keycaps 1️⃣2️⃣#️⃣ and ☺︎ vs ☺️ and 🏳️‍🌈 🧑🏻‍💻",
    "emoji at end 🎉",
]

WHITESPACE = [
    "a" + " " * 50 + "b", " " * 200, "\t" * 30 + "x", "x\r\ny\r\n\r\nz",
    "line1\rline2\r\rline3", "\n" * 20, "a \n \n b", " \u00a0 \u3000 x",
    "x\u2028y\u2029z", "a\x85b \x85 c", "a\u180eb", "a\x0bb\x0cc",
    "   \n\t  \r\n   end", "tab\t\t then spaces    \t\n",
    "a\u200bb\u200cc\u200dd\ufeffe", "x\u1680y\u2009z\u202fw",
]

SPECIAL_TEXT = [
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
    "<think>\nLet me think.\n</think>\n\nThe answer is 4.<|im_end|>",
    "<|im_start|><|im_end|><|endoftext|><|endoftext|>",
    "partial <|im_sta and <|im_end| and <|im_end|>>",
    "<<|im_end|>> x<|im_end|>y  <|im_end|>  ",
    "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>",
    "text<|endoftext|>more text<|fim_prefix|>code<|fim_middle|>",
    "<|IM_START|> <|im start|> < |im_end| >",
]

NORMALIZATION = [
    "caf\u00e9 vs cafe\u0301", "\u00c5 vs A\u030a vs \u212b",
    "\u1100\u1161\u11a8 vs \uac01", "a\u0316\u0301 vs a\u0301\u0316",
    "\u1ec7 vs e\u0323\u0302 vs e\u0302\u0323", "\ufb01 ligature \u2126",
    "x\u0898\u0316 x\u0316\u0898", "\U00011935\U00011930 \U00011938",
    "\u0958 \u0915\u093c", "\u00e9\u0301\u0327",
    "q\u0307\u0323 \u1e0b\u0323",
]

UNICODE_EDGES = [
    "\u1c89abc A\ua7cbb \U00031350\U00031351 \U0002ebf0",
    "'\u017f '\u212a x'\u017f", "\u2060\u2061 \U000e0001\U000e0020",
    "\ue000\uf8ff \U000f0000", "\ufffd\ufffe\uffff", "\x00\x01\x1f\x7f",
    "\u0345\u0300a", "\U0001f9d1\u200d\U0001f91d\u200d\U0001f9d1",
]

MALFORMED = [
    b"\xff", b"abc\x80def", b"\xe4\xb8", b"\xe4\xb8\xad\xe4", b"\xed\xa0\x80",
    b"\xf4\x90\x80\x80", b"\xc0\xaf", b"\xe0\x80\x80", b"\xf0\x9f\x98",
    b"\xf8\x88\x80\x80\x80", b"<|im_\xffend|>", b"a\xc3", b"\xc3\x28",
    b"\xe2\x28\xa1", b"\xf0\x28\x8c\xbc", b"\x80\x80\x80", b"\xfe\xfe\xff\xff",
    b"ok \xf0\x9f\x98\x80 \xf0\x9f\x98 ok", b"\xef\xbb\xbfBOM",
]


def random_items(rng, n):
    pools = [
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
        "0123456789", " \t\n\r", "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~",
        "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年",
        "αβγδεζηθλμπρστφχψωабвгдежзиклмнопрст",
        "\u0301\u0308\u0323\u093f\u094d\u064e\u0651\u05b8\u0e31",
        "😀🍕👍🏽\u200d❤️🇯🇵", "\u00a0\u3000\u2028\x85\u200b",
    ]
    words = ["the", " the", "token", "izer", "'s", "'LL", "http", "://",
             "\n\n", "    ", "12345", "3.14", "über", "naïve"] + SPECIALS
    out = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(1, 40)):
            if rng.random() < 0.3:
                parts.append(rng.choice(words))
            else:
                pool = rng.choice(pools)
                parts.append("".join(rng.choice(pool)
                                     for _ in range(rng.randint(1, 8))))
        out.append("".join(parts))
    return out


def random_bytes(rng, n):
    out = []
    for _ in range(n):
        b = bytearray()
        for _ in range(rng.randint(1, 30)):
            r = rng.random()
            if r < 0.4:
                b += bytes(rng.randint(0, 255) for _ in range(rng.randint(1, 3)))
            elif r < 0.7:
                b += rng.choice(["a", " ", "中", "é", "😀", "<|im_end|>"]
                                ).encode()
            else:  # a valid sequence cut short or with a bad tail
                full = chr(rng.choice([0xe9, 0x4e2d, 0x1f600, 0x10ffff])
                           ).encode()
                b += full[:rng.randint(1, len(full))]
        out.append(bytes(b))
    return out


def sweep_items(lo, hi, step):
    """Every step-th code point of [lo, hi) (surrogates left out) in
    contexts that exercise the regex classes and NFC: letter, digit, space,
    apostrophe and newline neighbours."""
    out = []
    cps = [c for c in range(lo, hi, step) if not 0xD800 <= c < 0xE000]
    for i in range(0, len(cps), 4096):
        out.append("".join("a%sb %s%s1'%s\n" % (chr(c), chr(c), chr(c), chr(c))
                           for c in cps[i:i + 4096]))
    return out


def build_corpus():
    rng = random.Random(20240611)
    groups = [
        ("prose", PROSE), ("code", CODE), ("scripts", SCRIPTS),
        ("emoji", EMOJI), ("whitespace", WHITESPACE),
        ("special tokens", SPECIAL_TEXT), ("normalization", NORMALIZATION),
        ("unicode edges", UNICODE_EDGES), ("malformed utf-8", MALFORMED),
        ("random text", random_items(rng, 250)),
        ("random bytes", random_bytes(rng, 60)),
        ("long runs", ["a" * 20000, " " * 20000 + "x", "\n" * 5000,
                       "1234567890" * 500, "ab " * 5000, "\U0001f600" * 3000,
                       "中" * 5000, "\u0301" * 3000, "<|im_end|>" * 500,
                       " \t\n" * 3000]),
        ("code points U+0000..U+FFFF", sweep_items(0, 0x10000, 1)),
        ("code points U+10000..U+3FFFF, every 13th",
         sweep_items(0x10000, 0x40000, 13)),
        ("code points U+40000..U+10FFFF, every 257th",
         sweep_items(0x40000, 0x110000, 257)),
    ]
    mixed = []
    for g in ("prose", "code", "scripts", "emoji", "special tokens"):
        items = dict(groups)[g]
        mixed.append("\n".join(items))
    groups.append(("concatenations", mixed))
    return groups


# ---------------------------------------------------------------------------
# Running both sides


def as_text(item):
    if isinstance(item, bytes):
        return item.decode("utf-8", errors="replace")
    return item


def as_bytes(item):
    if isinstance(item, bytes):
        return item
    return item.encode("utf-8")


def run_ours(binary, tokenizer_json, items):
    with tempfile.NamedTemporaryFile(prefix="hypic-parity-", delete=False) \
            as f:
        for it in items:
            b = as_bytes(it)
            f.write(b"%d\n" % len(b) + b + b"\n")
        path = f.name
    try:
        t0 = time.time()
        p = subprocess.run([binary, "tokenize", "--model", tokenizer_json,
                            "--batch", path, "--time"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=120)
        dt = time.time() - t0
    finally:
        os.unlink(path)
    if p.returncode != 0:
        return None, p.stderr.decode(errors="replace"), dt
    lines = p.stdout.decode().split("\n")
    if len(lines) != len(items) + 1 or lines[-1] != "":
        return None, "expected %d lines of ids, got %d" % (
            len(items), len(lines) - 1), dt
    ids = [[int(x) for x in ln.split()] for ln in lines[:-1]]
    return ids, p.stderr.decode(errors="replace"), dt


def run_our_decode(binary, tokenizer_json, seqs):
    with tempfile.NamedTemporaryFile("w", prefix="hypic-parity-",
                                     delete=False) as f:
        for s in seqs:
            f.write(" ".join(map(str, s)) + "\n")
        path = f.name
    try:
        p = subprocess.run([binary, "tokenize", "--model", tokenizer_json,
                            "--decode-batch", path],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=120)
    finally:
        os.unlink(path)
    if p.returncode != 0:
        return None, p.stderr.decode(errors="replace")
    out, i = [], 0
    data = p.stdout
    while i < len(data):
        nl = data.index(b"\n", i)
        n = int(data[i:nl])
        out.append(data[nl + 1:nl + 1 + n])
        i = nl + 2 + n
    return out, ""


def first_diff(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def show(item, limit=60):
    r = repr(item)
    return r if len(r) <= limit else r[:limit] + "..."


def compare_group(tap, name, items, ours, hf_ids):
    bad = [i for i in range(len(items)) if ours[i] != hf_ids[i]]
    ntok = sum(len(x) for x in hf_ids)
    if not tap.ok(not bad, "encode %s: %d items, %d tokens agree"
                  % (name, len(items), ntok) if not bad else
                  "encode %s: %d of %d items differ" % (name, len(bad),
                                                        len(items))):
        for i in bad[:5]:
            d = first_diff(ours[i], hf_ids[i])
            tap.diag("item %d %s: first difference at token %d: ours %s, "
                     "HF %s" % (i, show(items[i]), d, ours[i][d:d + 6],
                                hf_ids[i][d:d + 6]))
    return len(bad)


def variant_tokenizer(src, dst):
    """The Qwen3 file with other options: extra added tokens using lstrip,
    rstrip, single_word and normalized, an NFKC normaliser and the plain
    ByteLevel pre-tokenizer (GPT-2 regex, prefix space)."""
    import json
    with open(src, encoding="utf-8") as f:
        d = json.load(f)
    base = max(t["id"] for t in d["added_tokens"]) + 1
    extra = [
        ("<mask>", dict(lstrip=True)), ("[R]", dict(rstrip=True)),
        ("<both>", dict(lstrip=True, rstrip=True)),
        ("word", dict(single_word=True, special=False)),
        ("fix", dict(normalized=True, special=False)),
    ]
    for i, (content, opts) in enumerate(extra):
        t = dict(id=base + i, content=content, single_word=False,
                 lstrip=False, rstrip=False, normalized=False, special=True)
        t.update(opts)
        d["added_tokens"].append(t)
    d["normalizer"] = {"type": "NFKC"}
    d["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": True,
                          "trim_offsets": True, "use_regex": True}
    with open(dst, "w", encoding="utf-8") as f:
        json.dump(d, f, ensure_ascii=False)


VARIANT_TEXT = [
    "a <mask> b", "a<mask>b", "x   <mask>   y", "<mask><mask>  <mask>",
    "[R]   z", "q [R]\n\n r", "<both>", "  <both>  <both>  ", "word",
    "a word b", "awordb", "words word_ word1 (word)", "\u00e9word wordé",
    "\ufb01x fix ﬁxed prefix", "Hello world", "<|im_start|>user\nhi",
    "  two  spaces", "\u2460\u2461 \u3392 \uff21",
]


def main():
    tap = Tap()
    shared = os.environ.get("HYPIC_SHARED", os.path.join(ROOT, "..",
                                                         "shared"))
    tokenizer_json = os.environ.get(
        "HYPIC_PARITY_TOKENIZER",
        os.path.join(shared, "data", "qwen3-tokenizer", "tokenizer.json"))
    if not os.path.exists(tokenizer_json):
        skip_all("no tokenizer.json at %s" % tokenizer_json)
    if not import_tokenizers():
        skip_all("HF tokenizers is not installed and pip could not get it")
    from tokenizers import Tokenizer
    build = os.environ.get("HYPIC_BUILD", os.path.join(ROOT, "build"))
    binary = os.path.join(build, "hypic-engine")
    if not os.access(binary, os.X_OK):
        print("Bail out! no executable %s (make engine first)" % binary)
        return 1

    hf = Tokenizer.from_file(tokenizer_json)
    groups = build_corpus()
    items = [it for _, g in groups for it in g]
    t0 = time.time()
    hf_ids = [e.ids for e in hf.encode_batch(
        [as_text(it) for it in items], add_special_tokens=False)]
    hf_dt = time.time() - t0
    ours, msg, dt = run_ours(binary, tokenizer_json, items)
    if ours is None:
        tap.ok(False, "hypic-engine tokenize --batch runs")
        tap.diag(msg)
        return tap.done()
    total_bytes = sum(len(as_bytes(it)) for it in items)
    tap.diag("%d items, %.1f MB; HF encode_batch %.2f s, ours (one "
             "process, load included) %.2f s" % (len(items), total_bytes / 1e6,
                                                  hf_dt, dt))
    for line in msg.strip().splitlines():
        tap.diag("ours: " + line)
    k = 0
    mismatches = 0
    for name, g in groups:
        mismatches += compare_group(tap, name, g, ours[k:k + len(g)],
                                    hf_ids[k:k + len(g)])
        k += len(g)

    # decode: the round trip of every item, and random id sequences
    rng = random.Random(7)
    n_ids = hf.get_vocab_size(with_added_tokens=True)
    seqs = [ids for ids in hf_ids if len(ids) < 20000]
    seqs += [[rng.randrange(n_ids) for _ in range(rng.randint(1, 12))]
             for _ in range(300)]
    dec, msg = run_our_decode(binary, tokenizer_json, seqs)
    if dec is None:
        tap.ok(False, "hypic-engine tokenize --decode-batch runs")
        tap.diag(msg)
    else:
        want = [hf.decode(s, skip_special_tokens=False).encode("utf-8")
                for s in seqs]
        bad = [i for i in range(len(seqs)) if dec[i] != want[i]]
        if not tap.ok(not bad and len(dec) == len(seqs),
                      "decode: %d id sequences agree with HF decode"
                      % len(seqs)):
            for i in bad[:5]:
                tap.diag("sequence %s: ours %s, HF %s" % (
                    show(seqs[i]), show(dec[i]), show(want[i])))
        mismatches += len(bad)

    # another configuration of the same vocabulary
    with tempfile.TemporaryDirectory(prefix="hypic-parity-") as d:
        vpath = os.path.join(d, "tokenizer.json")
        variant_tokenizer(tokenizer_json, vpath)
        hv = Tokenizer.from_file(vpath)
        vitems = VARIANT_TEXT + PROSE + SPECIAL_TEXT + SCRIPTS + \
            NORMALIZATION + random_items(random.Random(99), 60)
        want = [e.ids for e in hv.encode_batch(vitems,
                                               add_special_tokens=False)]
        got, msg, _ = run_ours(binary, vpath, vitems)
        if got is None:
            tap.ok(False, "variant tokenizer loads and encodes")
            tap.diag(msg)
        else:
            mismatches += compare_group(
                tap, "variant (lstrip/rstrip/single_word/normalized added "
                "tokens, NFKC, ByteLevel regex + prefix space)", vitems, got,
                want)
    tap.diag("total mismatching items: %d" % mismatches)
    return tap.done()


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--gen-unicode":
        gen_unicode(sys.argv[2])
        sys.exit(0)
    sys.exit(main())
