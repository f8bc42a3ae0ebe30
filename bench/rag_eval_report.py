#!/usr/bin/env python3
"""Tables and plots from bench/rag_eval rows (issue 8).

    python3 bench/rag_eval_report.py rows.tsv bench/results/

Writes OUT/summary.md (per mode; pic per seam; per document count) and
OUT/accuracy_ttft.png, OUT/seam_sweep.png, OUT/docs_sweep.png.
"""
import csv
import os
import statistics
import sys
from collections import defaultdict


def load(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f, delimiter="\t"))


def agreement(rows, full):
    """% of rows whose greedy answer is the full-attention answer of the same
    example: fidelity to the exact computation, whatever the model's skill."""
    same = [r["prediction"] == full[r["id"]] for r in rows if r["id"] in full]
    return 100 * statistics.mean(same) if same else float("nan")


def kept(rows, full_em):
    """% of the examples full answers correctly that this mode also answers
    correctly: the answers an approximation loses, apart from the ones it gets
    right by luck (which exact match alone nets against them)."""
    k = [int(r["em"]) for r in rows if full_em.get(r["id"]) == "1"]
    return 100 * statistics.mean(k) if k else float("nan")


def docs_table(title, by, order, docs, metric, key=lambda r: int(r["n_docs"]), label="document count"):
    """Markdown rows: metric (a %) per mode and value of key(row)."""
    lines = ["", f"{title} % by {label}:", "",
             "| mode | " + " | ".join(str(d) for d in docs) + " |",
             "|---|" + "---|" * len(docs)]
    for k in order:
        cells = []
        for d in docs:
            sub = [r for r in by[k] if key(r) == d]
            cells.append(f"{metric(sub):.0f}" if sub else "-")
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    return lines


def agg(rows):
    em = 100 * statistics.mean(int(r["em"]) for r in rows)
    f1 = 100 * statistics.mean(float(r["f1"]) for r in rows)
    ttft = statistics.median(float(r["ttft_ms"]) for r in rows)
    rec = statistics.mean(int(r["recomputed"]) for r in rows)
    return em, f1, ttft, rec, len(rows)


def main():
    rows, out = load(sys.argv[1]), sys.argv[2]
    os.makedirs(out, exist_ok=True)
    by = defaultdict(list)
    for r in rows:
        label = r["mode"] if r["mode"] != "pic" else f"pic w={r['seam']}"
        by[label].append(r)
    order = sorted(by, key=lambda k: (k.startswith("pic"), k.startswith("naive"),
                                      int(k.split("=")[1]) if "=" in k else 0, k))
    full = {r["id"]: r["prediction"] for r in by.get("full", [])}
    full_em = {r["id"]: r["em"] for r in by.get("full", [])}
    lines = ["| mode | exact match % | token F1 % | same answer as full % | full's correct kept % | TTFT p50 ms "
             "| recomputed tokens | n |",
             "|---|---|---|---|---|---|---|---|"]
    for k in order:
        em, f1, t, rec, n = agg(by[k])
        lines.append(f"| {k} | {em:.1f} | {f1:.1f} | {agreement(by[k], full):.1f} | {kept(by[k], full_em):.1f} "
                     f"| {t:.1f} | {rec:.0f} | {n} |")
    docs = sorted({int(r["n_docs"]) for r in rows})
    lines += docs_table("Exact match", by, order, docs, lambda sub: agg(sub)[0])
    lines += docs_table("Same answer as full", by, order, docs, lambda sub: agreement(sub, full))
    qtypes = sorted({r["qtype"] for r in rows})
    lines += docs_table("Exact match", by, order, qtypes, lambda sub: agg(sub)[0], lambda r: r["qtype"],
                       "question type")
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: tables only")
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for k in order:
        em, _, t, _, _ = agg(by[k])
        ax.scatter(t, em)
        ax.annotate(k, (t, em), textcoords="offset points", xytext=(4, 4))
    ax.set_xlabel("TTFT p50 (ms)")
    ax.set_ylabel("exact match (%)")
    ax.set_title("Accuracy vs TTFT per mode")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "accuracy_ttft.png"), dpi=120)
    pics = [k for k in order if k.startswith("pic")]
    if len(pics) > 1:
        fig, ax = plt.subplots(figsize=(6, 4))
        ws = [int(k.split("=")[1]) for k in pics]
        ax.plot(ws, [agg(by[k])[0] for k in pics], marker="o", label="pic: exact match")
        for ref in ("full", "naive"):
            if ref in by:
                ax.axhline(agg(by[ref])[0], linestyle="--", label=f"{ref}: exact match",
                           color="gray" if ref == "full" else "red")
        ax.plot(ws, [agreement(by[k], full) for k in pics], marker="s", label="pic: same answer as full")
        if "naive" in by:
            ax.axhline(agreement(by["naive"], full), linestyle=":", color="red", label="naive: same answer as full")
        ax.set_xlabel("seam width w")
        ax.set_ylabel("%")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(os.path.join(out, "seam_sweep.png"), dpi=120)
    fig, ax = plt.subplots(figsize=(6, 4))
    for k in order:
        pts = [(d, agg([r for r in by[k] if int(r["n_docs"]) == d])[0])
               for d in docs if any(int(r["n_docs"]) == d for r in by[k])]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".", label=k)
    ax.set_xlabel("documents per prompt")
    ax.set_ylabel("exact match (%)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "docs_sweep.png"), dpi=120)


if __name__ == "__main__":
    main()
