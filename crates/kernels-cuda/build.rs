//! Compiles `cuda/*.cu` with nvcc into a cubin for sm_90 (H100/H200) and PTX
//! for compute_80 (JIT on other GPUs from Ampere on), embedded by `src/lib.rs`.
//!
//! nvcc is optional: without it the crate builds with no kernels and the CUDA
//! runner reports that at start-up. When nvcc is found, a kernel that does not
//! compile fails the build. Set `INGOT_REQUIRE_CUDA_KERNELS=1` to make a
//! missing nvcc an error too (CI does).
//!
//! `INGOT_CUDA_KERNELS_CHECK_ONLY=1` compiles every kernel for sm_90 only,
//! with device optimisation off (NVVM and ptxas at -O0): the front end and
//! ptxas's resource checks still run, in about a quarter of the CPU time (74
//! s against 258 s on the 2-core CI machine, docs/benchmarks.md "CI wall
//! time"); the families instantiated per batch size 1..8 take 1, 2 and 8
//! only (`EACH_N_1_TO_8` in common.cuh: 85 CPU-s to ~50), and the compute_80
//! PTX is an empty stub (19 CPU-s; its `__CUDA_ARCH__ < 900` paths are
//! compiled by every release build and GPU bundle). Such a build cannot run
//! them: the CUDA runner refuses it. CI sets it, since it never runs a
//! kernel; release builds and the GPU bundle do not.

use std::env;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Largest first: they are compiled in parallel, and the long ones decide
/// when the crate is ready (runner-cuda and the binary wait for it).
const SOURCES: &[&str] = &[
    "gemv",
    "gemv_kq",
    "gemv_tc",
    "fused_block",
    "attention",
    "sampling",
    "rope",
    "elementwise",
    "encoder",
    "fp8",
    "moe",
    "collective",
    "quant",
];

fn main() {
    println!("cargo:rerun-if-changed=cuda");
    for var in [
        "NVCC",
        "CUDA_HOME",
        "INGOT_CACHE",
        "INGOT_REQUIRE_CUDA_KERNELS",
        "INGOT_CUDA_KERNELS_CHECK_ONLY",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let check_only = env::var("INGOT_CUDA_KERNELS_CHECK_ONLY").is_ok_and(|v| v == "1");
    let mut generated = format!(
        "/// Whether the kernels were compiled unoptimised, only to check them.\n\
         pub const CHECK_ONLY: bool = {check_only};\n\
         /// Kernel modules compiled into this build.\npub static MODULES: &[Module] = &[\n"
    );
    match find_nvcc() {
        Some(nvcc) => {
            let mut jobs = Vec::new();
            for name in SOURCES {
                let cubin = out.join(format!("{name}.sm_90.cubin"));
                let ptx = out.join(format!("{name}.compute_80.ptx"));
                let _ = writeln!(
                    generated,
                    "    Module {{ name: {name:?}, cubin_sm90: include_bytes!({:?}), ptx_compute80: include_str!({:?}) }},",
                    cubin.display(),
                    ptx.display()
                );
                if check_only {
                    // The PTX is only a JIT fallback for other GPUs, and a
                    // check-only build runs nothing: an empty module.
                    std::fs::write(&ptx, "// check-only build: no PTX\n").expect("write PTX stub");
                    jobs.push((
                        format!("cuda/{name}.cu"),
                        &[
                            "-cubin",
                            "-arch=sm_90",
                            "-Xcicc",
                            "-O0",
                            "-Xptxas",
                            "-O0",
                            "-DINGOT_CHECK_ONLY",
                        ][..],
                        cubin,
                    ));
                } else {
                    jobs.push((
                        format!("cuda/{name}.cu"),
                        &["-cubin", "-arch=sm_90"][..],
                        cubin,
                    ));
                    jobs.push((
                        format!("cuda/{name}.cu"),
                        &["-ptx", "-arch=compute_80"][..],
                        ptx,
                    ));
                }
            }
            compile_all(&nvcc, &jobs);
        }
        None => {
            if env::var("INGOT_REQUIRE_CUDA_KERNELS").is_ok_and(|v| v == "1") {
                panic!("INGOT_REQUIRE_CUDA_KERNELS=1 but no nvcc was found (set NVCC or CUDA_HOME, or run scripts/fetch-nvcc)");
            }
            println!("cargo:warning=nvcc not found: building without CUDA kernels (the CUDA backend will be unavailable)");
        }
    }
    generated.push_str("];\n");
    std::fs::write(out.join("modules.rs"), generated).expect("write modules.rs");
}

/// `$NVCC`, `$CUDA_HOME/bin/nvcc`, the pinned PyPI nvcc of `scripts/fetch-nvcc`,
/// `nvcc` on PATH, then `/usr/local/cuda/bin/nvcc`.
fn find_nvcc() -> Option<PathBuf> {
    let cache = env::var("INGOT_CACHE").map(PathBuf::from).ok().or_else(|| {
        env::var("HOME")
            .ok()
            .map(|h| Path::new(&h).join(".cache/ingot"))
    });
    let candidates = [
        env::var("NVCC").ok().map(PathBuf::from),
        env::var("CUDA_HOME")
            .ok()
            .map(|h| Path::new(&h).join("bin/nvcc")),
        cache.map(|c| c.join("nvcc/pkgs/nvidia/cu13/bin/nvcc")),
        Some(PathBuf::from("nvcc")),
        Some(PathBuf::from("/usr/local/cuda/bin/nvcc")),
    ];
    candidates.into_iter().flatten().find(|p| {
        Command::new(p)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

/// Runs the nvcc jobs on as many threads as cargo gives this build script
/// (`NUM_JOBS`), in order: each of the 16 runs is single-threaded.
fn compile_all(nvcc: &Path, jobs: &[(String, &[&str], PathBuf)]) {
    let threads = env::var("NUM_JOBS")
        .ok()
        .and_then(|n| n.parse::<usize>().ok())
        .unwrap_or(1)
        .clamp(1, jobs.len());
    let next = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                while let Some((src, flags, dst)) = jobs.get(next.fetch_add(1, Ordering::Relaxed)) {
                    compile(nvcc, src, flags, dst);
                }
            });
        }
    });
}

fn compile(nvcc: &Path, src: &str, flags: &[&str], dst: &Path) {
    let output = Command::new(nvcc)
        .args(flags)
        .args(["-O3", "-std=c++17", "--use_fast_math", "-Icuda", "-o"])
        .arg(dst)
        .arg(src)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", nvcc.display()));
    if !output.status.success() {
        panic!(
            "nvcc failed on {src} ({}):\n{}{}",
            flags.join(" "),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}
