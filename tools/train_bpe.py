#!/usr/bin/env python3
"""train_bpe.py - train a byte-level BPE on the rag_data corpus and write a
Qwen-style tokenizer.json (the format of tools/gen_model.py: NFC, Split with
the Qwen3.5 regex Isolated + ByteLevel use_regex false, ByteLevel decoder,
merges as pairs; special tokens <|endoftext|> <|im_start|> <|im_end|>
<|pic_sep|> after the learned vocab).

Our own trainer: pre-tokens are counted per segment (the engine tokenizes
every <|pic_sep|>-separated segment on its own), then the most frequent
adjacent pair is merged repeatedly, with incremental pair counts. Ties go to
the smallest pair, so the result is deterministic. The Qwen regex splits
numbers into single digits (\\p{N}), so digits never merge.

    tools/train_bpe.py --data tools/train/data/train.jsonl --vocab 768 \\
        --out models/default/tokenizer.json
"""

import argparse
import collections
import json
import os
import sys

import regex

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hflib  # noqa: E402


def count_pretokens(texts, pattern):
    b2u = dict(hflib.bytes_to_unicode())
    pat = regex.compile(pattern)
    words = collections.Counter()
    for t in texts:
        for piece in pat.findall(t):
            words[tuple(b2u[b] for b in piece.encode("utf-8"))] += 1
    return words


def train(words, n_merges):
    """words: Counter {tuple of symbols: count} -> (vocab, merges)."""
    vocab = {ch: i for i, (_, ch) in enumerate(hflib.bytes_to_unicode())}
    words = [(list(w), c) for w, c in words.items()]
    pairs = collections.Counter()
    where = collections.defaultdict(set)  # pair -> word indexes holding it
    for i, (w, c) in enumerate(words):
        for p in zip(w, w[1:]):
            pairs[p] += c
            where[p].add(i)
    merges = []
    for _ in range(n_merges):
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        if pairs[best] < 2:
            break
        merged = best[0] + best[1]
        merges.append(best)
        vocab[merged] = len(vocab)
        for i in list(where.get(best, ())):
            w, c = words[i]
            for p in zip(w, w[1:]):
                pairs[p] -= c
                if pairs[p] <= 0:
                    del pairs[p]
                where[p].discard(i)
            out, j = [], 0
            while j < len(w):
                if j + 1 < len(w) and (w[j], w[j + 1]) == best:
                    out.append(merged)
                    j += 2
                else:
                    out.append(w[j])
                    j += 1
            words[i] = (out, c)
            for p in zip(out, out[1:]):
                pairs[p] += c
                where[p].add(i)
        where.pop(best, None)
    return vocab, merges


def corpus_texts(path, limit):
    texts = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f):
            if limit and n >= limit:
                break
            r = json.loads(line)
            texts += r["segments"]
            texts.append(" " + r["answer"])
    return texts


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True, help="rag_data JSONL (train split)")
    p.add_argument("--limit", type=int, default=0, help="use the first N records (0 = all)")
    p.add_argument("--vocab", type=int, default=768, help="total tokens incl. 256 bytes and 4 specials")
    p.add_argument("--out", required=True, help="tokenizer.json path")
    args = p.parse_args(argv)

    n_merges = args.vocab - 256 - len(hflib.SPECIAL_TOKENS)
    words = count_pretokens(corpus_texts(args.data, args.limit), hflib.QWEN35_REGEX)
    vocab, merges = train(words, n_merges)
    tok = hflib.tokenizer_json(vocab, merges, hflib.QWEN35_REGEX, merges_as_pairs=True)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(tok, f, indent=2, ensure_ascii=False)
        f.write("\n")

    from tokenizers import Tokenizer

    t = Tokenizer.from_file(args.out)
    sample = "Hello, world! <|im_start|>user\nThe capital of Zorvia is Quellam. 4812<|pic_sep|><|im_end|>"
    if t.decode(t.encode(sample).ids, skip_special_tokens=False) != sample:
        sys.exit("train_bpe: tokenizer does not round-trip")
    n_tok = t.get_vocab_size(with_added_tokens=True)
    texts = corpus_texts(args.data, 200)
    n_chars = sum(len(x) for x in texts)
    n_ids = sum(len(t.encode(x).ids) for x in texts)
    print(f"{args.out}: {len(merges)} merges, {n_tok} tokens, {n_chars / n_ids:.2f} chars/token")


if __name__ == "__main__":
    main()
