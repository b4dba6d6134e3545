/*
 * grid_cases.c — the table of attention cases that test_grid (CPU) and
 * test_gpu_grid (CUDA) run. Not the full cross product: a covering subset in
 * which every listed value appears at least once, most with f32 (the strict
 * tolerance) as well as a 16-bit dtype:
 *   head_dim 8, 40, 64, 80, 96, 100, 128, 256 (CUDA: 8/40 -> 64, 100 -> 128)
 *   dtype f32, f16, bf16;  GQA ratios 1, 2, 4, 8 and MQA 16:1
 *   kv_len 0, 1, 63, 64, 65, 97, 4097, 4099, >= 32768; mixed lengths in a batch
 *   q_len 1, 2, 4, 8, 16 (and q_len > kv_len: rows that see no key)
 *   dense and paged caches (page_size 1, 2, 8, 16, 48, 64, 128, 256), contiguous and
 *   non-contiguous layouts, num_splits 0, 1, 2, 7, 128, 1000 (> chunks),
 *   with and without lse, large softmax_scale, automatic splits on many threads.
 * and the attention variants (variants[], gpu_variants[]):
 *   sliding window_left 0, 1, 3, 63, 64, 65, 127, 128, 1000, 4095 and -1 (= none),
 *   kv_len shorter and longer than the window, q_len 1..16 (each row's window
 *   starts elsewhere), dense and paged, 1/2/7/auto splits; logit soft-cap
 *   50, 30, 20, 1 (with large inputs, where capping bites), 1e38 and 3e38
 *   (the largest finite: no score changes); sinks (rows
 *   that see no key: kv_len 0, q_len > kv_len; a NaN sink); combinations of
 *   the three; non-causal q_len 32, 64, 128 with kv_len 0, 1, 65, 300, 4099
 *   (GQA 8: 1024 rows a kv head); float32 out for f16, bf16 and f32;
 *   head_dim 80 and 96 for every dtype (CUDA runs them as 80 and 96).
 * The CPU grid runs in a few seconds on two cores.
 */
#include "cpu/cpu_kernels.h"
#include "harness.h"

#define F32 FD_DTYPE_F32
#define F16 FD_DTYPE_F16
#define BF16 FD_DTYPE_BF16
#define NONCONTIG FD_LAYOUT_NONCONTIG

