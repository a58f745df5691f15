//! Loader tests: precedence, error lines, show, reload, flags from the env.

#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::json;

use crate::*;

/// Writes `text` to a fresh file under the workspace's `target/tmp` (not
/// the system temp dir, where every run left its files: `cargo clean`
/// removes these).
fn file(text: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/tmp/config-tests");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{}-{n}.toml", std::process::id()));
    std::fs::write(&path, text).unwrap();
    path
}

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn flag(key: &'static str, value: serde_json::Value, flag: &'static str) -> FlagValue {
    FlagValue { key, value, flag }
}

fn err(layers: &Layers) -> String {
    let e = load(layers).unwrap_err().to_string();
    assert_eq!(e.lines().count(), 1, "one line: {e}");
    e
}

#[test]
fn no_layers_is_the_defaults() {
    let l = load(&Layers::default()).unwrap();
    assert_eq!(l.config, Config::default());
    assert!(l.sources.values().all(|s| *s == Source::Default));
    assert_eq!(l.config.scheduler.max_num_batched_tokens, 512);
    assert_eq!(l.source("scheduler.max_num_seqs"), &Source::Default);
}

#[test]
fn each_layer_wins_over_the_one_before() {
    let path = file("[scheduler]\nmax_num_seqs = 8\nmax_waiting = 9\n[cache]\nttl = \"1m\"\n");
    let mut layers = Layers {
        file: Some(path.clone()),
        ..Layers::default()
    };
    let l = load(&layers).unwrap();
    assert_eq!(l.config.scheduler.max_num_seqs, 8);
    assert_eq!(l.config.cache.ttl.get().as_secs(), 60);
    assert_eq!(
        l.source("scheduler.max_num_seqs"),
        &Source::File {
            path: path.clone(),
            line: 2
        }
    );
    assert_eq!(
        l.source("scheduler.max_waiting").to_string(),
        format!("{}:3", path.display())
    );

    layers.env = env(&[
        ("INGOT_SCHEDULER_MAX_NUM_SEQS", "16"),
        ("INGOT_CACHE_TTL", "90"),
    ]);
    let l = load(&layers).unwrap();
    assert_eq!(l.config.scheduler.max_num_seqs, 16);
    assert_eq!(l.config.cache.ttl.get().as_secs(), 90);
    assert_eq!(
        l.source("scheduler.max_num_seqs").to_string(),
        "env INGOT_SCHEDULER_MAX_NUM_SEQS"
    );
    assert_eq!(l.config.scheduler.max_waiting, 9, "the file still counts");

    layers.flags = vec![flag("scheduler.max_num_seqs", json!(32), "--max-num-seqs")];
    let l = load(&layers).unwrap();
    assert_eq!(l.config.scheduler.max_num_seqs, 32);
    assert_eq!(
        l.source("scheduler.max_num_seqs").to_string(),
        "flag --max-num-seqs"
    );
    assert_eq!(l.source("cache.ttl").to_string(), "env INGOT_CACHE_TTL");
}

