import time, statistics, torch, flashdecode as fd
torch.set_num_threads(2)
B, H, N = 1, 16, 16384
sets = 60   # 60 x 18.9 MB = 1.1 GB rotated (cold)
def make(combined):
    out = []
    for _ in range(sets):
        if combined:
            c = torch.randn(B, N, 576, dtype=torch.bfloat16)
            out.append((c[..., :512], c[..., 512:]))
        else:
            out.append((torch.randn(B, N, 512, dtype=torch.bfloat16), torch.randn(B, N, 64, dtype=torch.bfloat16)))
    return out
qn = torch.randn(B, H, 512, dtype=torch.bfloat16); qp = torch.randn(B, H, 64, dtype=torch.bfloat16)
kv = torch.full((B,), N, dtype=torch.int32)
for combined in (False, True, False, True):
    caches = make(combined)
    for i in range(5): fd.mla_decode(qn, qp, caches[i][0], caches[i][1], kv, softmax_scale=192**-0.5)
    ts = []
    for it in range(3 * sets):
        ckv, kpe = caches[it % sets]
        t0 = time.perf_counter(); fd.mla_decode(qn, qp, ckv, kpe, kv, softmax_scale=192**-0.5); ts.append(time.perf_counter() - t0)
    us = statistics.median(ts) * 1e6
    print(("combined 576-wide" if combined else "two caches"), f"{us:.0f} us", f"{B*N*1152/us/1e3:.2f} GB/s")
    del caches