/* backend is filled in by fd_grid_cases. */
static const fd_case grid[] = {
    /* every dtype with every head_dim */
    {.dtype = F32, .head_dim = 8, .num_heads_q = 1, .num_heads_kv = 1, .batch = 1, .kv_len = {1}, .q_len = 1, .with_lse = 1},
    {.dtype = F16, .head_dim = 8, .num_heads_q = 2, .num_heads_kv = 1, .batch = 2, .kv_len = {63, 64}, .q_len = 1, .num_splits = 2, .kv_capacity_pad = 100},
    {.dtype = BF16, .head_dim = 8, .num_heads_q = 4, .num_heads_kv = 4, .batch = 1, .kv_len = {65}, .q_len = 2, .page_size = 1, .num_splits = 7, .with_lse = 1, .check_splits = 1},
    {.dtype = F32, .head_dim = 64, .num_heads_q = 8, .num_heads_kv = 8, .batch = 2, .kv_len = {97, 64}, .q_len = 2, .num_splits = 2, .with_lse = 1, .check_splits = 1, .check_determinism = 1},
    {.dtype = F16, .head_dim = 64, .num_heads_q = 4, .num_heads_kv = 2, .batch = 1, .kv_len = {65}, .q_len = 1, .num_splits = 1, .with_lse = 1, .check_splits = 1},
    {.dtype = BF16, .head_dim = 64, .num_heads_q = 8, .num_heads_kv = 1, .batch = 3, .kv_len = {1, 63, 97}, .q_len = 1, .page_size = 16, .layout = NONCONTIG, .with_lse = 1},
    {.dtype = F32, .head_dim = 128, .num_heads_q = 8, .num_heads_kv = 2, .batch = 3, .kv_len = {0, 1, 97}, .q_len = 1, .num_splits = 7, .with_lse = 1, .check_splits = 1},
    {.dtype = F16, .head_dim = 128, .num_heads_q = 16, .num_heads_kv = 4, .batch = 2, .kv_len = {4099, 63}, .q_len = 2, .page_size = 64, .layout = NONCONTIG, .num_splits = 7, .with_lse = 1, .check_splits = 1},
    {.dtype = BF16, .head_dim = 128, .num_heads_q = 32, .num_heads_kv = 8, .batch = 3, .kv_len = {0, 1, 4097}, .q_len = 2, .page_size = 16, .layout = NONCONTIG, .num_splits = 7, .with_lse = 1},
    {.dtype = F32, .head_dim = 256, .num_heads_q = 4, .num_heads_kv = 1, .batch = 1, .kv_len = {4099}, .q_len = 1, .num_splits = 7, .with_lse = 1, .check_splits = 1, .check_determinism = 1},
    {.dtype = F16, .head_dim = 256, .num_heads_q = 2, .num_heads_kv = 2, .batch = 2, .kv_len = {0, 0}, .q_len = 1, .num_splits = 2, .with_lse = 1, .kv_capacity_pad = 200},
    {.dtype = BF16, .head_dim = 256, .num_heads_q = 16, .num_heads_kv = 1, .batch = 2, .kv_len = {97, 65}, .q_len = 4, .num_splits = 2, .with_lse = 1, .check_splits = 1},
    {.dtype = F32, .head_dim = 40, .num_heads_q = 4, .num_heads_kv = 4, .batch = 1, .kv_len = {63}, .q_len = 8, .with_lse = 1},
    {.dtype = F16, .head_dim = 40, .num_heads_q = 16, .num_heads_kv = 1, .batch = 2, .kv_len = {4099, 65}, .q_len = 1, .page_size = 64, .num_splits = 128, .with_lse = 1, .check_splits = 1},
    {.dtype = BF16, .head_dim = 40, .num_heads_q = 8, .num_heads_kv = 2, .batch = 2, .kv_len = {64, 1}, .q_len = 1, .page_size = 256, .layout = NONCONTIG, .num_splits = 1},
    {.dtype = F32, .head_dim = 100, .num_heads_q = 8, .num_heads_kv = 4, .batch = 2, .kv_len = {97, 1}, .q_len = 2, .page_size = 16, .num_splits = 7, .with_lse = 1, .check_splits = 1},
    {.dtype = F16, .head_dim = 100, .num_heads_q = 2, .num_heads_kv = 2, .batch = 1, .kv_len = {64}, .q_len = 1, .page_size = 1, .num_splits = 2, .kv_capacity_pad = 64},
    {.dtype = BF16, .head_dim = 100, .num_heads_q = 8, .num_heads_kv = 8, .batch = 1, .kv_len = {97}, .q_len = 8, .layout = NONCONTIG, .with_lse = 1},
    /* q_len > kv_len: rows that see no key in a non-empty sequence (the
     * combine gets only empty states for them); a split that holds keys no
     * row of the tile may see */
    {.dtype = F32, .head_dim = 64, .num_heads_q = 4, .num_heads_kv = 2, .batch = 3, .kv_len = {1, 2, 3}, .q_len = 4, .num_splits = 2, .with_lse = 1, .kv_capacity_pad = 100, .check_splits = 1},
    {.dtype = F32, .head_dim = 64, .num_heads_q = 4, .num_heads_kv = 2, .batch = 2, .kv_len = {5, 130}, .q_len = 8, .page_size = 16, .layout = NONCONTIG, .num_splits = 7, .with_lse = 1, .check_splits = 1},
    /* q_len 16, the maximum */
    {.dtype = BF16, .head_dim = 64, .num_heads_q = 2, .num_heads_kv = 1, .batch = 1, .kv_len = {97}, .q_len = 16, .page_size = 16, .num_splits = 7, .with_lse = 1},
    /* more splits than chunks; 128 splits kept (130 chunks) */
    {.dtype = F32, .head_dim = 128, .num_heads_q = 8, .num_heads_kv = 2, .batch = 4, .kv_len = {0, 63, 64, 65}, .q_len = 4, .layout = NONCONTIG, .num_splits = 1000, .with_lse = 1, .check_splits = 1, .check_determinism = 1},
    {.dtype = F32, .head_dim = 64, .num_heads_q = 2, .num_heads_kv = 1, .batch = 2, .kv_len = {4099, 8257}, .q_len = 1, .page_size = 64, .num_splits = 128, .with_lse = 1, .check_splits = 1, .check_determinism = 1},
    /* long sequences (>= 32768 keys): one head, head_dim 64 */
    {.dtype = F32, .head_dim = 64, .num_heads_q = 1, .num_heads_kv = 1, .batch = 1, .kv_len = {32769}, .q_len = 1, .with_lse = 1, .check_splits = 1},
    {.dtype = BF16, .head_dim = 64, .num_heads_q = 1, .num_heads_kv = 1, .batch = 1, .kv_len = {40000}, .q_len = 2, .page_size = 256, .layout = NONCONTIG, .num_splits = 128, .with_lse = 1},
    /* automatic split count on many threads, and with spare capacity */
    {.dtype = F32, .head_dim = 64, .num_heads_q = 2, .num_heads_kv = 1, .batch = 1, .kv_len = {4099}, .q_len = 1, .with_lse = 1, .num_threads = 16, .check_splits = 1, .check_determinism = 1},
    {.dtype = F16, .head_dim = 128, .num_heads_q = 4, .num_heads_kv = 2, .batch = 2, .kv_len = {97, 2000}, .q_len = 2, .with_lse = 1, .num_threads = 3, .kv_capacity_pad = 500},
    /* large scores: the online softmax must subtract its running max */
    {.dtype = F32, .head_dim = 128, .num_heads_q = 4, .num_heads_kv = 1, .batch = 2, .kv_len = {97, 200}, .q_len = 1, .num_splits = 7, .with_lse = 1, .softmax_scale = 8.0f, .check_splits = 1},
    {.dtype = BF16, .head_dim = 64, .num_heads_q = 4, .num_heads_kv = 1, .batch = 1, .kv_len = {1000}, .q_len = 1, .page_size = 16, .num_splits = 7, .with_lse = 1, .softmax_scale = 8.0f},
    /* ragged batches */
    {.dtype = F32, .head_dim = 64, .num_heads_q = 4, .num_heads_kv = 1, .batch = 8, .kv_len = {0, 1, 63, 64, 65, 97, 128, 4099}, .q_len = 2, .page_size = 16, .num_splits = 7, .with_lse = 1, .check_determinism = 1},
    {.dtype = BF16, .head_dim = 128, .num_heads_q = 8, .num_heads_kv = 2, .batch = 6, .kv_len = {1, 2, 3, 64, 300, 0}, .q_len = 1, .layout = NONCONTIG, .with_lse = 1, .kv_capacity_pad = 77},
    {.dtype = F16, .head_dim = 64, .num_heads_q = 16, .num_heads_kv = 8, .batch = 1, .kv_len = {300}, .q_len = 4, .page_size = 64, .num_splits = 2, .with_lse = 1},
};