#[test]
fn legacy_variables_keep_working() {
    let layers = Layers {
        env: env(&[
            ("INGOT_MODEL", "/models/m.gguf"),
            ("INGOT_HOST", "0.0.0.0"),
            ("INGOT_PORT", "9000"),
            ("INGOT_THREADS", "2"),
            ("INGOT_DEVICE", "cpu"),
            ("INGOT_LOG", "info,ingot_server=debug"),
            ("INGOT_CUDA_PROFILE", "1"),
            ("INGOT_CUDA_CHECK", "1"),
            ("INGOT_CUDA_L2_PREFETCH", "8:1"),
            ("INGOT_CUDA_PDL", "0"),
            ("INGOT_CUDA_FUSED_BLOCK", "on"),
            ("INGOT_CUDA_TC_DECODE_MIN_ROWS", "32"),
            ("INGOT_CACHE", "/tmp/assets"),
        ]),
        ..Layers::default()
    };
    let c = load(&layers).unwrap().config;
    assert_eq!(c.model.path, Some(PathBuf::from("/models/m.gguf")));
    assert_eq!(c.server.host, "0.0.0.0");
    assert_eq!(c.server.port, 9000);
    assert_eq!(c.model.threads, Some(2));
    assert_eq!(c.model.device, Device::Cpu);
    assert_eq!(c.log.level, "info,ingot_server=debug");
    assert!(c.cuda.profile && c.cuda.check && !c.cuda.pdl && c.cuda.fused_block);
    assert_eq!(c.cuda.l2_prefetch.as_deref(), Some("8:1"));
    assert_eq!(c.cuda.tc_decode_min_rows, 32);
    assert_eq!(
        c.cache,
        CacheSection::default(),
        "INGOT_CACHE is not config"
    );
}

#[test]
fn unknown_file_key_names_line_and_alternatives() {
    let path = file("[server]\nport = 8001\nbogus = 1\n");
    let e = err(&Layers {
        file: Some(path.clone()),
        ..Layers::default()
    });
    assert_eq!(
        e,
        format!(
            "server.bogus ({}:3): unknown key; expected one of cors_allowed_origins, header_timeout, host, ignore_unknown_fields, max_body_bytes, max_connections, max_connections_per_client, max_stream_pending_bytes, port, shutdown_timeout, stream_flush_interval",
            path.display()
        )
    );
    let path = file("[servr]\nport = 8001\n");
    let e = err(&Layers {
        file: Some(path),
        ..Layers::default()
    });
    assert!(e.starts_with("servr ("), "{e}");
    assert!(
        e.contains(":1): unknown key; expected one of auth, cache, cuda, engine"),
        "{e}"
    );
}

#[test]
fn wrong_types_name_key_value_and_source() {
    let e = err(&Layers {
        env: env(&[("INGOT_SCHEDULER_MAX_NUM_SEQS", "lots")]),
        ..Layers::default()
    });
    assert_eq!(
        e,
        "scheduler.max_num_seqs = \"lots\" (env INGOT_SCHEDULER_MAX_NUM_SEQS): invalid type: string \"lots\", expected usize"
    );
    let path = file("[engine]\nstall_timeout = \"30 parsecs\"\n");
    let e = err(&Layers {
        file: Some(path.clone()),
        ..Layers::default()
    });
    assert!(
        e.starts_with(&format!(
            "engine.stall_timeout = \"30 parsecs\" ({}:2): expected a duration",
            path.display()
        )),
        "{e}"
    );
    let e = err(&Layers {
        flags: vec![flag("model.device", json!("tpu"), "--device")],
        ..Layers::default()
    });
    assert!(
        e.starts_with("model.device = \"tpu\" (flag --device): unknown variant `tpu`"),
        "{e}"
    );
    let path = file("server = 5\n");
    let e = err(&Layers {
        file: Some(path),
        ..Layers::default()
    });
    assert!(e.starts_with("server = 5 ("), "{e}");
    assert!(e.ends_with("expected a table"), "{e}");
}

