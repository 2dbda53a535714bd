"""The proof's table from the JSON lines lm.py printed (one file, argv[1])."""

import json
import sys

with open(sys.argv[1]) as f:
    rows = [json.loads(line) for line in f if line.startswith("{")]
base = next((r["first_steps_s"] for r in rows if r["label"] == "cold"), None)
print("| start | first steps | vs cold | JAX hits / misses | per program (s) |")
print("|---|---:|---:|---:|---|")
for r in rows:
    ratio = f"{r['first_steps_s'] / base:.2f}" if base else ""
    per = ", ".join(f"{k} {v}" for k, v in r["per_program_s"].items())
    hits = f"{r['hits']} / {r['misses']}"
    print(f"| {r['label']} | {r['first_steps_s']:.2f} s | {ratio} | {hits} | {per} |")
