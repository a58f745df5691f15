//! Compiles `cuda/*.cu` with nvcc into a cubin for sm_90 (H100/H200) and PTX
//! for compute_80 (JIT on other GPUs from Ampere on), embedded by `src/lib.rs`.
//!
//! nvcc is optional: without it the crate builds with no kernels and the CUDA
//! runner reports that at start-up. When nvcc is found, a kernel that does not
//! compile fails the build. Set `INGOT_REQUIRE_CUDA_KERNELS=1` to make a
//! missing nvcc an error too (CI does).

use std::env;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

const SOURCES: &[&str] = &[
    "elementwise",
    "rope",
    "attention",
    "gemv",
    "fused_block",
    "sampling",
    "encoder",
    "fp8",
];

fn main() {
    println!("cargo:rerun-if-changed=cuda");
    for var in [
        "NVCC",
        "CUDA_HOME",
        "INGOT_CACHE",
        "INGOT_REQUIRE_CUDA_KERNELS",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let mut generated = String::from(
        "/// Kernel modules compiled into this build.\npub static MODULES: &[Module] = &[\n",
    );
    match find_nvcc() {
        Some(nvcc) => {
            for name in SOURCES {
                let src = format!("cuda/{name}.cu");
                let cubin = out.join(format!("{name}.sm_90.cubin"));
                let ptx = out.join(format!("{name}.compute_80.ptx"));
                compile(&nvcc, &src, &["-cubin", "-arch=sm_90"], &cubin);
                compile(&nvcc, &src, &["-ptx", "-arch=compute_80"], &ptx);
                let _ = writeln!(
                    generated,
                    "    Module {{ name: {name:?}, cubin_sm90: include_bytes!({:?}), ptx_compute80: include_str!({:?}) }},",
                    cubin.display(),
                    ptx.display()
                );
            }
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