#[test]
fn out_of_range_values_name_the_bound() {
    let path = file("# the scheduler\n\n\n\n\n[scheduler]\nmax_num_seqs = 0\n");
    let e = err(&Layers {
        file: Some(path.clone()),
        ..Layers::default()
    });
    assert_eq!(
        e,
        format!(
            "scheduler.max_num_seqs = 0 ({}:7): must be at least 1",
            path.display()
        )
    );
    let e = err(&Layers {
        flags: vec![flag(
            "model.gpu_memory_utilization",
            json!(1.5),
            "--gpu-memory-utilization",
        )],
        ..Layers::default()
    });
    assert!(
        e.starts_with(
            "model.gpu_memory_utilization = 1.5 (flag --gpu-memory-utilization): must be in (0, 1]"
        ),
        "{e}"
    );
    let e = err(&Layers {
        env: env(&[("INGOT_CACHE_TTL", "0s")]),
        ..Layers::default()
    });
    assert_eq!(
        e,
        "cache.ttl = \"0s\" (env INGOT_CACHE_TTL): must be more than 0"
    );
    let e = err(&Layers {
        env: env(&[("INGOT_CUDA_SMEM_CARVEOUT", "101")]),
        ..Layers::default()
    });
    assert_eq!(
        e,
        "cuda.smem_carveout = 101 (env INGOT_CUDA_SMEM_CARVEOUT): must be a percentage from 0 to 100"
    );
    let e = err(&Layers {
        env: env(&[("INGOT_ENGINE_BLOCK_SIZE", "32")]),
        ..Layers::default()
    });
    assert_eq!(
        e,
        "engine.block_size = 32 (env INGOT_ENGINE_BLOCK_SIZE): only 16 is supported"
    );
}

#[test]
fn cors_origins_are_a_star_alone_or_exact_origins() {
    let path =
        file("[server]\ncors_allowed_origins = [\"https://a.example\", \"http://b:3000\"]\n");
    let l = load(&Layers {
        file: Some(path),
        ..Layers::default()
    })
    .unwrap();
    assert_eq!(
        l.config.server.cors_allowed_origins,
        ["https://a.example", "http://b:3000"]
    );
    for bad in [
        r#"["*", "https://a.example"]"#,
        r#"["https://a.example/app"]"#,
        r#"["a.example"]"#,
    ] {
        let path = file(&format!("[server]\ncors_allowed_origins = {bad}\n"));
        let e = err(&Layers {
            file: Some(path),
            ..Layers::default()
        });
        assert!(e.starts_with("server.cors_allowed_origins"), "{e}");
    }
}

#[test]
fn batched_tokens_must_cover_a_block() {
    let e = err(&Layers {
        flags: vec![flag(
            "scheduler.max_num_batched_tokens",
            json!(8),
            "--max-num-batched-tokens",
        )],
        ..Layers::default()
    });
    assert_eq!(
        e,
        "scheduler.max_num_batched_tokens = 8 (flag --max-num-batched-tokens): must be at least engine.block_size (16)"
    );
}

#[test]
fn show_names_every_source_and_loads_back() {
    let path = file("[server]\nport = 8123\n");
    let l = load(&Layers {
        file: Some(path.clone()),
        env: env(&[("INGOT_CACHE_MAX_BYTES", "1GiB")]),
        flags: vec![flag("scheduler.max_num_seqs", json!(7), "--max-num-seqs")],
    })
    .unwrap();
    let shown = l.show();
    let line = |key: &str| {
        shown
            .lines()
            .find(|l| l.starts_with(&format!("{key} = ")))
            .unwrap_or_else(|| panic!("{key} missing in\n{shown}"))
            .to_string()
    };
    assert!(line("scheduler.max_num_seqs").ends_with("# flag --max-num-seqs"));
    assert!(line("scheduler.max_num_seqs").starts_with("scheduler.max_num_seqs = 7 "));
    assert!(line("server.port").ends_with(&format!("# {}:2", path.display())));
    assert!(line("cache.max_bytes").contains("\"1GiB\""));
    assert!(line("cache.max_bytes").ends_with("# env INGOT_CACHE_MAX_BYTES"));
    assert!(line("engine.stall_timeout").contains("= \"30s\""));
    assert!(line("flags.coalescing.enabled").ends_with("# default"));
    assert!(shown.contains("# model.path = (unset)"), "{shown}");
    // Every leaf, and the text is TOML for the same config.
    let leaves = tree::leaves(&serde_json::to_value(&l.config).unwrap()).len();
    assert_eq!(shown.lines().count(), leaves);
    let again = load(&Layers {
        file: Some(file(&shown)),
        ..Layers::default()
    })
    .unwrap();
    assert_eq!(again.config, l.config);
}

