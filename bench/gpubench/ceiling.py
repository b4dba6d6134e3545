"""The read ceiling every "% of ceiling" divides by: bench/probe/read_probe.cu (plain CUDA C,
16-byte loads, the best of its grid x block x loads-in-flight configurations, median of
repeats over a 4 GiB buffer of random data), called through ctypes in the bench's own
process. The library comes from CMake (build/libfd_read_probe.so) or, when that file is
missing, from nvcc run here. A bench row above 100 % of it means the probe is wrong."""
import ctypes
import os
import shutil
import subprocess
import tempfile

from benchutil import REPO

from .common import CEILING_BYTES, GIB, SETTINGS, exc_text, short
from .timing import time_events

PROBE_SRC = os.path.join(REPO, "bench", "probe", "read_probe.cu")
PROBE_LIB = "libfd_read_probe.so"
NVCC_FLAGS = ["-O3", "-gencode=arch=compute_90a,code=sm_90a", "-Xcompiler", "-fPIC", "-shared"]


def find_nvcc():
    for cand in (shutil.which("nvcc"),
                 os.path.join(os.environ.get("CUDA_HOME", ""), "bin", "nvcc"),
                 "/usr/local/cuda/bin/nvcc"):
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    return None


def probe_candidates():
    """Where a built probe may be: $FD_READ_PROBE_LIBRARY, beside $FLASHDECODE_LIBRARY, build/."""
    out = []
    if os.environ.get("FD_READ_PROBE_LIBRARY"):
        out.append(os.environ["FD_READ_PROBE_LIBRARY"])
    lib = os.environ.get("FLASHDECODE_LIBRARY")
    if lib:
        out.append(os.path.join(os.path.dirname(os.path.abspath(lib)), PROBE_LIB))
    out.append(os.path.join(REPO, "build", PROBE_LIB))
    return list(dict.fromkeys(out))


def build_probe(out_dir=None, timeout=180):
    """Compile read_probe.cu with nvcc; (path, '') or (None, why)."""
    nvcc = find_nvcc()
    if nvcc is None:
        return None, "nvcc not found (PATH, $CUDA_HOME/bin, /usr/local/cuda/bin)"
    out_dir = out_dir or tempfile.mkdtemp(prefix="fd-read-probe-")
    path = os.path.join(out_dir, PROBE_LIB)
    cmd = [nvcc] + NVCC_FLAGS + ["-o", path, PROBE_SRC]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except Exception as exc:
        return None, f"nvcc failed to run: {exc_text(exc)}"
    if r.returncode != 0 or not os.path.exists(path):
        return None, f"nvcc exit {r.returncode}: {short(r.stderr or r.stdout, 200)}"
    return path, ""


def load_probe():
    """(ctypes library, path, how) or (None, None, why)."""
    why = []
    src_mtime = os.path.getmtime(PROBE_SRC) if os.path.exists(PROBE_SRC) else 0
    for cand in probe_candidates():
        if not os.path.exists(cand):
            continue
        if os.path.getmtime(cand) < src_mtime and "FD_READ_PROBE_LIBRARY" not in os.environ:
            why.append(f"{cand} older than read_probe.cu")
            continue
        try:
            return _declare(ctypes.CDLL(cand)), cand, "built by CMake" if cand.endswith(
                os.path.join("build", PROBE_LIB)) else "prebuilt"
        except OSError as exc:
            why.append(f"{cand}: {short(exc, 80)}")
    path, err = build_probe()
    if path is None:
        return None, None, "; ".join(why + [err])
    try:
        return _declare(ctypes.CDLL(path)), path, "compiled by nvcc at run time"
    except OSError as exc:
        return None, None, "; ".join(why + [f"{path}: {short(exc, 80)}"])


def _declare(lib):
    lib.fdp_read_probe.restype = ctypes.c_int
    lib.fdp_read_probe.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                                   ctypes.POINTER(ctypes.c_double), ctypes.c_int,
                                   ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
    lib.fdp_num_configs.restype = ctypes.c_int
    lib.fdp_version.restype = ctypes.c_int
    return lib


def sass_loads(path):
    """'yes (N LDG.E.128)', 'no' or 'unknown (...)': are the probe's loads 16 bytes wide."""
    tool = shutil.which("cuobjdump") or (os.path.join(os.path.dirname(find_nvcc()), "cuobjdump")
                                         if find_nvcc() else None)
    if not tool or not os.path.exists(tool):
        return "unknown (no cuobjdump)"
    try:
        r = subprocess.run([tool, "--dump-sass", path], capture_output=True, text=True, timeout=60)
    except Exception as exc:
        return f"unknown ({exc_text(exc, 60)})"
    n = sum(1 for line in r.stdout.splitlines() if "LDG.E.128" in line)
    return f"yes ({n} LDG.E.128)" if n else "no"


def run_probe(lib, torch, x, reps, sm_count):
    """Best median TB/s over the probe's configurations, and their list."""
    n_cfg = int(lib.fdp_num_configs())
    tbps = (ctypes.c_double * n_cfg)()
    desc = ctypes.create_string_buffer(4096)
    err = ctypes.create_string_buffer(512)
    torch.cuda.synchronize()
    rc = lib.fdp_read_probe(ctypes.c_void_p(x.data_ptr()), x.numel() * x.element_size(), reps,
                            sm_count, tbps, n_cfg, desc, len(desc), err, len(err))
    if rc != 0:
        raise RuntimeError(f"fdp_read_probe returned {rc}: {err.value.decode(errors='replace')}")
    vals = list(tbps)
    best = max(range(n_cfg), key=lambda i: vals[i])
    return vals[best], best, desc.value.decode(errors="replace")


def measure_ceiling(torch, sm_count, reps):
    """(read ceiling TB/s, how it was measured, d2d copy TB/s for information)."""
    n = CEILING_BYTES // 4
    x = torch.randint(-(1 << 30), 1 << 30, (n,), dtype=torch.int32, device=SETTINGS.device)
    best, desc = None, ""
    lib, path, how = load_probe()
    if lib is not None:
        try:
            tb, idx, cfgs = run_probe(lib, torch, x, reps, sm_count)
            best = tb
            desc = (f"CUDA C read probe bench/probe/read_probe.cu ({how}: {path}); 16-byte loads "
                    f"in SASS: {sass_loads(path)}; best config #{idx}; "
                    f"{CEILING_BYTES / GIB:.0f} GiB of random int32, median of {reps} per config; "
                    f"configs (threads x loads in flight @ blocks/SM TB/s): {cfgs}")
        except Exception as exc:
            how = f"probe failed: {exc_text(exc, 200)}"
    if best is None:
        xf = x.view(torch.float32)
        t = time_events(torch, lambda: xf.sum(), reps)
        best = n * 4 / t / 1e12
        desc = (f"FALLBACK torch.sum over the 4 GiB buffer, NOT the CUDA C probe ({how}); "
                "percentages of this ceiling are suspect")
    # Device-to-device copy, for information: (read + write) bytes per second.
    copy_tbps = None
    try:
        half = n // 2
        src = x[:half]
        dst = torch.empty_like(src)
        t = time_events(torch, lambda: dst.copy_(src), reps)
        copy_tbps = 2 * half * 4 / t / 1e12
        dst = None
    except Exception:
        pass
    x = None
    torch.cuda.empty_cache()
    return best, desc, copy_tbps