/* The attention variants (flashdecode.h, fd_problem's variant fields), and
 * head_dim 80 and 96 for every dtype. */
#define WIN(w) .has_window = 1, .window_left = (w)
static const fd_case variants[] = {
    /* head_dim 80 and 96, every dtype, no variant */
    {.dtype = F32, .head_dim = 80, .num_heads_q = 8, .num_heads_kv = 2, .batch = 2, .kv_len = {97, 1}, .q_len = 2, .page_size = 16, .num_splits = 7, .with_lse = 1, .check_splits = 1},
    {.dtype = F16, .head_dim = 80, .num_heads_q = 4, .num_heads_kv = 1, .batch = 1, .kv_len = {4099}, .q_len = 1, .with_lse = 1, .check_splits = 1},
    {.dtype = BF16, .head_dim = 80, .num_heads_q = 16, .num_heads_kv = 2, .batch = 3, .kv_len = {0, 65, 300}, .q_len = 4, .layout = NONCONTIG, .num_splits = 2, .with_lse = 1},
    {.dtype = F32, .head_dim = 96, .num_heads_q = 4, .num_heads_kv = 4, .batch = 1, .kv_len = {300}, .q_len = 8, .layout = NONCONTIG, .num_splits = 1, .with_lse = 1, .check_splits = 1},
    {.dtype = F16, .head_dim = 96, .num_heads_q = 8, .num_heads_kv = 1, .batch = 2, .kv_len = {64, 2000}, .q_len = 1, .page_size = 64, .num_splits = 7, .with_lse = 1},
    {.dtype = BF16, .head_dim = 96, .num_heads_q = 16, .num_heads_kv = 4, .batch = 2, .kv_len = {4097, 1}, .q_len = 2, .page_size = 16, .with_lse = 1, .check_splits = 1},
    /* sliding window: window_left 0 (a row sees itself), 1, 63/64/65 and
     * 127/128 around the 64-key chunks, 4095 with kv_len shorter and longer */
    {.dtype = F32, .head_dim = 64, .num_heads_q = 4, .num_heads_kv = 2, .batch = 3, .kv_len = {0, 1, 300}, .q_len = 1, .num_splits = 2, .with_lse = 1, .check_splits = 1, WIN(0)},
    {.dtype = BF16, .head_dim = 128, .num_heads_q = 8, .num_heads_kv = 2, .batch = 2, .kv_len = {5, 200}, .q_len = 4, .page_size = 16, .num_splits = 7, .with_lse = 1, WIN(1)},
    {.dtype = F16, .head_dim = 64, .num_heads_q = 4, .num_heads_kv = 1, .batch = 3, .kv_len = {63, 64, 1000}, .q_len = 16, .layout = NONCONTIG, .with_lse = 1, .check_splits = 1, WIN(63)},
    {.dtype = F32, .head_dim = 128, .num_heads_q = 4, .num_heads_kv = 4, .batch = 2, .kv_len = {64, 4099}, .q_len = 2, .page_size = 64, .num_splits = 7, .with_lse = 1, .check_splits = 1, WIN(64)},
    {.dtype = BF16, .head_dim = 64, .num_heads_q = 16, .num_heads_kv = 2, .batch = 2, .kv_len = {65, 2000}, .q_len = 8, .num_splits = 1, .with_lse = 1, .check_splits = 1, WIN(65)},
    {.dtype = F32, .head_dim = 80, .num_heads_q = 4, .num_heads_kv = 1, .batch = 2, .kv_len = {127, 500}, .q_len = 3, .page_size = 16, .num_splits = 2, .with_lse = 1, .check_splits = 1, WIN(127)},
    {.dtype = F16, .head_dim = 96, .num_heads_q = 8, .num_heads_kv = 4, .batch = 2, .kv_len = {128, 129}, .q_len = 1, .with_lse = 1, WIN(128)},
    {.dtype = BF16, .head_dim = 256, .num_heads_q = 2, .num_heads_kv = 1, .batch = 2, .kv_len = {4095, 5000}, .q_len = 2, .page_size = 64, .num_splits = 7, .with_lse = 1, .check_splits = 1, WIN(4095)},
    {.dtype = F32, .head_dim = 64, .num_heads_q = 2, .num_heads_kv = 1, .batch = 1, .kv_len = {4099}, .q_len = 1, .with_lse = 1, .num_threads = 16, .check_splits = 1, .check_determinism = 1, WIN(4095)},
    /* a long cache, a short window: splits planned for the window's keys */
    {.dtype = F32, .head_dim = 64, .num_heads_q = 2, .num_heads_kv = 1, .batch = 2, .kv_len = {40000, 100}, .q_len = 2, .page_size = 128, .with_lse = 1, .check_splits = 1, WIN(127)},
    {.dtype = BF16, .head_dim = 64, .num_heads_q = 8, .num_heads_kv = 2, .batch = 2, .kv_len = {3000, 200}, .q_len = 16, .page_size = 256, .num_splits = 7, .with_lse = 1, WIN(127)},
    /* has_window with window_left -1: no window; q_len > kv_len under a window */
    {.dtype = F32, .head_dim = 64, .num_heads_q = 4, .num_heads_kv = 2, .batch = 2, .kv_len = {97, 300}, .q_len = 2, .num_splits = 7, .with_lse = 1, .check_splits = 1, WIN(-1)},
    {.dtype = F32, .head_dim = 64, .num_heads_q = 4, .num_heads_kv = 2, .batch = 2, .kv_len = {2, 70}, .q_len = 8, .page_size = 16, .num_splits = 2, .with_lse = 1, .check_splits = 1, WIN(3)},
    /* logit soft-cap; large inputs (input_scale) so that the cap bites */
    {.dtype = F32, .head_dim = 128, .num_heads_q = 8, .num_heads_kv = 2, .batch = 2, .kv_len = {97, 1000}, .q_len = 1, .num_splits = 7, .with_lse = 1, .check_splits = 1, .logits_soft_cap = 50.0f},
    {.dtype = BF16, .head_dim = 64, .num_heads_q = 4, .num_heads_kv = 1, .batch = 1, .kv_len = {500}, .q_len = 2, .num_splits = 2, .with_lse = 1, .logits_soft_cap = 30.0f, .input_scale = 4.0f},
    {.dtype = F16, .head_dim = 128, .num_heads_q = 8, .num_heads_kv = 2, .batch = 2, .kv_len = {64, 300}, .q_len = 1, .page_size = 16, .with_lse = 1, .logits_soft_cap = 1.0f, .input_scale = 3.0f},
    {.dtype = F32, .head_dim = 64, .num_heads_q = 4, .num_heads_kv = 4, .batch = 1, .kv_len = {300}, .q_len = 1, .num_splits = 7, .with_lse = 1, .check_splits = 1, .logits_soft_cap = 1.0f, .input_scale = 8.0f},
    {.dtype = F32, .head_dim = 96, .num_heads_q = 4, .num_heads_kv = 2, .batch = 2, .kv_len = {33, 4099}, .q_len = 4, .page_size = 64, .layout = NONCONTIG, .with_lse = 1, .logits_soft_cap = 30.0f, .input_scale = 3.0f},
    /* the largest caps a plan accepts (finite): no score changes (a backend
     * that scales the cap, e.g. by log2(e), must not overflow it) */
    {.dtype = F32, .head_dim = 64, .num_heads_q = 4, .num_heads_kv = 2, .batch = 2, .kv_len = {65, 300}, .q_len = 2, .num_splits = 2, .with_lse = 1, .logits_soft_cap = 3e38f},
    {.dtype = BF16, .head_dim = 128, .num_heads_q = 4, .num_heads_kv = 1, .batch = 1, .kv_len = {200}, .q_len = 1, .page_size = 16, .with_lse = 1, .logits_soft_cap = 1e38f},
    /* sinks: rows that see no key (kv_len 0, q_len > kv_len) get out 0, lse = sink */
    {.dtype = F32, .head_dim = 64, .num_heads_q = 4, .num_heads_kv = 2, .batch = 3, .kv_len = {0, 1, 300}, .q_len = 1, .num_splits = 2, .with_lse = 1, .check_splits = 1, .sinks = 1},
    {.dtype = BF16, .head_dim = 128, .num_heads_q = 8, .num_heads_kv = 2, .batch = 2, .kv_len = {2, 97}, .q_len = 4, .page_size = 16, .num_splits = 7, .with_lse = 1, .sinks = 1},
    {.dtype = F16, .head_dim = 96, .num_heads_q = 16, .num_heads_kv = 2, .batch = 2, .kv_len = {0, 4099}, .q_len = 2, .layout = NONCONTIG, .with_lse = 1, .sinks = 1},
    {.dtype = F16, .head_dim = 64, .num_heads_q = 4, .num_heads_kv = 4, .batch = 1, .kv_len = {65}, .q_len = 1, .num_splits = 2, .sinks = 1},
    /* a NaN sink: that head's rows NaN, the others untouched */
    {.dtype = F32, .head_dim = 64, .num_heads_q = 4, .num_heads_kv = 2, .batch = 2, .kv_len = {0, 70}, .q_len = 2, .num_splits = 2, .with_lse = 1, .check_splits = 1, .sinks = 1, .nan_sink = 2},
    {.dtype = BF16, .head_dim = 80, .num_heads_q = 8, .num_heads_kv = 2, .batch = 2, .kv_len = {3, 1000}, .q_len = 4, .page_size = 16, .num_splits = 7, .with_lse = 1, .check_determinism = 1, .sinks = 1, .nan_sink = 8},
    /* window, soft-cap and sinks together (Gemma 2, gpt-oss) */
    {.dtype = F32, .head_dim = 128, .num_heads_q = 8, .num_heads_kv = 2, .batch = 3, .kv_len = {0, 65, 2000}, .q_len = 4, .page_size = 16, .num_splits = 7, .with_lse = 1, .check_splits = 1, WIN(127), .logits_soft_cap = 50.0f, .sinks = 1},
    {.dtype = BF16, .head_dim = 64, .num_heads_q = 8, .num_heads_kv = 1, .batch = 2, .kv_len = {3, 4099}, .q_len = 8, .with_lse = 1, WIN(1000), .logits_soft_cap = 30.0f, .sinks = 1, .input_scale = 2.0f},
    {.dtype = F16, .head_dim = 80, .num_heads_q = 4, .num_heads_kv = 2, .batch = 2, .kv_len = {1, 300}, .q_len = 16, .layout = NONCONTIG, .num_splits = 2, .with_lse = 1, WIN(63), .logits_soft_cap = 20.0f, .sinks = 1},
    {.dtype = F32, .head_dim = 256, .num_heads_q = 4, .num_heads_kv = 1, .batch = 1, .kv_len = {4099}, .q_len = 1, .num_splits = 128, .with_lse = 1, .check_splits = 1, WIN(4095), .logits_soft_cap = 50.0f, .sinks = 1},
    {.dtype = BF16, .head_dim = 96, .num_heads_q = 8, .num_heads_kv = 2, .batch = 2, .kv_len = {0, 700}, .q_len = 2, .num_splits = 7, .with_lse = 1, WIN(0), .sinks = 1, .out_f32 = 1},
    /* non-causal: every row sees all kv_len keys; q_len up to 128 */
    {.dtype = F32, .head_dim = 64, .num_heads_q = 8, .num_heads_kv = 1, .batch = 2, .kv_len = {1, 65}, .q_len = 32, .num_splits = 2, .with_lse = 1, .check_splits = 1, .non_causal = 1},
    {.dtype = BF16, .head_dim = 64, .num_heads_q = 4, .num_heads_kv = 1, .batch = 1, .kv_len = {4099}, .q_len = 32, .page_size = 64, .num_splits = 7, .with_lse = 1, .non_causal = 1},
    {.dtype = F16, .head_dim = 64, .num_heads_q = 8, .num_heads_kv = 1, .batch = 1, .kv_len = {65}, .q_len = 128, .with_lse = 1, .check_splits = 1, .non_causal = 1},
    {.dtype = F32, .head_dim = 96, .num_heads_q = 4, .num_heads_kv = 2, .batch = 2, .kv_len = {0, 300}, .q_len = 128, .num_splits = 7, .with_lse = 1, .non_causal = 1, .sinks = 1, .logits_soft_cap = 30.0f},
    {.dtype = BF16, .head_dim = 80, .num_heads_q = 4, .num_heads_kv = 4, .batch = 2, .kv_len = {1, 1000}, .q_len = 64, .page_size = 16, .layout = NONCONTIG, .with_lse = 1, .non_causal = 1, .out_f32 = 1},
    /* float32 out (out_dtype) for every dtype */
    {.dtype = F16, .head_dim = 128, .num_heads_q = 8, .num_heads_kv = 2, .batch = 2, .kv_len = {97, 1000}, .q_len = 2, .num_splits = 7, .with_lse = 1, .check_splits = 1, .out_f32 = 1},
    {.dtype = BF16, .head_dim = 64, .num_heads_q = 4, .num_heads_kv = 1, .batch = 2, .kv_len = {0, 4099}, .q_len = 1, .page_size = 16, .layout = NONCONTIG, .with_lse = 1, .out_f32 = 1},
    {.dtype = F32, .head_dim = 64, .num_heads_q = 2, .num_heads_kv = 2, .batch = 1, .kv_len = {300}, .q_len = 1, .num_splits = 2, .with_lse = 1, .out_f32 = 1},
    {.dtype = F16, .head_dim = 80, .num_heads_q = 8, .num_heads_kv = 2, .batch = 2, .kv_len = {65, 130}, .q_len = 3, .page_size = 16, .num_splits = 2, .with_lse = 1, .check_determinism = 1, WIN(65), .out_f32 = 1},
};