#[test]
fn diff_splits_live_keys_from_restart_keys() {
    let old = Config::default();
    let mut new = old.clone();
    new.flags.get_mut("response_cache").unwrap().enabled = true;
    new.flags.insert("beta".into(), FlagSpec::default());
    new.cache.ttl = Duration::from_secs(5);
    new.log.level = "debug".into();
    new.scheduler.max_num_seqs = 8;
    new.server.port = 1;
    let r = diff(&old, &new);
    assert_eq!(
        r.applied,
        [
            "cache.ttl",
            "flags.beta.allow",
            "flags.beta.deny",
            "flags.beta.enabled",
            "flags.beta.rollout_percent",
            "flags.response_cache.enabled",
            "log.level",
        ]
    );
    assert_eq!(r.needs_restart, ["scheduler.max_num_seqs", "server.port"]);
    assert!(diff(&old, &old).is_empty());
}

#[test]
fn flag_env_override_flips_a_flag() {
    let unit = "sk-anyone";
    let base = load(&Layers::default()).unwrap();
    assert!(!base.config.flag("response_cache", unit));
    assert!(base.config.flag("coalescing", unit));
    let l = load(&Layers {
        env: env(&[
            ("INGOT_FLAG_RESPONSE_CACHE", "on"),
            ("INGOT_FLAG_COALESCING", "off"),
        ]),
        ..Layers::default()
    })
    .unwrap();
    assert!(l.config.flag("response_cache", unit));
    assert!(!l.config.flag("coalescing", unit));
    assert_eq!(
        l.source("flags.response_cache.enabled").to_string(),
        "env INGOT_FLAG_RESPONSE_CACHE"
    );
    let l = load(&Layers {
        env: env(&[("INGOT_FLAG_RESPONSE_CACHE", "12.5")]),
        ..Layers::default()
    })
    .unwrap();
    let f = &l.config.flags["response_cache"];
    assert!(f.enabled);
    assert_eq!(f.rollout_percent, 12.5);
    let e = err(&Layers {
        env: env(&[("INGOT_FLAG_COALESCNG", "off")]),
        ..Layers::default()
    });
    assert!(
        e.starts_with("flags.coalescng = \"off\" (env INGOT_FLAG_COALESCNG): unknown flag"),
        "{e}"
    );
    let e = err(&Layers {
        env: env(&[("INGOT_FLAG_COALESCING", "maybe")]),
        ..Layers::default()
    });
    assert!(e.contains("expected on, off or a rollout percent"), "{e}");
    let e = err(&Layers {
        env: env(&[("INGOT_FLAG_COALESCING", "150")]),
        ..Layers::default()
    });
    assert_eq!(
        e,
        "flags.coalescing.rollout_percent = 150.0 (env INGOT_FLAG_COALESCING): must be between 0 and 100"
    );
}

#[test]
fn files_define_new_flags_with_checked_names_and_rollouts() {
    let path = file("[flags.beta]\nenabled = true\nrollout_percent = 12.5\nallow = [\"alice\"]\n");
    let l = load(&Layers {
        file: Some(path),
        ..Layers::default()
    })
    .unwrap();
    let beta = &l.config.flags["beta"];
    assert!(beta.enabled && beta.allow == ["alice"] && beta.deny.is_empty());
    assert_eq!(l.source("flags.beta.deny"), &Source::Default);
    assert!(l.config.flag("beta", "alice"));
    // A file flag can then be overridden from the environment.
    let path = file("[flags.beta]\nenabled = true\n");
    let l = load(&Layers {
        file: Some(path),
        env: env(&[("INGOT_FLAG_BETA", "off")]),
        ..Layers::default()
    })
    .unwrap();
    assert!(!l.config.flags["beta"].enabled);

    let path = file("[flags.Beta-2]\nenabled = true\n");
    let e = err(&Layers {
        file: Some(path.clone()),
        ..Layers::default()
    });
    assert_eq!(
        e,
        format!(
            "flags.Beta-2 ({}:1): invalid flag name; use lowercase letters, digits and _",
            path.display()
        )
    );
    let path = file("[flags.beta]\nrollout_percent = 12.345\n");
    let e = err(&Layers {
        file: Some(path),
        ..Layers::default()
    });
    assert!(
        e.starts_with("flags.beta.rollout_percent = 12.345 ("),
        "{e}"
    );
    assert!(
        e.ends_with("at most two decimals (the rollout has 10000 buckets)"),
        "{e}"
    );
}

