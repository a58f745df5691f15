"""Sums an ncu --csv metrics dump (time, DRAM read/write) by kernel name."""
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
head, rows = rows[0], rows[1:]
k, m, v = head.index("Kernel Name"), head.index("Metric Name"), head.index("Metric Value")
agg = collections.defaultdict(lambda: collections.defaultdict(float))
ids = collections.defaultdict(set)
for r in rows:
    name = r[k].split("(")[0]
    agg[name][r[m]] += float(r[v].replace(",", ""))
    ids[name].add(r[0])
total = 0.0
print(f"{'kernel':32} {'n':>4} {'us/launch':>10} {'MB read':>9} {'TB/s':>6}")
for name, d in sorted(agg.items(), key=lambda x: -x[1]["gpu__time_duration.sum"]):
    n = len(ids[name]); t = d["gpu__time_duration.sum"]; total += t
    rd = d["dram__bytes_read.sum"]
    print(f"{name:32} {n:4d} {t / n / 1e3:10.2f} {rd / n / 1e6:9.2f} {rd / t / 1e3:6.2f}")
print(f"sum of isolated kernel times: {total / 1e6:.3f} ms")
