"""Runs the ingot binary for the GPU comparison scripts (imported from
tests/gpu, which Python puts on the path when a script there runs)."""
import subprocess
import sys


def ingot(binary, *args):
    """Runs `binary args...`; on failure prints the end of its stderr and
    exits naming the subcommand."""
    r = subprocess.run([binary, *args], capture_output=True, text=True)
    if r.returncode != 0:
        sys.stderr.write(r.stderr[-4000:])
        raise SystemExit(f"ingot {' '.join(args[:5])} failed")
    return r