#[test]
fn unreadable_and_malformed_files_are_one_line() {
    let e = err(&Layers {
        file: Some(PathBuf::from("/nonexistent/ingot.toml")),
        ..Layers::default()
    });
    assert!(
        e.starts_with("/nonexistent/ingot.toml: cannot read the config file: "),
        "{e}"
    );
    let path = file("[server]\nport = 80\n[scheduler\n");
    let e = err(&Layers {
        file: Some(path.clone()),
        ..Layers::default()
    });
    assert!(
        e.starts_with(&format!("{}:3: invalid TOML: ", path.display())),
        "{e}"
    );
}

#[test]
fn error_helper_names_value_and_source() {
    let l = load(&Layers {
        env: env(&[("INGOT_LOG", "verbose")]),
        ..Layers::default()
    })
    .unwrap();
    assert_eq!(
        l.error("log.level", "not a tracing filter").to_string(),
        "log.level = \"verbose\" (env INGOT_LOG): not a tracing filter"
    );
}

#[test]
fn the_example_file_loads_and_matches_the_defaults() {
    let path = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../ingot.example.toml"
    ));
    let l = load(&Layers {
        file: Some(path),
        ..Layers::default()
    })
    .unwrap();
    // The example spells out the defaults (model.path aside, which has none).
    let mut want = Config::default();
    want.model.path = l.config.model.path.clone();
    assert_eq!(l.config, want);
}

#[test]
fn schema_describes_every_section() {
    let s = schema();
    let props = s["properties"].as_object().unwrap();
    for section in [
        "model",
        "engine",
        "scheduler",
        "server",
        "cache",
        "cuda",
        "structured",
        "log",
        "redis",
        "flags",
    ] {
        assert!(props.contains_key(section), "{section}");
    }
    assert_eq!(s["additionalProperties"], json!(false));
}

#[test]
fn kv_cache_dtype_is_auto_unless_set_and_needs_a_restart() {
    assert_eq!(Config::default().model.kv_cache_dtype, KvCacheDtype::Auto);
    let l = load(&Layers {
        file: Some(file("[model]\nkv_cache_dtype = \"fp8\"\n")),
        ..Layers::default()
    })
    .unwrap();
    assert_eq!(l.config.model.kv_cache_dtype, KvCacheDtype::Fp8);
    let l = load(&Layers {
        env: env(&[("INGOT_MODEL_KV_CACHE_DTYPE", "bf16")]),
        ..Layers::default()
    })
    .unwrap();
    assert_eq!(l.config.model.kv_cache_dtype, KvCacheDtype::Bf16);
    let e = load(&Layers {
        env: env(&[("INGOT_MODEL_KV_CACHE_DTYPE", "fp4")]),
        ..Layers::default()
    })
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("model.kv_cache_dtype") && e.contains("fp8"),
        "{e}"
    );
    let mut new = Config::default();
    new.model.kv_cache_dtype = KvCacheDtype::Fp8;
    assert_eq!(
        diff(&Config::default(), &new).needs_restart,
        ["model.kv_cache_dtype"]
    );
}

