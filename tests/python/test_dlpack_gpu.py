"""test_dlpack_gpu.py — CuPy and JAX CUDA arrays through DLPack (each skipped when
not installed or without a GPU); results must come back in the caller's framework
and match the torch path bitwise."""
import os

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("torch.cuda is not available", allow_module_level=True)

import flashdecode  # noqa: E402
from cases import Case, make_case  # noqa: E402

CASE = Case("dlpack", 2, 1, 16, 4, 128, [300, 17], capacity=512)


def torch_inputs():
    q, k, v, kv_len, _ = make_case(CASE)
    conv = [torch.from_numpy(x).to(device="cuda", dtype=torch.float16) for x in (q, k, v)]
    return conv + [torch.from_numpy(kv_len).cuda()]


def test_cupy_arrays():
    cupy = pytest.importorskip("cupy")
    q, k, v, kv_len = torch_inputs()
    want, want_lse = flashdecode.decode(q, k, v, kv_len, return_lse=True)
    args = [cupy.from_dlpack(x) for x in (q, k, v, kv_len)]
    out, lse = flashdecode.decode(*args, return_lse=True)
    assert isinstance(out, cupy.ndarray) and isinstance(lse, cupy.ndarray)
    assert torch.equal(torch.from_dlpack(out), want)
    assert torch.equal(torch.from_dlpack(lse), want_lse)
    # into a caller's CuPy buffer, through a plan
    plan = flashdecode.DecodePlan(batch=2, num_heads_q=16, num_heads_kv=4, head_dim=128,
                                  dtype="f16", kv_capacity=512, device="cuda")
    buf = cupy.empty(out.shape, dtype=out.dtype)
    assert plan.run(*args, out=buf) is buf
    cupy.cuda.get_current_stream().synchronize()
    torch.cuda.synchronize()
    assert torch.equal(torch.from_dlpack(buf), want)


def test_jax_arrays():
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # leave memory to torch
    jax = pytest.importorskip("jax")
    try:
        gpu = jax.devices("gpu")[0]
    except RuntimeError:
        pytest.skip("jax has no GPU backend here")
    import jax.dlpack
    import numpy as np

    q, k, v, kv_len = torch_inputs()
    want = flashdecode.decode(q, k, v, kv_len)
    args = [jax.device_put(x.cpu().numpy(), gpu) for x in (q, k, v, kv_len)]
    out = flashdecode.decode(*args)
    assert isinstance(out, jax.Array)
    np.testing.assert_array_equal(np.asarray(out), want.cpu().numpy())
