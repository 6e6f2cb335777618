#!/usr/bin/python3
"""Draws the table of bench/pipeline/batch.sh as an SVG: aggregate throughput against the
batch size, as a multiple of --batch 1, one line per memory setting (the median over rounds).

Usage: bench/pipeline/batch_plot.py TABLE.txt OUT.svg
"""
import math
import statistics
import sys
from collections import defaultdict


def read_table(path):
    gains = defaultdict(lambda: defaultdict(list))  # memory -> batch -> [x B=1]
    with open(path) as f:
        header = f.readline()
        if not header.startswith("memory"):
            sys.exit(f"{path}: not a table of batch.sh")
        for line in f:
            words = line.split()
            if len(words) < 11:
                continue
            memory = " ".join(words[:-10])
            gains[memory][int(words[-10])].append(float(words[-7]))
    return gains


def svg(gains):
    width, height, left, right, top, bottom = 640, 400, 60, 190, 30, 50
    batches = sorted({b for per in gains.values() for b in per})
    top_gain = max(max(statistics.median(v) for v in per.values()) for per in gains.values())
    y_max = max(2, math.ceil(top_gain))
    def x(b):
        span = math.log2(batches[-1]) or 1
        return left + (width - left - right) * math.log2(b) / span
    def y(g):
        return height - bottom - (height - top - bottom) * g / y_max
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           'font-family="sans-serif" font-size="12">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{left}" y="18">aggregate tokens/s, as a multiple of --batch 1</text>']
    for g in range(0, y_max + 1):
        out.append(f'<line x1="{left}" y1="{y(g):.1f}" x2="{width - right}" y2="{y(g):.1f}" '
                   'stroke="#ddd"/>')
        out.append(f'<text x="{left - 8}" y="{y(g) + 4:.1f}" text-anchor="end">{g}x</text>')
    for b in batches:
        out.append(f'<text x="{x(b):.1f}" y="{height - bottom + 18}" text-anchor="middle">{b}</text>')
    out.append(f'<text x="{(left + width - right) / 2}" y="{height - 12}" '
               'text-anchor="middle">--batch</text>')
    colours = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"]
    for i, (memory, per) in enumerate(gains.items()):
        c = colours[i % len(colours)]
        points = [(x(b), y(statistics.median(per[b]))) for b in sorted(per)]
        path = " ".join(f"{px:.1f},{py:.1f}" for px, py in points)
        out.append(f'<polyline points="{path}" fill="none" stroke="{c}" stroke-width="2"/>')
        for px, py in points:
            out.append(f'<circle cx="{px:.1f}" cy="{py:.1f}" r="3" fill="{c}"/>')
        ly = top + 20 + 18 * i
        out.append(f'<line x1="{width - right + 12}" y1="{ly}" x2="{width - right + 32}" '
                   f'y2="{ly}" stroke="{c}" stroke-width="2"/>')
        out.append(f'<text x="{width - right + 38}" y="{ly + 4}">{memory}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    with open(sys.argv[2], "w") as f:
        f.write(svg(read_table(sys.argv[1])))


if __name__ == "__main__":
    main()