#[test]
fn fp8_ignore_is_empty_by_default_and_needs_fp8() {
    assert_eq!(Config::default().model.fp8_ignore, "");
    let l = load(&Layers {
        file: Some(file(
            "[model]\nquantization = \"fp8\"\nfp8_ignore = \"down_proj,layers.0\"\n",
        )),
        ..Layers::default()
    })
    .unwrap();
    assert_eq!(l.config.model.fp8_ignore, "down_proj,layers.0");
    let e = load(&Layers {
        env: env(&[("INGOT_MODEL_FP8_IGNORE", "down_proj")]),
        ..Layers::default()
    })
    .unwrap_err()
    .to_string();
    assert!(e.contains("model.fp8_ignore") && e.contains("fp8"), "{e}");
    let mut new = Config::default();
    new.model.quantization = Quantization::Fp8;
    new.model.fp8_ignore = "down_proj".into();
    assert_eq!(
        diff(&Config::default(), &new).needs_restart,
        ["model.fp8_ignore", "model.quantization"]
    );
}

#[test]
fn fp8_lm_head_is_off_by_default_and_needs_fp8() {
    assert!(!Config::default().model.fp8_lm_head);
    let l = load(&Layers {
        file: Some(file(
            "[model]\nquantization = \"fp8\"\nfp8_lm_head = true\n",
        )),
        ..Layers::default()
    })
    .unwrap();
    assert!(l.config.model.fp8_lm_head);
    let e = load(&Layers {
        env: env(&[("INGOT_MODEL_FP8_LM_HEAD", "true")]),
        ..Layers::default()
    })
    .unwrap_err()
    .to_string();
    assert!(e.contains("model.fp8_lm_head") && e.contains("fp8"), "{e}");
    let mut new = Config::default();
    new.model.quantization = Quantization::Fp8;
    new.model.fp8_lm_head = true;
    assert_eq!(
        diff(&Config::default(), &new).needs_restart,
        ["model.fp8_lm_head", "model.quantization"]
    );
}

#[test]
fn log_format_is_text_or_json_and_needs_a_restart() {
    assert_eq!(Config::default().log.format, LogFormat::Text);
    let l = load(&Layers {
        env: env(&[("INGOT_LOG_FORMAT", "json")]),
        ..Layers::default()
    })
    .unwrap();
    assert_eq!(l.config.log.format, LogFormat::Json);
    let l = load(&Layers {
        file: Some(file("[log]\nformat = \"text\"\n")),
        ..Layers::default()
    })
    .unwrap();
    assert_eq!(l.config.log.format, LogFormat::Text);
    let e = load(&Layers {
        env: env(&[("INGOT_LOG_FORMAT", "pretty")]),
        ..Layers::default()
    })
    .unwrap_err()
    .to_string();
    assert!(e.contains("log.format"), "{e}");
    let mut new = Config::default();
    new.log.format = LogFormat::Json;
    let r = diff(&Config::default(), &new);
    assert_eq!(r.needs_restart, ["log.format"]);
    assert!(r.applied.is_empty());
}

