"""packed-step's report: summary.md's tables, and the results table's rows."""

from __future__ import annotations

from typing import Any

from loadtest.packed_step import FRESH_MODES, GRAPHS, SETS
from loadtest.results_table import ResultRow, RunContext

PEER_GRAPHS = {"padded": "padded", "torch_sdpa_padded": "torch-sdpa-padded",
               "torch_packed_varlen": "torch-packed-varlen"}  # graph -> its name as the table's peer


def summarize(record: dict[str, Any]) -> list[str]:
    """summary.md's lines below its name and machine."""
    ort_graphs = record["onnxruntime"]["graphs"]
    lines = [f"- onnxruntime {record['onnxruntime']['onnxruntime']} {record['onnxruntime']['providers']}; "
             f"torch {record['torch'].get('torch')}; bert shape `{record['shape']}`; {record['texts']} corpus texts; "
             f"median of {record['rounds']} runs per batch", "",
             "| graph | batches | ms/batch | real tokens/s | computed/real | speedup vs padded | host feed ms |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for set_name in SETS:
        base = ort_graphs.get("padded", {}).get(set_name, {}).get("real_tokens_per_s")
        for name in GRAPHS:
            row = ort_graphs.get(name, {}).get(set_name)
            if row:
                speedup = f"{row['real_tokens_per_s'] / base:.2f}x" if base else "-"
                lines.append(f"| {name} | {set_name} | {row['ms_per_batch']:.2f} | {row['real_tokens_per_s']:,} | "
                             f"{row['computed_per_real']:.2f} | {speedup} | {row.get('host_feed_ms', '-')} |")
        for name in ("torch_sdpa_padded", "torch_packed_varlen"):
            row = record["torch"].get(name, {}).get(set_name)
            if row:
                speedup = f"{row['real_tokens_per_s'] / base:.2f}x" if base else "-"
                lines.append(f"| {name} | {set_name} | {row['ms_per_batch']:.2f} | {row['real_tokens_per_s']:,} | - | "
                             f"{speedup} | - |")
    lines += ["", f"Fresh batches ({record.get('fresh_count', '-')} random batches of 8-24 texts, each run once in a new "
              "session: every call a token count the session may not have seen, as the stack's step gets at c=256; "
              "ms per batch mean / p50, real tokens/s):", "",
              "| graph | " + " | ".join(FRESH_MODES) + " |", "| --- |" + " ---: |" * len(FRESH_MODES)]
    for name in GRAPHS:
        fresh = ort_graphs.get(name, {}).get("fresh")
        if fresh:
            cells = [f"{fresh[m]['mean_ms']:.2f} / {fresh[m]['p50_ms']:.2f} ms, {fresh[m]['real_tokens_per_s']:,}"
                     for m in FRESH_MODES]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "| graph | min cosine vs PyTorch fp32 (gate 0.9999) | fused ops | Memcpy nodes | nodes per provider | "
              "CPU ops |", "| --- | ---: | --- | --- | --- | --- |"]
    for name in GRAPHS:
        entry = ort_graphs.get(name, {})
        if entry:
            place = entry["placement"]
            lines.append(f"| {name} ({record['graphs'][name]['precision']}) | {entry['min_cosine']:.7f} "
                         f"{'ok' if entry['parity_passed'] else 'FAIL'} | "
                         f"{record['graphs'][name]['fused']} | {place['memcpy'] or 'none'} | "
                         f"{place['nodes_per_provider']} | {', '.join(place['cpu_ops']) or 'none'} |")
    for name in ("torch_sdpa_padded", "torch_packed_varlen"):
        peer = record["torch"].get(name, {})
        lines.append(f"| {name} | {peer['min_cosine']:.7f} | - | - | - | - |" if "min_cosine" in peer
                     else f"| {name} | {peer.get('error', '-')} | - | - | - | - |")
    lines += ["", "Cold shapes (fresh session; first / second run ms):", "",
              "| graph | " + " | ".join(f"{c['rows']}x{c['width']}" for c in ort_graphs["packed"]["cold"]) + " |",
              "| --- |" + " ---: |" * len(ort_graphs["packed"]["cold"])]
    for name in GRAPHS:
        cold = ort_graphs.get(name, {}).get("cold", [])
        lines.append(f"| {name} | " + " | ".join(f"{c['first_ms']:.1f} / {c['second_ms']:.1f}" for c in cold) + " |")
    lines += ["", "The builder's own parity per artifact: " + "; ".join(
        f"{name}: {p['min_cosine']:.7f} ({'passed' if p['passed'] else 'FAILED'}, {p.get('ran_on') or 'padded run'})"
        for name in ("packed", "padded", "packed_fp32") for p in record["graphs"][name]["builder_parity"])]
    return lines


def table_rows(record: dict[str, Any], context: RunContext) -> list[ResultRow]:
    """The packed graph's real tokens/s per batch set, with the padded graph's and PyTorch's on the same batches, and
    its parity against PyTorch fp32."""
    ort_graphs = record["onnxruntime"]["graphs"]
    rows = []
    for set_name in SETS:
        packed = ort_graphs.get("packed", {}).get(set_name)
        if not packed:
            continue
        graphs = {name: ort_graphs.get(name) or record["torch"].get(name) or {} for name in PEER_GRAPHS}
        peers = {peer: graphs[name].get(set_name, {}).get("real_tokens_per_s") for name, peer in PEER_GRAPHS.items()}
        rows.append(context.row("packed-step", "packed", f"{set_name} corpus batches", "real tokens/s",
                                packed["real_tokens_per_s"], "tokens/s", peers))
    if "packed" in ort_graphs:
        rows.append(context.row("packed-step", "packed", "first batches of every set", "min cosine vs PyTorch fp32",
                                ort_graphs["packed"]["min_cosine"], "cosine"))
        fresh = ort_graphs["packed"].get("fresh")
        if fresh:  # what the shipped setting (memory pattern off) saves on never-seen token counts
            on, off = (fresh[mode]["mean_ms"] for mode in FRESH_MODES)
            rows.append(context.row("packed-step", "packed, memory pattern off",
                                    "fresh batches of 8-24 texts, each in a new session", "mean ms per batch", off,
                                    "ms", {"memory-pattern-on": on}))
    return rows