/* Variant cases only the GPU runs (their float64 oracle is slow on the host). */
static const fd_case gpu_variants[] = {
    /* non-causal, GQA 8 with q_len 128: 1024 rows a kv head */
    {.dtype = BF16, .head_dim = 128, .num_heads_q = 8, .num_heads_kv = 1, .batch = 1, .kv_len = {4099}, .q_len = 128, .with_lse = 1, .check_splits = 1, .non_causal = 1},
    {.dtype = F16, .head_dim = 256, .num_heads_q = 8, .num_heads_kv = 2, .batch = 2, .kv_len = {4099, 1}, .q_len = 64, .page_size = 64, .num_splits = 7, .with_lse = 1, .non_causal = 1, .sinks = 1},
    /* the rows kernel (rows_mma_kernel.cu: non-causal, >= 32 rows a kv head, head_dim 64 / 128):
     * a last row tile of 16 rows, an empty sequence, soft-cap and sinks; one split (its own
     * epilogue) with float32 out; paged with page_size 16 and 48 (not a power of two),
     * non-contiguous; 32 rows (the smallest count it takes) */
    {.dtype = BF16, .head_dim = 128, .num_heads_q = 32, .num_heads_kv = 8, .batch = 2, .kv_len = {4097, 0}, .q_len = 100, .num_splits = 5, .with_lse = 1, .check_splits = 1, .non_causal = 1, .logits_soft_cap = 30.0f, .sinks = 1},
    {.dtype = F16, .head_dim = 128, .num_heads_q = 4, .num_heads_kv = 1, .batch = 2, .kv_len = {1, 129}, .q_len = 16, .num_splits = 1, .with_lse = 1, .non_causal = 1, .sinks = 1, .out_f32 = 1},
    {.dtype = F16, .head_dim = 64, .num_heads_q = 12, .num_heads_kv = 4, .batch = 2, .kv_len = {1000, 64}, .q_len = 77, .page_size = 16, .layout = NONCONTIG, .with_lse = 1, .check_determinism = 1, .non_causal = 1},
    {.dtype = BF16, .head_dim = 128, .num_heads_q = 16, .num_heads_kv = 2, .batch = 2, .kv_len = {333, 2049}, .q_len = 9, .page_size = 48, .num_splits = 3, .with_lse = 1, .check_splits = 1, .non_causal = 1, .input_scale = 2.0f},
    {.dtype = BF16, .head_dim = 64, .num_heads_q = 8, .num_heads_kv = 2, .batch = 1, .kv_len = {8191}, .q_len = 8, .with_lse = 1, .non_causal = 1},
    /* long caches under a window: the split count planned for the window */
    {.dtype = BF16, .head_dim = 128, .num_heads_q = 32, .num_heads_kv = 8, .batch = 2, .kv_len = {33000, 9000}, .q_len = 2, .with_lse = 1, .check_splits = 1, WIN(4095)},
    /* Gemma 2 (head_dim 256, window 4096, soft-cap 50), gpt-oss (head_dim 64, window 128, sinks) */
    {.dtype = BF16, .head_dim = 256, .num_heads_q = 16, .num_heads_kv = 8, .batch = 2, .kv_len = {8191, 5000}, .q_len = 1, .page_size = 16, .with_lse = 1, WIN(4095), .logits_soft_cap = 50.0f},
    {.dtype = BF16, .head_dim = 64, .num_heads_q = 64, .num_heads_kv = 8, .batch = 3, .kv_len = {5000, 129, 0}, .q_len = 1, .page_size = 16, .with_lse = 1, .check_splits = 1, WIN(127), .sinks = 1},
    /* head_dim 80 and 96, long and ragged */
    {.dtype = F16, .head_dim = 80, .num_heads_q = 32, .num_heads_kv = 8, .batch = 1, .kv_len = {33000}, .q_len = 1, .with_lse = 1, .check_splits = 1},
    {.dtype = BF16, .head_dim = 96, .num_heads_q = 16, .num_heads_kv = 2, .batch = 3, .kv_len = {8191, 1, 4096}, .q_len = 4, .page_size = 64, .layout = NONCONTIG, .with_lse = 1, .out_f32 = 1},
    {.dtype = F32, .head_dim = 80, .num_heads_q = 16, .num_heads_kv = 2, .batch = 2, .kv_len = {8191, 129}, .q_len = 2, .page_size = 128, .num_splits = 10, .with_lse = 1, .sinks = 1, .logits_soft_cap = 30.0f},
};

