"""hflib.py - shared helpers of tools/gen_model.py and tools/make_golden.py.

numpy-only safetensors reading/writing (F32, BF16, F16, I32, I64), the GPT-2
byte-to-unicode map, the Qwen pre-tokenizer regexes and a small byte-level
BPE trainer that produces a Qwen-style tokenizer.json. No transformers here.
"""

import collections
import json
import struct

import numpy as np

# Qwen2 / Qwen3 / Qwen3-Next split regex (tokenizer.json Split pattern).
QWEN2_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Qwen3.5 adds combining marks (\p{M}) to letter runs.
QWEN35_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pic_sep|>"]

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content']"
    " + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Training text of the toy BPE: a little English and a little code, so that
# common words and code punctuation get merges.
CORPUS = """\
The quick brown fox jumps over the lazy dog. The dog was not amused, and the
fox ran back into the forest before the farmer could see what had happened.
In the morning the farmer walked to the market with his daughter. They sold
apples, pears and a basket of fresh eggs, and they came home before it rained.
A language model reads a sequence of tokens and predicts the next one. The
state of a linear attention layer is a matrix that is updated at every step:
it decays, it is corrected by the delta rule, and it is read by the query.
Full attention layers keep every key and value, so their cache grows with the
length of the prompt, while the recurrent state has a fixed size.
When a document is shared by many requests, its cache can be reused: the
server computes it once and combines it with the rest of the prompt.
Please answer the question using the documents above. If the answer is not in
the documents, say that you do not know. Thank you for your help!
What is the capital of France? The capital of France is Paris.
How many days are there in a week? There are seven days in a week.

def softmax(x):
    m = max(x)
    e = [math.exp(v - m) for v in x]
    s = sum(e)
    return [v / s for v in e]

for (int i = 0; i < n; i++) {
    sum += a[i] * b[i];
}
if (err != NULL) {
    return -1;
}

class Tokenizer:
    def __init__(self, vocab, merges):
        self.vocab = vocab
        self.merges = merges

    def encode(self, text):
        return [self.vocab[t] for t in self.split(text)]

int main(int argc, char **argv)
{
    printf("hello, world\\n");
    return 0;
}
The numbers 1, 2, 3 and 42 are written digit by digit: 2024, 3.14159, 1e-6.
Once upon a time there was a little town by the sea. Every evening the people
of the town came down to the harbour to watch the boats return, and the
children counted them one by one. The old captain told stories of storms and
of islands where the trees were taller than the houses, and nobody could tell
which of his stories were true and which were made up for the children.
The weather today is sunny with a light wind from the west. Tomorrow there
will be clouds in the morning and rain in the afternoon, so take an umbrella
when you go to work, and remember that the trains may be late.
To install the package, run the following command and then restart the
server. The configuration file is read at start-up; every option has a
default value, and the documentation explains what each of them does.

    let total = items.iter().map(|x| x.price * x.count).sum::<u64>();
    const result = await fetch(url, { method: "POST", body: JSON.stringify(data) });
    SELECT name, count(*) FROM users WHERE active = 1 GROUP BY name;
    return self.weight * (1.0 + self.bias)
"""


