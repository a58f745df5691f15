use clap::Parser;

use super::*;
use crate::result::Summary;

/// A run's summary: every latency statistic scaled from a TPOT of
/// `tpot_ms` (TTFT 10×, E2E 20×, p99 1.3× the mean), throughput the
/// inverse (a slower server serves fewer tokens per second).
fn run(tpot_ms: f64) -> BenchResult {
    let stats = |mean: f64| Stats {
        count: 24,
        mean,
        median: mean * 0.98,
        p99: mean * 1.3,
        ..Stats::default()
    };
    BenchResult {
        config: serde_json::json!({"input_len": 32, "seed": 0}),
        summary: Summary {
            completed: 24,
            request_throughput: 170.0 / tpot_ms,
            output_tok_s: 2720.0 / tpot_ms,
            ttft: stats(10.0 * tpot_ms),
            tpot: stats(tpot_ms),
            itl: stats(tpot_ms),
            e2e: stats(20.0 * tpot_ms),
            ..Summary::default()
        },
        ..BenchResult::default()
    }
}

fn side(tpots: &[f64]) -> Side {
    Side::of(&tpots.iter().map(|&t| run(t)).collect::<Vec<_>>())
}

fn row<'a>(c: &'a Comparison, metric: &str) -> &'a Row {
    c.rows.iter().find(|r| r.metric == metric).unwrap()
}

// Seven back-to-back runs of one server on the 2-core machine gave TPOT
// means from 16.3 to 19.8 ms: runs of one build look like this.
const NOISE_A: [f64; 4] = [16.3, 19.8, 17.4, 18.1];
const NOISE_B: [f64; 4] = [19.1, 17.0, 18.6, 16.8];

#[test]
fn runs_of_one_build_pass_though_their_deltas_are_large() {
    let a = side(&NOISE_A[..3]);
    let b = side(&[19.8, 19.1, 18.6]); // the slow draws: +7.6% mean
    let c = compare(&a, &b, &CompareArgs::default()).unwrap();
    assert_eq!(c.mode, Mode::Runs);
    assert_eq!((c.baseline_runs, c.candidate_runs), (3, 3));
    assert!(!c.regressed, "{c:#?}");
    let tp = row(&c, "output_tok_s");
    assert!(tp.delta_pct.unwrap() < -5.0, "{tp:?}"); // beyond the 5% tolerance
    assert!(tp.p_value.unwrap() > 0.05, "{tp:?}");
    assert_eq!(tp.verdict, Verdict::NotSignificant);
    let c = compare(&side(&NOISE_A), &side(&NOISE_B), &CompareArgs::default()).unwrap();
    assert!(!c.regressed, "{c:#?}");
}

#[test]
fn a_thirty_percent_slowdown_regresses_every_row() {
    // Four runs a side: with three and this spread, 30 % is p ~0.01 per
    // row, not significant once corrected for the fourteen rows.
    let a = side(&NOISE_A);
    let slow: Vec<f64> = NOISE_B.iter().map(|t| t * 1.3).collect();
    let c = compare(&a, &side(&slow), &CompareArgs::default()).unwrap();
    assert!(c.regressed);
    for r in &c.rows {
        assert_eq!(r.verdict, Verdict::Regressed, "{r:?}");
        assert!(r.p_holm.unwrap() < 0.05, "{r:?}");
    }
    // ... and the other way round it is an improvement.
    let c = compare(&side(&slow), &a, &CompareArgs::default()).unwrap();
    assert!(!c.regressed);
    assert_eq!(row(&c, "tpot_mean_ms").verdict, Verdict::Improved);
}