/* Cases only the GPU runs: long sequences with many heads, big ragged batches. */
static const fd_case gpu_extra[] = {
    {.dtype = BF16, .head_dim = 128, .num_heads_q = 32, .num_heads_kv = 8, .batch = 1, .kv_len = {33768}, .q_len = 1, .with_lse = 1, .check_splits = 1},
    {.dtype = F16, .head_dim = 128, .num_heads_q = 8, .num_heads_kv = 1, .batch = 2, .kv_len = {65536, 33000}, .q_len = 2, .page_size = 256, .with_lse = 1},
    {.dtype = F32, .head_dim = 256, .num_heads_q = 16, .num_heads_kv = 2, .batch = 4, .kv_len = {8191, 1, 4096, 7}, .q_len = 4, .page_size = 64, .layout = NONCONTIG, .with_lse = 1, .check_splits = 1},
    {.dtype = BF16, .head_dim = 128, .num_heads_q = 8, .num_heads_kv = 2, .batch = 16,
     .kv_len = {1, 17, 64, 65, 100, 255, 256, 257, 1000, 1023, 2048, 3000, 4099, 0, 5, 8191}, .q_len = 1, .page_size = 16, .with_lse = 1},
    {.dtype = F16, .head_dim = 64, .num_heads_q = 64, .num_heads_kv = 8, .batch = 16,
     .kv_len = {5000, 3, 70, 129, 1, 0, 640, 2000, 4097, 33, 64, 127, 128, 2, 9000, 300}, .q_len = 2, .with_lse = 1, .kv_capacity_pad = 1000},
    /* the 8-warp kernel (grids of <= one block per SM, splits of >= 128
     * keys): head_dim 256 with keys (paged 64 and 256), bf16 head_dim 64,
     * paged walks with one page id per 16 and per 64 keys; page_size 128
     * with 320-key splits (tiles that start at 64 mod 128 and cross a page:
     * runs capped at the 64-key alignment) */
    {.dtype = BF16, .head_dim = 256, .num_heads_q = 16, .num_heads_kv = 8, .batch = 1, .kv_len = {5001}, .q_len = 2, .page_size = 64, .num_splits = 16, .with_lse = 1, .check_splits = 1},
    {.dtype = F16, .head_dim = 256, .num_heads_q = 4, .num_heads_kv = 2, .batch = 1, .kv_len = {1500}, .q_len = 2, .page_size = 256, .num_splits = 5, .with_lse = 1},
    {.dtype = BF16, .head_dim = 64, .num_heads_q = 8, .num_heads_kv = 2, .batch = 2, .kv_len = {3000, 129}, .q_len = 1, .num_splits = 5, .with_lse = 1, .check_splits = 1},
    {.dtype = F16, .head_dim = 256, .num_heads_q = 8, .num_heads_kv = 2, .batch = 2, .kv_len = {3000, 129}, .q_len = 1, .layout = NONCONTIG, .num_splits = 3, .with_lse = 1},
    {.dtype = BF16, .head_dim = 128, .num_heads_q = 8, .num_heads_kv = 2, .batch = 1, .kv_len = {3001}, .q_len = 1, .page_size = 16, .num_splits = 4, .with_lse = 1},
    {.dtype = F16, .head_dim = 128, .num_heads_q = 8, .num_heads_kv = 2, .batch = 2, .kv_len = {2900, 190}, .q_len = 3, .page_size = 128, .layout = NONCONTIG, .num_splits = 10, .with_lse = 1, .check_splits = 1},
    /* tensor-core kernels: page_size 8 (one block_table read a thread a tile
     * at head_dim 128: a thread copies 8 consecutive keys), and one read a
     * key: page_size below those 4 or 8 keys (2 at head_dim 256) or not a
     * power of two (48) */
    {.dtype = BF16, .head_dim = 128, .num_heads_q = 8, .num_heads_kv = 2, .batch = 1, .kv_len = {3001}, .q_len = 1, .page_size = 8, .num_splits = 4, .with_lse = 1},
    {.dtype = F16, .head_dim = 64, .num_heads_q = 8, .num_heads_kv = 2, .batch = 2, .kv_len = {2000, 77}, .q_len = 2, .page_size = 48, .layout = NONCONTIG, .num_splits = 3, .with_lse = 1, .check_splits = 1},
    {.dtype = BF16, .head_dim = 256, .num_heads_q = 8, .num_heads_kv = 2, .batch = 1, .kv_len = {1111}, .q_len = 1, .page_size = 2, .num_splits = 2, .with_lse = 1},
};

