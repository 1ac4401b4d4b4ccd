#!/usr/bin/env python3
"""The table of tools/bench_peers.sh: reads its labelled JSON lines and prints Markdown.

    python3 tools/bench_peers_table.py RESULTS.jsonl "CPU model" "flags" "load average"

Each line is {"row", "label", "side": "ours"|"peer", "result": <one benchmark's JSON line>}.
Throughput rows (generate, train) use tokens/s, higher is better; the GRPO step uses seconds
per step, lower is better. A cell is the median over rounds of each run's median, with the
min-max of those medians; each oxalign cell is divided by each peer of its row (so > 1 means
oxalign is faster) using the medians. Rows whose benchmark reports them also show the
achieved GFLOP/s beside the GEMM peak that side measured in the same process, and the peak
RSS (median over rounds) with each oxalign cell's ratio to each peer's.
"""
import json
import statistics
import sys


def peak_name(res):
    """Which GEMM a result's peak is: bf16 or f32 (ours name it; PyTorch's names a dtype)."""
    named = str(res.get("peak_precision") or res.get("precision") or "")
    matmul = res.get("matmul") or {}
    named += " " + str(matmul.get("precision") or matmul.get("dtype") or "")
    return "bf16" if "bf16" in named or "bfloat16" in named else "f32"


def metric(result):
    """(value, higher_is_better) of one benchmark line."""
    if "tokens_per_sec" in result:
        v = result["tokens_per_sec"]
        return (v["median"] if isinstance(v, dict) else v), True
    return result["step_seconds"]["median"], False


def main():
    path, model, flags, load = sys.argv[1:5]
    cells = {}
    for line in open(path):
        r = json.loads(line)
        value, higher = metric(r["result"])
        cell = cells.setdefault((r["row"], r["label"]), {"side": r["side"], "higher": higher, "v": []})
        cell["v"].append(value)
        res = r["result"]
        if "achieved_gflops" in res and res.get("peak_gflops"):
            cell.setdefault("gflops", []).append((res["achieved_gflops"], res["peak_gflops"]))
            cell["peak_of"] = peak_name(res)
        if res.get("peak_rss_bytes"):
            cell.setdefault("rss", []).append(res["peak_rss_bytes"])
    print(f"CPU: {model}; flags: {flags}; load average at the end: {load}\n")
    print("| workload | side | median | min-max over rounds | against each peer | peak RSS |")
    print("|---|---|---|---|---|---|")
    rows = []
    for (row, _label) in cells:
        if row not in rows:
            rows.append(row)
    for row in rows:
        here = [(label, c) for (r, label), c in cells.items() if r == row]
        peers = [(label, statistics.median(c["v"])) for label, c in here if c["side"] == "peer"]
        peer_rss = [(label, statistics.median(c["rss"])) for label, c in here
                    if c["side"] == "peer" and c.get("rss")]
        for label, c in here:
            med = statistics.median(c["v"])
            unit = "tok/s" if c["higher"] else "s/step"
            spread = f"{min(c['v']):.4g}-{max(c['v']):.4g}"
            ratios = ""
            if c.get("gflops"):
                achieved = statistics.median(g for g, _ in c["gflops"])
                peak = statistics.median(p for _, p in c["gflops"])
                label = f"{label} ({achieved:.0f} of {peak:.0f} GFLOP/s {c['peak_of']} peak)"
            if c["side"] == "ours":
                ratios = ", ".join(
                    f"{(med / p if c['higher'] else p / med):.2f}x {name}" for name, p in peers
                )
            rss = ""
            if c.get("rss"):
                mine = statistics.median(c["rss"])
                rss = f"{mine / 1e9:.2f} GB"
                if c["side"] == "ours" and peer_rss:
                    rss += " (" + ", ".join(f"{mine / r:.2f}x {n}" for n, r in peer_rss) + ")"
            print(f"| {row} | {label} | {med:.4g} {unit} | {spread} | {ratios} | {rss} |")


if __name__ == "__main__":
    main()