#[test]
fn rows_significant_one_by_one_are_one_family_for_the_verdict() {
    // +23% TPOT: beyond every tolerance, each row's own p ~0.04, which
    // fourteen rows at once give by chance far more often than alpha.
    let a = side(&NOISE_A[..3]);
    let b: Vec<f64> = NOISE_B[..3].iter().map(|t| t * 1.2).collect();
    let c = compare(&a, &side(&b), &CompareArgs::default()).unwrap();
    let r = row(&c, "tpot_mean_ms");
    assert!(r.p_value.unwrap() < 0.05, "{r:?}");
    assert!(r.p_holm.unwrap() >= 0.05, "{r:?}");
    assert_eq!(r.verdict, Verdict::NotSignificant);
    assert!(!c.regressed, "{c:#?}");
}

#[test]
fn a_consistent_shift_below_the_tolerance_is_never_a_regression() {
    // +4% with almost no spread: significant, but not practically so.
    let a = side(&[17.0, 17.01, 16.99]);
    let b = side(&[17.68, 17.69, 17.67]);
    let c = compare(&a, &b, &CompareArgs::default()).unwrap();
    let r = row(&c, "tpot_mean_ms");
    assert!(r.p_value.unwrap() < 1e-4, "{r:?}");
    assert_eq!(r.verdict, Verdict::Ok);
    assert!(!c.regressed, "{c:#?}");
    // A tighter tolerance makes the same shift a regression.
    let strict = CompareArgs {
        max_latency_increase: 2.0,
        ..CompareArgs::default()
    };
    let c = compare(&a, &b, &strict).unwrap();
    assert_eq!(row(&c, "tpot_mean_ms").verdict, Verdict::Regressed);
}

#[test]
fn one_run_a_side_uses_the_wide_gate_and_no_test() {
    let args = CompareArgs::default();
    // +40%: beyond every tolerance, within the single-run gate.
    let c = compare(&side(&[17.0]), &side(&[23.8]), &args).unwrap();
    assert_eq!(c.mode, Mode::SingleRun);
    assert_eq!(c.single_run_gate_pct, Some(SINGLE_RUN_GATE_PCT));
    assert!(!c.regressed, "{c:#?}");
    let r = row(&c, "tpot_mean_ms");
    assert_eq!((r.p_value, r.verdict), (None, Verdict::NotSignificant));
    assert_eq!(r.tolerance_pct, 10.0);
    // +60%: beyond the gate.
    let c = compare(&side(&[17.0]), &side(&[27.2]), &args).unwrap();
    assert!(c.regressed);
    assert_eq!(row(&c, "tpot_mean_ms").verdict, Verdict::Regressed);
    // One run on only one side is still single-run mode.
    let c = compare(&side(&NOISE_A), &side(&[20.4]), &args).unwrap();
    assert_eq!(c.mode, Mode::SingleRun);
    assert!(!c.regressed);
    // A tolerance wider than the gate wins.
    let loose = CompareArgs {
        max_latency_increase: 70.0,
        ..CompareArgs::default()
    };
    let c = compare(&side(&[17.0]), &side(&[27.2]), &loose).unwrap();
    assert_eq!(row(&c, "tpot_mean_ms").verdict, Verdict::Ok);
}

#[test]
fn runs_without_a_metric_are_no_data() {
    let mut b = run(17.0);
    b.summary.ttft = Stats::default();
    let c = compare(
        &side(&NOISE_A),
        &Side::of(&[b.clone(), b]),
        &CompareArgs::default(),
    )
    .unwrap();
    assert_eq!(row(&c, "ttft_p99_ms").verdict, Verdict::NoData);
    assert_eq!(row(&c, "tpot_mean_ms").verdict, Verdict::Ok);
    assert_eq!(c.rows.last().unwrap().verdict, Verdict::NoData);
}

#[test]
fn a_file_of_repeated_runs_is_one_run_each() {
    let mut r = run(17.0);
    r.runs = NOISE_A
        .iter()
        .map(|&t| run(t).run_summaries().remove(0))
        .collect();
    let s = Side::of(&[r, run(18.0)]);
    assert_eq!(s.runs.len(), 5);
    assert_eq!(s.runs[4].summary.tpot.mean, 18.0);
}