/* CPU only: head_dim <= 8, where the SIMD kernels transpose keys into lanes
 * (cpu_kernels_avx512.c, cpu_kernels_avx2.c) and run the softmax of every
 * head of a pass in one call. Group sizes 1, 2, 3, 4, 8; q_len up to 16,
 * with rows whose last visible key ends a 32-key block while other rows go
 * on (kv 130, q_len 8) and rows that see nothing; block and split tails;
 * passes of more than 16 rows; large scores. Run with fd_run and again with
 * the AVX2 kernels forced where the machine has better ones. */
/* bf16 caches with head_dim % 32 == 0 (the AMX kernels' shapes), run under
 * every instruction set: group 4 paged (blocks cut by pages: copied rows),
 * MQA (32 rows: two q chunks, eight P chunks), 16 rows of q_len 4, head_dim
 * 256 (two column sweeps), 18 rows (a padded q chunk), head_dim 96 (three
 * column tiles), tails shorter than a block. */
static const fd_case cpu_isa_bf16[] = {
    {.dtype = BF16, .head_dim = 128, .num_heads_q = 32, .num_heads_kv = 8, .batch = 2, .kv_len = {1000, 77}, .q_len = 1, .page_size = 16, .num_splits = 3, .with_lse = 1},
    {.dtype = BF16, .head_dim = 128, .num_heads_q = 32, .num_heads_kv = 1, .batch = 1, .kv_len = {300}, .q_len = 1, .with_lse = 1},
    {.dtype = BF16, .head_dim = 64, .num_heads_q = 8, .num_heads_kv = 2, .batch = 2, .kv_len = {129, 64}, .q_len = 4, .page_size = 64, .with_lse = 1},
    {.dtype = BF16, .head_dim = 256, .num_heads_q = 16, .num_heads_kv = 2, .batch = 1, .kv_len = {200}, .q_len = 2, .num_splits = 2, .with_lse = 1},
    {.dtype = BF16, .head_dim = 96, .num_heads_q = 6, .num_heads_kv = 1, .batch = 1, .kv_len = {100}, .q_len = 3, .with_lse = 1},
    {.dtype = BF16, .head_dim = 32, .num_heads_q = 1, .num_heads_kv = 1, .batch = 3, .kv_len = {31, 32, 33}, .q_len = 1, .with_lse = 1},
};

