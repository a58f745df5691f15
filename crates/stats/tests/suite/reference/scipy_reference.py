#!/usr/bin/env python3
"""Writes welch_scipy.json: scipy's Welch t-test, means, variances and
linear quantiles on fixed data, the reference `tests/suite/scipy.rs` checks
ingot-stats against (to 1e-9).

Run once when the cases change (the e2e Python env has scipy pinned in
scripts/requirements-test.txt):

    $(scripts/python-env) crates/stats/tests/suite/reference/scipy_reference.py
"""

import json
from pathlib import Path

import numpy as np
import scipy
from scipy import stats

rng = np.random.default_rng(17)
CASES = {
    "small": ([12.1, 14.3, 11.8, 13.5, 12.9, 15.2, 13.1, 12.4],
              [14.8, 16.1, 15.3, 13.9, 17.2, 15.8, 16.4, 14.6, 15.9, 16.7]),
    "outlier": ([1.0, 2.0, 3.0, 4.0, 5.0], [1.5, 2.5, 3.5, 4.5, 5.5, 6.5, 100.0]),
    "two_each": ([0.1, 0.3], [0.2, 0.25]),
    "unequal_spread": ([float(x) for x in np.round(rng.normal(100.0, 5.0, 40), 6)],
                       [float(x) for x in np.round(rng.normal(103.0, 25.0, 25), 6)]),
    "ttft_like": ([float(x) for x in np.round(rng.lognormal(np.log(0.08), 0.3, 60), 6)],
                  [float(x) for x in np.round(rng.lognormal(np.log(0.12), 0.5, 30), 6)]),
    "tiny_p": ([float(x) for x in np.round(rng.normal(10.0, 1.0, 50), 6)],
               [float(x) for x in np.round(rng.normal(14.0, 1.0, 50), 6)]),
}
QS = [0.0, 0.25, 0.5, 0.9, 0.95, 0.99, 1.0]

out = {"scipy": scipy.__version__, "numpy": np.__version__, "quantiles": QS, "cases": []}
for name, (a, b) in CASES.items():
    r = stats.ttest_ind(a, b, equal_var=False)
    out["cases"].append({
        "name": name,
        "a": a,
        "b": b,
        "t": float(r.statistic),
        "df": float(r.df),
        "p": float(r.pvalue),
        "mean_a": float(np.mean(a)),
        "var_a": float(np.var(a, ddof=1)),
        "quantiles_a": [float(np.quantile(a, q, method="linear")) for q in QS],
    })
Path(__file__).with_name("welch_scipy.json").write_text(json.dumps(out, indent=1) + "\n")