def bytes_to_unicode():
    """GPT-2 byte -> printable unicode char map, in the vocab id order."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("\xa1"), ord("\xac") + 1))
        + list(range(ord("\xae"), ord("\xff") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return list(zip(bs, [chr(c) for c in cs]))


def train_bpe(text, n_merges, pattern):
    """Byte-level BPE: returns (vocab {token: id}, merges [(a, b)]).

    Ids 0..255 are the byte tokens in GPT-2 order, then one id per merge.
    Ties between equally frequent pairs go to the smallest pair, so the
    result is deterministic.
    """
    import regex

    b2u = dict(bytes_to_unicode())
    words = collections.Counter(
        tuple(b2u[b] for b in piece.encode("utf-8"))
        for piece in regex.findall(pattern, text)
    )
    vocab = {ch: i for i, (_, ch) in enumerate(bytes_to_unicode())}
    merges = []
    words = dict(words)
    for _ in range(n_merges):
        pairs = collections.Counter()
        for w, c in words.items():
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] += c
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        if pairs[best] < 2:
            break
        merged = best[0] + best[1]
        merges.append(best)
        vocab[merged] = len(vocab)
        nw = {}
        for w, c in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(merged)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            nw[tuple(out)] = nw.get(tuple(out), 0) + c
        words = nw
    return vocab, merges


def tokenizer_json(vocab, merges, pattern, merges_as_pairs=True):
    """A Qwen-style tokenizer.json dict; special tokens follow the vocab."""
    added = []
    for i, tok in enumerate(SPECIAL_TOKENS):
        added.append(
            {
                "id": len(vocab) + i,
                "content": tok,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
        )
    bl = {"add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {
                    "type": "Split",
                    "pattern": {"Regex": pattern},
                    "behavior": "Isolated",
                    "invert": False,
                },
                dict(type="ByteLevel", **bl),
            ],
        },
        "post_processor": dict(type="ByteLevel", **bl),
        "decoder": dict(type="ByteLevel", **bl),
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": "",
            "end_of_word_suffix": "",
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": [list(m) if merges_as_pairs else " ".join(m) for m in merges],
        },
    }


# ---- safetensors (numpy) ----

_DT = {
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
    "I32": np.dtype("<i4"),
    "I64": np.dtype("<i8"),
    "F64": np.dtype("<f8"),
}


# Elements per piece of the array helpers below: pieces run on a thread
# pool (numpy releases the GIL inside ufuncs and the generators' fills).
PIECE = 1 << 22


def pieces(n, fn):
    """Calls fn(slice) over [0, n) in PIECE-sized slices, on threads."""
    import concurrent.futures
    import os

    sl = [slice(i, min(i + PIECE, n)) for i in range(0, n, PIECE)]
    if len(sl) <= 1:
        for s in sl:
            fn(s)
        return
    with concurrent.futures.ThreadPoolExecutor(min(len(sl), os.cpu_count() or 1)) as ex:
        list(ex.map(fn, sl))


def f32_to_bf16_bits(x):
    """Round-to-nearest-even f32 -> bf16, as uint16 bit patterns (a NaN
    stays a quiet NaN of the same sign)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    out = np.empty(u.shape, np.uint16)
    uf, of = u.reshape(-1), out.reshape(-1)

    def part(s):
        a = uf[s]
        t = a >> 16
        t &= 1
        t += 0x7FFF
        t += a  # wraps in uint32 as the rounding expects
        t >>= 16
        nan = (a & 0x7FFFFFFF) > 0x7F800000
        if nan.any():
            t[nan] = (a[nan] >> 16) | 0x40
        of[s] = t

    pieces(uf.size, part)
    return out


def bf16_bits_to_f32(b):
    return (b.astype(np.uint32) << 16).view(np.float32)


def write_safetensors(path, tensors, metadata=None):
    """tensors: list of (name, dtype, array). BF16 arrays are given as f32 and
    rounded here. Header padded with spaces to a multiple of 8. Written one
    tensor at a time (a checkpoint of several GB is never held twice)."""
    header, off = {}, 0
    if metadata:
        header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    for name, dt, arr in tensors:
        shape = list(np.shape(arr))
        size = int(np.prod(shape, dtype=np.int64)) * (2 if dt == "BF16" else _DT[dt].itemsize)
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + size]}
        off += size
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for name, dt, arr in tensors:
            arr = np.asarray(arr)
            if dt == "BF16":
                raw = f32_to_bf16_bits(arr.astype(np.float32, copy=False))
            else:
                raw = np.ascontiguousarray(arr, dtype=_DT[dt])
            f.write(memoryview(raw.reshape(-1)).cast("B"))


def read_safetensors(path):
    """Returns ({name: np.ndarray}, metadata). BF16 comes back as f32."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    meta = header.pop("__metadata__", {})
    out = {}
    for name, e in header.items():
        b, en = e["data_offsets"]
        raw = np.frombuffer(data[8 + n + b : 8 + n + en], dtype=_DT[e["dtype"]])
        if e["dtype"] == "BF16":
            raw = bf16_bits_to_f32(raw)
        out[name] = raw.reshape(e["shape"]).copy()
    return out, meta