static const fd_case cpu_small[] = {
    {.dtype = F32, .head_dim = 8, .num_heads_q = 8, .num_heads_kv = 4, .batch = 1, .kv_len = {4099}, .q_len = 1, .with_lse = 1, .check_splits = 1, .check_determinism = 1},
    {.dtype = F32, .head_dim = 8, .num_heads_q = 16, .num_heads_kv = 2, .batch = 2, .kv_len = {130, 97}, .q_len = 8, .num_splits = 1, .with_lse = 1},
    {.dtype = BF16, .head_dim = 8, .num_heads_q = 16, .num_heads_kv = 2, .batch = 3, .kv_len = {0, 33, 1000}, .q_len = 8, .page_size = 16, .layout = NONCONTIG, .num_splits = 7, .with_lse = 1, .check_splits = 1},
    {.dtype = F16, .head_dim = 8, .num_heads_q = 4, .num_heads_kv = 4, .batch = 2, .kv_len = {65, 4097}, .q_len = 2, .page_size = 1, .num_splits = 2, .with_lse = 1},
    {.dtype = BF16, .head_dim = 8, .num_heads_q = 8, .num_heads_kv = 2, .batch = 2, .kv_len = {5, 31}, .q_len = 16, .with_lse = 1, .kv_capacity_pad = 40},
    {.dtype = F32, .head_dim = 8, .num_heads_q = 4, .num_heads_kv = 1, .batch = 2, .kv_len = {5, 200}, .q_len = 16, .page_size = 64, .num_splits = 7, .with_lse = 1, .check_splits = 1},
    {.dtype = F16, .head_dim = 8, .num_heads_q = 2, .num_heads_kv = 1, .batch = 4, .kv_len = {1, 63, 64, 0}, .q_len = 3, .layout = NONCONTIG, .num_splits = 2, .with_lse = 1},
    {.dtype = F32, .head_dim = 8, .num_heads_q = 8, .num_heads_kv = 4, .batch = 1, .kv_len = {300}, .q_len = 1, .num_splits = 1, .with_lse = 1, .softmax_scale = 8.0f},
    {.dtype = BF16, .head_dim = 8, .num_heads_q = 32, .num_heads_kv = 4, .batch = 1, .kv_len = {777}, .q_len = 4, .num_splits = 3, .with_lse = 1, .num_threads = 3, .check_determinism = 1},
    {.dtype = F16, .head_dim = 5, .num_heads_q = 6, .num_heads_kv = 2, .batch = 1, .kv_len = {77}, .q_len = 4, .num_splits = 2, .with_lse = 1},
    {.dtype = F32, .head_dim = 3, .num_heads_q = 3, .num_heads_kv = 1, .batch = 2, .kv_len = {40, 130}, .q_len = 8, .page_size = 16, .with_lse = 1},
};

