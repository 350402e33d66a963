#!/usr/bin/env python3
"""Summarises an Nsight Compute source page (--page source --print-source sass --csv).

Prints the instructions with the most warp samples and their main stall
reasons, and the instruction mix of the hottest loop: the instructions
executed at least half as often as the most frequent `*GMMA` instruction,
counted per execution of it (for the scoring kernel, where each product
instruction runs once per page and consumer warp: per page and warp).
"""
import collections
import csv
import sys


def main(path: str, top: int = 25) -> None:
    rows = list(csv.reader(open(path, newline="")))
    header_index = next(i for i, row in enumerate(rows) if "Address" in row and "Source" in row)
    header, data = rows[header_index], rows[header_index + 1:]
    column = {name: header.index(name) for name in header}
    samples = column["Warp Stall Sampling (All Samples)"]
    executed = column["Instructions Executed"]
    reasons = [name for name in header if name.startswith("stall_") and "Not Issued" not in name]

    def count(row, index):
        return int(row[index] or 0)

    total = sum(count(row, samples) for row in data)
    print(f"{total} warp samples over {len(data)} instructions")
    for row in sorted(data, key=lambda r: -count(r, samples))[:top]:
        share = 100.0 * count(row, samples) / max(total, 1)
        stalls = [(count(row, column[r]), r[len("stall_"):]) for r in reasons]
        # Reasons the CSV has no column for (a wgmma waiting for the tensor
        # pipe among them).
        stalls.append((count(row, samples) - sum(n for n, _ in stalls), "unlisted"))
        stalls = sorted(stalls, reverse=True)[:3]
        stalls_text = ", ".join(f"{name} {n}" for n, name in stalls if n)
        print(f"{share:5.1f}%  {row[column['Source']].strip()[:64]:64s}  {stalls_text}")

    products = [count(row, executed) for row in data if "GMMA" in row[column["Source"]]]
    if not products:
        return
    loop = max(products)
    mix = collections.Counter()
    for row in data:
        if count(row, executed) >= loop // 2:
            words = row[column["Source"]].split()
            opcode = words[1] if words and words[0].startswith("@") else (words[0] if words else "?")
            mix[opcode.split(".")[0]] += count(row, executed) / loop
    print(f"\ninstructions per execution of the most frequent product ({loop} executions): "
          f"{sum(mix.values()):.0f}")
    print(", ".join(f"{op} {n:.1f}" for op, n in mix.most_common(20)))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: sass_hotspots.py SASS_CSV")
    main(sys.argv[1])
