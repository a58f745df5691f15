//! ingot-stats against scipy 1.17 (`reference/welch_scipy.json`, written by
//! `reference/scipy_reference.py`): Welch's t, df and p-value, the mean, the
//! variance and the linear quantiles, each to 1e-9 (relative for t, df,
//! means, variances and quantiles; absolute for p-values, which live in
//! [0, 1]).

#![allow(clippy::unwrap_used)]

use serde_json::Value;

const FIXTURE: &str = include_str!("reference/welch_scipy.json");

fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

fn rel_close(name: &str, got: f64, want: f64) {
    let tol = 1e-9 * want.abs().max(1.0);
    assert!((got - want).abs() <= tol, "{name}: {got} vs scipy {want}");
}

#[test]
fn welch_mean_variance_and_quantiles_match_scipy() {
    let doc: Value = serde_json::from_str(FIXTURE).unwrap();
    let qs = floats(&doc["quantiles"]);
    let cases = doc["cases"].as_array().unwrap();
    assert!(cases.len() >= 6);
    for c in cases {
        let name = c["name"].as_str().unwrap();
        let (a, b) = (floats(&c["a"]), floats(&c["b"]));
        let w = ingot_stats::welch_t_test(&a, &b).unwrap();
        rel_close(&format!("{name} t"), w.t, c["t"].as_f64().unwrap());
        rel_close(&format!("{name} df"), w.df, c["df"].as_f64().unwrap());
        let p = c["p"].as_f64().unwrap();
        assert!((w.p - p).abs() <= 1e-9, "{name} p: {} vs scipy {p}", w.p);
        rel_close(
            &format!("{name} mean"),
            ingot_stats::mean(&a).unwrap(),
            c["mean_a"].as_f64().unwrap(),
        );
        rel_close(
            &format!("{name} var"),
            ingot_stats::variance(&a).unwrap(),
            c["var_a"].as_f64().unwrap(),
        );
        // scipy.stats.variation(a, ddof=1) is sqrt(var) / mean.
        rel_close(
            &format!("{name} cv"),
            ingot_stats::coefficient_of_variation(&a).unwrap(),
            c["var_a"].as_f64().unwrap().sqrt() / c["mean_a"].as_f64().unwrap(),
        );
        for (q, want) in qs.iter().zip(floats(&c["quantiles_a"])) {
            let got = ingot_stats::quantile(&a, *q).unwrap();
            rel_close(&format!("{name} q{q}"), got, want);
        }
    }
}

#[test]
fn tiny_p_values_keep_relative_precision() {
    // 2·cdf(−|t|) rather than 1 − cdf(|t|): scipy's 2.4e-35 is not rounded to 0.
    let doc: Value = serde_json::from_str(FIXTURE).unwrap();
    let c = doc["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "tiny_p")
        .unwrap();
    let w = ingot_stats::welch_t_test(&floats(&c["a"]), &floats(&c["b"])).unwrap();
    let p = c["p"].as_f64().unwrap();
    assert!(((w.p - p) / p).abs() < 1e-6, "{} vs {p}", w.p);
}
