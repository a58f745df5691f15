"""`--quantization fp8` is CUDA-only: on the CPU the real binary refuses it at
start-up with one clear error naming the key (the FP8 path itself is checked
on the GPU machine: tests/gpu/check_fp8.py, compare_fp8.py)."""
import os
import subprocess

from ingot_e2e import BIN, model_path


def ingot(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN), *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "NO_COLOR": "1"})


def test_fp8_weights_are_refused_on_the_cpu():
    out = ingot("generate", "--model", model_path(), "--device", "cpu", "--quantization", "fp8",
                "--prompt", "Hello", "--max-tokens", "1")
    assert out.returncode != 0, f"expected a refusal, got 0\n{out.stdout}\n{out.stderr}"
    assert 'model.quantization = "fp8" needs the CUDA backend' in out.stderr, out.stderr
    assert "--device cpu" in out.stderr, out.stderr
    # The same binary and model run on the CPU without it.
    ok = ingot("generate", "--model", model_path(), "--device", "cpu", "--prompt", "Hello", "--max-tokens", "1")
    assert ok.returncode == 0, ok.stderr


def test_fp8_lm_head_without_fp8_weights_is_refused():
    """`--fp8-lm-head` puts the LM head in FP8 next to FP8 layer matrices: alone it is
    refused at start-up, naming the key and what it needs, rather than ignored."""
    out = ingot("generate", "--model", model_path(), "--device", "cpu", "--fp8-lm-head",
                "--prompt", "Hello", "--max-tokens", "1")
    assert out.returncode != 0, f"expected a refusal, got 0\n{out.stdout}\n{out.stderr}"
    assert "model.fp8_lm_head" in out.stderr, out.stderr
    assert 'needs model.quantization = "fp8"' in out.stderr, out.stderr