#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

int fd_grid_cases(fd_backend backend, fd_case *cases, int max) {
  int n = 0;
  for (int i = 0; i < COUNT(grid) && n < max; i++) {
    fd_case c = grid[i];
    c.backend = backend;
    if (backend == FD_BACKEND_CUDA) {
      /* CUDA supports head_dim 64, 80, 96, 128, 256 only. */
      if (c.head_dim < 64) c.head_dim = 64;
      else if (c.head_dim > 64 && c.head_dim < 128 && c.head_dim != 80 && c.head_dim != 96) c.head_dim = 128;
      else if (c.head_dim > 128 && c.head_dim < 256) c.head_dim = 256;
      c.num_threads = 0;
      c.check_determinism = 1;
    }
    cases[n++] = c;
  }
  for (int i = 0; i < COUNT(variants) && n < max; i++) {
    fd_case c = variants[i];
    c.backend = backend;
    if (backend == FD_BACKEND_CUDA) {
      c.num_threads = 0;
      c.check_determinism = 1;
    }
    cases[n++] = c;
  }
  if (backend == FD_BACKEND_CPU) {
    /* the bf16 tile shapes (AMX: q.K, P.V tiles, row chunks, blocks copied
     * at page boundaries and tails) under every set this machine has, so a
     * machine whose fd_run takes AMX still runs the others' bf16 kernels */
    for (int isa = FD_CPU_ISA_SCALAR; isa <= (int)fd_cpu_isa_available(); isa++)
      for (int i = 0; i < COUNT(cpu_isa_bf16) && n < max; i++) {
        fd_case c = cpu_isa_bf16[i];
        c.backend = backend;
        c.cpu_isa = 1 + isa;
        cases[n++] = c;
      }
    const fd_cpu_isa best = fd_cpu_isa_detect();
    for (int forced = 0; forced < 2; forced++) {
      if (forced && best <= FD_CPU_ISA_AVX2) break; /* fd_run already runs AVX2 (or scalar) */
      for (int i = 0; i < COUNT(cpu_small) && n < max; i++) {
        fd_case c = cpu_small[i];
        c.backend = backend;
        if (forced) c.cpu_isa = 1 + FD_CPU_ISA_AVX2;
        cases[n++] = c;
      }
    }
  }
  if (backend == FD_BACKEND_CUDA) {
    for (int i = 0; i < COUNT(gpu_extra) && n < max; i++) {
      fd_case c = gpu_extra[i];
      c.backend = backend;
      c.check_determinism = 1;
      cases[n++] = c;
    }
    for (int i = 0; i < COUNT(gpu_variants) && n < max; i++) {
      fd_case c = gpu_variants[i];
      c.backend = backend;
      c.check_determinism = 1;
      cases[n++] = c;
    }
    /* fp16/bf16 grids of at most one block per SM (splits of >= 128 keys)
     * run the 8-warp kernel; again with sm_count 1, which gives them the
     * 4-warp one. */
    const int base = n;
    for (int i = 0; i < base && n < max; i++) {
      if (cases[i].dtype == F32) continue;
      fd_case c = cases[i];
      c.sm_count = 1;
      cases[n++] = c;
    }
  }
  return n;
}