#[test]
fn tracing_section_defaults_and_bounds() {
    let t = Config::default().tracing;
    assert_eq!(
        (t.otlp_endpoint, t.sample_ratio, t.service_name.as_str()),
        (None, 1.0, "ingot")
    );
    let l = load(&Layers {
        env: env(&[
            ("INGOT_TRACING_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
            ("INGOT_TRACING_SAMPLE_RATIO", "0.25"),
        ]),
        ..Layers::default()
    })
    .unwrap();
    assert_eq!(
        l.config.tracing.otlp_endpoint.as_deref(),
        Some("http://127.0.0.1:4318")
    );
    assert_eq!(l.config.tracing.sample_ratio, 0.25);
    for (k, v, key) in [
        ("INGOT_TRACING_SAMPLE_RATIO", "1.5", "tracing.sample_ratio"),
        (
            "INGOT_TRACING_OTLP_ENDPOINT",
            "localhost:4318",
            "tracing.otlp_endpoint",
        ),
        ("INGOT_TRACING_SERVICE_NAME", " ", "tracing.service_name"),
    ] {
        let e = load(&Layers {
            env: env(&[(k, v)]),
            ..Layers::default()
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains(key), "{e}");
    }
}

#[test]
fn structured_close_near_limit_is_on_unless_turned_off() {
    assert!(Config::default().structured.close_near_limit);
    let l = load(&Layers {
        env: env(&[("INGOT_STRUCTURED_CLOSE_NEAR_LIMIT", "false")]),
        ..Layers::default()
    })
    .unwrap();
    assert!(!l.config.structured.close_near_limit);
    let path = file("[structured]\nclose_near_limit = \"no\"\n");
    let e = err(&Layers {
        file: Some(path),
        ..Layers::default()
    });
    assert!(e.contains("structured.close_near_limit"), "{e}");
}

#[test]
fn redis_is_off_by_default_and_its_rules_name_the_key() {
    let l = load(&Layers::default()).unwrap();
    assert!(!l.config.redis.enabled());
    let on = |text: &str| Layers {
        file: Some(file(text)),
        ..Layers::default()
    };
    let l = load(&on(
        "[redis]\nurl = \"redis://127.0.0.1:6379\"\ncommand_timeout = \"50ms\"\n",
    ))
    .unwrap();
    assert!(l.config.redis.enabled());
    assert_eq!(l.config.redis.command_timeout.get().as_millis(), 50);
    let e = err(&on("[redis]\nurl = \"http://127.0.0.1:6379\"\n"));
    assert!(e.contains("redis.url"), "{e}");
    let e = err(&on(
        "[redis]\nheartbeat_interval = \"5s\"\nheartbeat_ttl = \"5s\"\n",
    ));
    assert!(e.contains("redis.heartbeat_ttl"), "{e}");
    let e = err(&on("[redis]\nnamespace = \"a b\"\n"));
    assert!(e.contains("redis.namespace"), "{e}");
    let e = err(&on("[redis]\nurl = \"redis://x\"\nbogus = 1\n"));
    assert!(e.contains("bogus"), "{e}");
}

fn from_file(text: &str) -> Layers {
    Layers {
        file: Some(file(text)),
        ..Layers::default()
    }
}

#[test]
fn slos_and_remediation_load_with_their_targets() {
    let l = load(&from_file(
        "[[slo]]\ntier = \"high\"\nmetric = \"ttft\"\nquantile = 0.95\ntarget = \"500ms\"\n\
         [[slo]]\nmetric = \"error_rate\"\ntarget = 0.01\n\
         [remediation]\nmode = \"dry_run\"\n[remediation.shed]\nhow = \"delay\"\n",
    ))
    .unwrap();
    let c = &l.config;
    assert_eq!(c.slo.len(), 2);
    assert_eq!(c.slo[0].target.value(), 0.5);
    assert_eq!(c.slo[0].label(), "ttft_p95_high");
    assert_eq!(c.slo[1].target, SloTarget::Ratio(0.01));
    assert_eq!(c.slo[1].label(), "error_rate_all");
    assert_eq!(c.remediation.mode, RemediationMode::DryRun);
    assert_eq!(c.remediation.shed.how, ShedHow::Delay);
    // Off by default: remediation changes latency and answers' routing.
    assert_eq!(Config::default().remediation.mode, RemediationMode::Off);
    assert!(!Config::default().remediation.batching.enabled);
}

#[test]
fn bad_slos_are_refused_with_their_key() {
    let cases = [
        ("[[slo]]\ntier = \"urgent\"\n", "slo[0].tier"),
        (
            "[[slo]]\nmetric = \"ttft\"\ntarget = 0.5\n",
            "slo[0].target",
        ),
        (
            "[[slo]]\nmetric = \"error_rate\"\ntarget = \"1s\"\n",
            "slo[0].target",
        ),
        (
            "[[slo]]\nmetric = \"error_rate\"\ntarget = 1.5\n",
            "slo[0].target",
        ),
        ("[[slo]]\nquantile = 0\n", "slo[0].quantile"),
        ("[[slo]]\nwindow = \"0s\"\n", "slo[0].window"),
        (
            "[[slo]]\ntier = \"high\"\n[[slo]]\ntier = \"high\"\n",
            "slo[1]",
        ),
        ("[[slo]]\nmetrc = \"ttft\"\n", "metrc"),
        ("[remediation]\nmode = \"yes\"\n", "remediation.mode"),
        (
            "[remediation.shed]\ntiers = [\"critical\"]\n",
            "remediation.shed.tiers",
        ),
        (
            "[remediation.shed]\ntiers = [\"low\", \"low\"]\n",
            "remediation.shed.tiers",
        ),
        (
            "[remediation.shed]\nexit_ratio = 1.5\n",
            "remediation.shed.exit_ratio",
        ),
        (
            "[remediation.batching]\nmin_tokens = 4\n",
            "remediation.batching.min_tokens",
        ),
        (
            "[remediation.batching]\nmin_tokens = 64\nmax_tokens = 32\n",
            "remediation.batching.max_tokens",
        ),
        (
            "[remediation.batching]\nband = 1\n",
            "remediation.batching.band",
        ),
    ];
    for (text, key) in cases {
        let e = err(&from_file(text));
        assert!(e.contains(key), "{text:?}: {e}");
    }
}

#[test]
fn a_lowered_step_budget_caps_prefill_only_steps_unless_they_are_set() {
    let mut s = crate::SchedulerSection::default();
    assert_eq!(s.prefill_only_tokens(), 2048);
    s.max_num_batched_tokens = 32;
    assert_eq!(s.prefill_only_tokens(), 32);
    s.max_prefill_only_tokens = 1024;
    assert_eq!(s.prefill_only_tokens(), 1024);
    s.max_prefill_only_tokens = 0;
    assert_eq!(s.prefill_only_tokens(), 0);
    s.max_num_batched_tokens = 4096;
    s.max_prefill_only_tokens = 2048;
    assert_eq!(s.prefill_only_tokens(), 2048);
}

#[test]
fn kv_tiers_are_off_by_default_checked_and_need_a_restart() {
    let c = Config::default();
    assert!(!c.kv_tiers.enabled() && !c.redis.share_kv);
    let ok = load(&Layers {
        file: Some(file(
            "[kv_tiers]\nhost_bytes = \"4GiB\"\ndisk_path = \"/tmp/kv\"\ndisk_bytes = \"1GiB\"\n\
             [redis]\nurl = \"redis://127.0.0.1:6379\"\nshare_kv = true\n",
        )),
        ..Layers::default()
    })
    .unwrap();
    assert_eq!(ok.config.kv_tiers.host_bytes.bytes(), 4 << 30);
    for (toml, key) in [
        (
            "[kv_tiers]\ndisk_path = \"/tmp/kv\"\n",
            "kv_tiers.disk_bytes",
        ),
        ("[kv_tiers]\ndisk_bytes = \"1GiB\"\n", "kv_tiers.disk_path"),
        ("[redis]\nshare_kv = true\n", "redis.share_kv"),
        (
            "[redis]\nurl = \"redis://127.0.0.1:6379\"\nshare_kv = true\n",
            "redis.share_kv",
        ),
    ] {
        let e = load(&Layers {
            file: Some(file(toml)),
            ..Layers::default()
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains(key), "{toml}: {e}");
    }
    let mut new = Config::default();
    new.kv_tiers.host_bytes = crate::ByteSize::mib(512);
    assert_eq!(diff(&c, &new).needs_restart, ["kv_tiers.host_bytes"]);
}