#[test]
fn files_from_disk_with_and_without_runs() {
    let dir = std::env::temp_dir().join(format!("ingot-compare-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut many = run(17.0);
    many.runs = NOISE_A
        .iter()
        .map(|&t| run(t).run_summaries().remove(0))
        .collect();
    let (one_path, many_path) = (dir.join("one.json"), dir.join("many.json"));
    crate::serve::write_result(&one_path, &run(17.0)).unwrap();
    crate::serve::write_result(&many_path, &many).unwrap();
    let text = std::fs::read_to_string(&one_path).unwrap();
    assert!(
        !text.contains("\"runs\""),
        "single-run files keep their format"
    );
    let s = Side::load("baseline", &[one_path, many_path.clone()]).unwrap();
    assert_eq!(s.runs.len(), 5);
    let e = Side::load("baseline", &[dir.join("missing.json")]).unwrap_err();
    assert!(e.to_string().contains("missing.json"), "{e}");
    let e = Side::load("candidate", &[]).unwrap_err();
    assert!(e.to_string().contains("no candidate"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: CompareArgs,
}

fn parse(argv: &[&str]) -> Result<(Vec<PathBuf>, Vec<PathBuf>), String> {
    let cli = Cli::try_parse_from(std::iter::once("compare").chain(argv.iter().copied()))
        .map_err(|e| e.to_string())?;
    file_lists(&cli.args).map_err(|e| e.to_string())
}

#[test]
fn both_command_line_forms_name_the_files() {
    let p = |v: &[&str]| v.iter().map(PathBuf::from).collect::<Vec<_>>();
    assert_eq!(parse(&["a", "b"]).unwrap(), (p(&["a"]), p(&["b"])));
    assert_eq!(
        parse(&[
            "--baseline",
            "a1",
            "a2",
            "--candidate",
            "b1",
            "--alpha",
            "0.1"
        ])
        .unwrap(),
        (p(&["a1", "a2"]), p(&["b1"]))
    );
    for bad in [
        &["a"][..],
        &[],
        &["a", "b", "c"],
        &["--baseline", "a1"],
        &["a", "b", "--baseline", "a1", "--candidate", "b1"],
    ] {
        assert!(parse(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn bad_options_and_config_differences() {
    let a = side(&NOISE_A);
    for bad in [
        CompareArgs {
            alpha: 1.5,
            ..CompareArgs::default()
        },
        CompareArgs {
            max_p99_increase: -1.0,
            ..CompareArgs::default()
        },
        CompareArgs {
            single_run_gate: f64::NAN,
            ..CompareArgs::default()
        },
    ] {
        assert!(compare(&a, &a, &bad).is_err());
    }
    let x = serde_json::json!({"input_len": 16, "out": "a", "seed": 1});
    let y = serde_json::json!({"input_len": 32, "out": "b", "seed": 1, "new": true, "repeat": 5});
    assert_eq!(config_differences(&x, &y), ["input_len", "new"]);
}

#[test]
fn cache_hit_rates_average_over_runs() {
    let a = side(&NOISE_A);
    let c = compare(&a, &a, &CompareArgs::default()).unwrap();
    assert_eq!(cache_hit_rates(&c), None);
    let v = serde_json::to_value(&c).unwrap();
    assert!(v.get("baseline_cache_hit_rate").is_none());
    let mut runs: Vec<BenchResult> = [17.0, 18.0].iter().map(|&t| run(t)).collect();
    runs[0].summary.cache_hit_rate = Some(0.2);
    runs[1].summary.cache_hit_rate = Some(0.3);
    let c = compare(&a, &Side::of(&runs), &CompareArgs::default()).unwrap();
    assert!((c.candidate_cache_hit_rate.unwrap() - 0.25).abs() < 1e-12);
    assert_eq!(
        cache_hit_rates(&c).as_deref(),
        Some("cache hit rate: baseline -, candidate 25.0%")
    );
}
