"""One run of the benchmark: the phases, in order of importance, each row recorded as soon as
it is measured (the caller rewrites the CSVs after every row):

  1 the grid rows: flashdecode (automatic splits, no split), the split sweep, SDPA
  2 the variant rows: flashdecode (the cascade as three calls in one graph), SDPA where it
    applies; then the MLA rows (gpubench/mla.py): flashdecode, flashdecode-nosplit
  3 FlashInfer's paths on every row (MLA rows: its MLA wrapper, fa2 and fa3) (their JIT modules compiled meanwhile in the background)
  4 FlexAttention (compiled per shape: last, so its compile time crowds out nothing else)
  5 paged rows restate the peers of their contiguous row

A time budget (--budget-s, seconds after the read ceiling) skips the sweep past 75 % and
whatever is left past 100 %, and says so in the notes."""
import time
import warnings

from .common import (OURS, SETTINGS, SWEEP_COUNTS, TOL, Rec, SweepRec, exc_text, fmt, na,
                     short)
from .data import Fp8Ref, compare, make_set, peer_set, reference
from .flashinfer_peers import (FiPrep, FlashInferPeers, Prebuild, describe_first, fi_impls_for,
                               fi_reason, fi_spec_list, first_call_seconds, import_flashinfer,
                               measured_by_fi)
from .peers import (Cascade, Flex, Unavailable, check_sinks_supported, flex_reason,
                    import_flashdecode, make_plan, ours_call, sdpa_additive_call, sdpa_calls,
                    sdpa_reason)
from .timing import GraphFailed, measure, replays_for, replicas_for


class GpuBench:
    def __init__(self, args, torch, shapes, variants, notes, log_dir="/tmp", mla=()):
        self.args = args
        self.torch = torch
        self.shapes = shapes
        self.variants = variants
        self.mla = list(mla)
        self.all_shapes = list(shapes) + list(variants) + self.mla
        self.notes = notes
        self.log_dir = log_dir
        self.recs = []
        self.sweep = []
        self.t0 = time.monotonic()
        self.flex = Flex(torch)
        self.fatal = ""
        self.fd, self.fd_error = import_flashdecode()
        self.fi = None
        self.fi_error = ""
        self.fi_mla = None
        self.prebuild = None
        self.done = {}  # shape name -> its records after phase 1/2
        self.fi_done = set()

    # -- helpers ----------------------------------------------------------
    def elapsed(self):
        return time.monotonic() - self.t0

    def log(self, msg):
        print(f"[{self.elapsed():6.1f}s] {msg}", flush=True)

    def over_budget(self, frac=1.0):
        return self.elapsed() > frac * self.args.budget_s

    def cuda_ok(self):
        try:
            self.torch.cuda.synchronize()
            return True
        except Exception as exc:
            self.fatal = f"CUDA context unusable after an error: {short(exc, 150)}"
            return False

    def want_peers(self):
        return not self.args.no_peers and not self.fatal

    def want_fi(self):
        return self.want_peers() and not self.args.no_flashinfer

    # -- FlashInfer's JIT prebuild ------------------------------------------
    def start_prebuild(self):
        """Starts compiling FlashInfer's modules in the background (call before the ceiling)."""
        if not self.want_fi():
            return
        todo = [s for s in self.all_shapes if measured_by_fi(s)]
        specs = fi_spec_list(todo)
        self.prebuild = Prebuild(specs, self.log_dir)
        self.prebuild.start()
        if self.prebuild.error:
            self.notes.append(self.prebuild.error)
        elif specs:
            self.log(f"FlashInfer JIT prebuild started: {len(specs)} modules, "
                     f"{self.prebuild.jobs} at a time, log {self.prebuild.log_path}")

    def stop_prebuild(self):
        if self.prebuild is not None and not getattr(self, "_prebuild_stopped", False):
            self._prebuild_stopped = True
            self.prebuild.stop()
            self.notes.append(self.prebuild.summary())

    # -- one measured implementation -------------------------------------
    def run_one(self, shape, impl, call, replicas, ref, eager=True, num_splits=None,
                out_view=None):
        torch = self.torch
        rec = Rec(shape.name, impl, num_splits=num_splits, replicas=replicas)

        def check(out):
            o = out_view(out) if out_view else out
            if isinstance(ref, Fp8Ref):  # fp8 rows: vs the original bf16 K/V, and dequantized
                return compare(torch, o, ref.orig) + (compare(torch, o, ref.deq)[1],)
            return compare(torch, o, ref) + (None,)

        caught = []
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                us_g, us_e, (err, rel, rel_deq) = measure(torch, call, replicas,
                                                          replays_for(shape.kv_bytes, replicas),
                                                          10 if eager else 0, check)
            rec.us_graph, rec.us_eager, rec.err, rec.rel = us_g, us_e, err, rel
            rec.rel_deq = rel_deq
            if rel_deq is not None:
                # fp8: the tolerance holds the kernel to the cache it reads (the quantization
                # error against the original K/V is measured, compared with FlashInfer's)
                if not (rel_deq <= TOL[shape.dtype]):
                    rec.status = "FAIL"
                    rec.reason = (f"rel err vs the dequantized cache {rel_deq:.3g} > tol "
                                  f"{TOL[shape.dtype]:g} (vs the original K/V {rel:.3g})")
            elif not (rel <= TOL[shape.dtype]):
                rec.status = "FAIL"
                rec.reason = f"rel err {rel:.3g} > tol {TOL[shape.dtype]:g} (max abs {err:.3g})"
        except Exception as exc:
            why = exc_text(exc, 140)
            # PyTorch says why a backend refused in warnings; they name the cause, so they go first.
            hints = [short(str(w.message), 140) for w in (caught or [])]
            if hints:
                why = " | ".join(list(dict.fromkeys(hints))[:3]) + " || " + why
            if isinstance(exc, GraphFailed) and exc.us_eager is not None:
                rec.us_eager = exc.us_eager
                why += f" (eager {exc.us_eager:.2f} us)"
            rec.status, rec.reason = "n/a", why
            self.cuda_ok()
        return rec

    def prepare(self, shape):
        """R buffer sets in our layout, kv_len on the device, and the float64 reference of set 0."""
        torch = self.torch
        replicas = replicas_for(shape.kv_bytes)
        kv_len = torch.tensor(shape.lens, dtype=torch.int32, device=SETTINGS.device)
        sets = [make_set(torch, shape, SETTINGS.device, index=i, want_ref=(i == 0))
                for i in range(replicas)]
        ref = sets[0].ref if shape.kv_dtype else reference(torch, shape, sets[0])
        if shape.kv_dtype:
            self.note_fp8_data(shape, ref)
        torch.cuda.synchronize()
        return replicas, kv_len, sets, ref

    def note_fp8_data(self, shape, ref):
        """The error an exact kernel has on this fp8 cache (float64 over the dequantized K/V
        against float64 over the original), once per row, in the notes."""
        if shape.name in getattr(self, "_fp8_noted", set()):
            return
        self._fp8_noted = getattr(self, "_fp8_noted", set()) | {shape.name}
        err, rel = compare(self.torch, ref.deq, ref.orig)
        self.notes.append(f"{shape.name}: quantization alone (float64 over the dequantized "
                          f"cache vs over the original bf16 K/V): rel err {rel:.4g}")

    def peer_inputs(self, shape, sets):
        """Peers' buffers (their native [B, Hkv, N, D] layout; our K/V freed set by set) and,
        for ragged batches, lens on the device and a [B, 1, 1, N] bool mask (True = attend)."""
        torch = self.torch
        psets = []
        for s in sets:
            psets.append(peer_set(torch, shape, s))
            s.k = s.v = None
        lens_t = torch.tensor(shape.lens, dtype=torch.int32, device=SETTINGS.device)
        mask = None
        if shape.ragged:
            mask = (torch.arange(shape.capacity, device=SETTINGS.device)[None, None, None, :]
                    < lens_t[:, None, None, None])
        return psets, lens_t, mask

    @staticmethod
    def copied(shape, source, impls):
        """Peer records of the contiguous equivalent row, restated for a paged row."""
        out = []
        for r in source:
            if r.impl in impls:
                out.append(Rec(shape.name, r.impl, r.us_graph, r.us_eager, None, r.status, r.err,
                               r.rel, (r.reason + " " if r.reason else "")
                               + f"(peer timed on its own layout for row {r.shape})",
                               r.replicas))
        return out

    def warm(self, shape, sets, kv_len, replicas):
        """One untimed measurement of the automatic configuration (the first configuration timed
        on a shape measured 4-6 % slow in the 9160d37 / 701e20e runs: dev/NOTES.md)."""
        try:
            plan = make_plan(self.fd, self.torch, shape, 0)
            measure(self.torch, ours_call(plan, sets, kv_len, sinks=shape.sinks), replicas,
                    replays_for(shape.kv_bytes, replicas), 0, lambda out: None)
        except Exception:
            self.cuda_ok()  # the recorded attempt reports the failure

    # -- phase 1: the grid rows -----------------------------------------------
    def run_shape(self, shape, peer_source):
        torch, args = self.torch, self.args
        replicas, kv_len, sets, ref = self.prepare(shape)
        recs = []
        line = [f"{shape.name} R={replicas}"]
        if self.fd is None:
            for impl in OURS:
                recs.append(na(shape.name, impl, self.fd_error))
        else:
            self.warm(shape, sets, kv_len, replicas)
            for impl, ns in (("flashdecode", 0), ("flashdecode-nosplit", 1)):
                try:
                    plan = make_plan(self.fd, torch, shape, ns)
                except Exception as exc:
                    recs.append(na(shape.name, impl, f"DecodePlan: {short(exc, 150)}"))
                    continue
                recs.append(self.run_one(shape, impl, ours_call(plan, sets, kv_len), replicas, ref,
                                         num_splits=getattr(plan, "num_splits", None),
                                         out_view=lambda o: o[:, 0]))
                if self.fatal:
                    break
            if shape.sweep and not args.no_sweep and not self.fatal:
                if self.over_budget(0.75):
                    self.notes.append(f"sweep skipped for {shape.name} (time budget)")
                else:
                    self.run_sweep(shape, sets, kv_len, replicas, ref, recs)
        if self.want_peers():
            if peer_source is not None:
                recs += self.copied(shape, peer_source, ("sdpa-flash", "sdpa-cudnn"))
            else:
                recs += self.run_sdpa(shape, sets, replicas, ref)
        self._finish(shape, recs, line, peer_source is not None)
        del sets
        torch.cuda.empty_cache()

    def _finish(self, shape, recs, line, copied=False):
        for r in recs:
            line.append(f"{r.impl}={fmt(r.us_graph, 2) if r.status == 'ok' else r.status}"
                        + (f"/s{r.num_splits}" if r.num_splits else ""))
        if copied and self.want_peers():
            line.append("(peers copied)")
        self.recs += recs
        self.done[shape.name] = list(recs)
        self.log(" ".join(line))

    def run_sweep(self, shape, sets, kv_len, replicas, ref, recs):
        seen = {}
        nosplit = next((r for r in recs if r.impl == "flashdecode-nosplit" and r.status == "ok"),
                       None)
        for req in SWEEP_COUNTS:
            try:
                plan = make_plan(self.fd, self.torch, shape, req)
            except Exception as exc:
                self.sweep.append(SweepRec(shape.name, req, 0, status="n/a",
                                           reason=f"DecodePlan: {short(exc, 120)}"))
                continue
            ns = getattr(plan, "num_splits", req)
            if ns in seen:
                continue
            seen[ns] = True
            if ns == 1 and nosplit is not None:
                self.sweep.append(SweepRec(shape.name, req, 1, nosplit.us_graph, "ok", nosplit.rel))
                continue
            r = self.run_one(shape, f"splits{req}", ours_call(plan, sets, kv_len), replicas,
                             ref, eager=False, num_splits=ns, out_view=lambda o: o[:, 0])
            self.sweep.append(SweepRec(shape.name, req, ns, r.us_graph, r.status, r.rel, r.reason))
            if self.fatal:
                return

    def run_sdpa(self, shape, sets, replicas, ref):
        why = sdpa_reason(shape)
        if why:
            return [na(shape.name, impl, why) for impl in ("sdpa-flash", "sdpa-cudnn")]
        recs = []
        psets, _, mask = self.peer_inputs(shape, sets)
        out_view = lambda o: o[:, :, 0]  # noqa: E731  [B, Hq, 1, D] -> [B, Hq, D]
        for impl, call in sdpa_calls(self.torch, shape, psets, mask):
            rec = self.run_one(shape, impl, call, replicas, ref, out_view=out_view)
            if rec.status == "n/a" and shape.ragged and impl == "sdpa-cudnn" and self.cuda_ok():
                rec2 = self.run_one(shape, impl, sdpa_additive_call(self.torch, psets, mask),
                                    replicas, ref, out_view=out_view)
                if rec2.status != "n/a":
                    rec = rec2
                else:
                    rec.reason += " || additive mask: " + rec2.reason
            if rec.status == "n/a" and shape.ragged:
                rec.reason = "padded batch + kv_len mask: " + rec.reason
            recs.append(rec)
            if self.fatal:
                break
        return recs

    # -- phase 2: the variant rows -----------------------------------------------
    def run_variant(self, shape):
        torch = self.torch
        replicas, kv_len, sets, ref = self.prepare(shape)
        recs = []
        line = [f"{shape.name} R={replicas} [{shape.features()}]"]
        if self.fd is None:
            recs.append(na(shape.name, "flashdecode", self.fd_error))
        elif shape.cascade:
            recs.append(self.run_cascade(shape, sets, replicas, ref))
        else:
            recs.append(self.run_ours_variant(shape, sets, kv_len, replicas, ref))
        if self.want_peers():
            recs += self.run_sdpa(shape, sets, replicas, ref)
        self._finish(shape, recs, line)
        del sets
        torch.cuda.empty_cache()

    def run_ours_variant(self, shape, sets, kv_len, replicas, ref):
        try:
            plan = make_plan(self.fd, self.torch, shape, 0)
            if shape.sinks:
                check_sinks_supported(plan, sets, kv_len)
        except Unavailable as exc:
            return na(shape.name, "flashdecode", str(exc))
        except Exception as exc:
            self.cuda_ok()
            return na(shape.name, "flashdecode", f"DecodePlan: {exc_text(exc)}")
        self.warm(shape, sets, kv_len, replicas)
        return self.run_one(shape, "flashdecode", ours_call(plan, sets, kv_len, sinks=shape.sinks),
                            replicas, ref, num_splits=getattr(plan, "num_splits", None),
                            out_view=lambda o: o[:, 0])

    def run_cascade(self, shape, sets, replicas, ref):
        try:
            casc = Cascade(self.fd, self.torch, shape, sets)
            casc.settle()
        except Unavailable as exc:
            return na(shape.name, "flashdecode", str(exc))
        except Exception as exc:
            self.cuda_ok()
            return na(shape.name, "flashdecode", f"cascade: {exc_text(exc)}")
        rec = self.run_one(shape, "flashdecode", casc.run, replicas, ref,
                           num_splits=casc.num_splits[0], out_view=lambda o: o[:, 0])
        self.notes.append(f"{shape.name}: {casc.describe()}")
        return rec

    # -- phase 2, MLA rows ---------------------------------------------------------
    def run_mla(self, shape):
        from .mla import run_ours
        line = [f"{shape.name} [{shape.features()}]"]
        self._finish(shape, run_ours(self, shape), line)

    def run_fi_mla(self, shape):
        from .mla import FiMla, run_fi
        fi = self.get_fi()
        if fi is not None and self.fi_mla is None:
            try:
                self.fi_mla = FiMla(self.torch, fi.fi)
            except Exception as exc:
                self.fi_error = f"unavailable: FlashInfer MLA setup failed: {exc_text(exc)}"
        if fi is None or self.fi_mla is None:
            self.recs += [na(shape.name, impl, self.fi_error) for impl in fi_impls_for(shape)]
            return
        recs, firsts = run_fi(self, shape, self.fi_mla)
        self.recs += recs
        self.fi_done.add(shape.name)
        self.log(f"{shape.name} " + " ".join(
            f"{r.impl}={fmt(r.us_graph, 2) if r.status == 'ok' else r.status}" for r in recs)
            + (f" ({'; '.join(firsts)})" if firsts else ""))
        if firsts:
            self.notes.append(f"{shape.name}: " + "; ".join(firsts))

    # -- phase 3: FlashInfer ---------------------------------------------------
    def get_fi(self):
        if self.fi is None and not self.fi_error:
            fi, why = import_flashinfer()
            if fi is None:
                self.fi_error = why
            else:
                try:
                    self.fi = FlashInferPeers(self.torch, fi)
                    self.notes.append(f"FlashInfer {self.fi.version} (decode paths on 16-key "
                                      f"pages scattered over the pool)")
                except Exception as exc:
                    self.fi_error = f"unavailable: FlashInfer setup failed: {exc_text(exc)}"
        return self.fi

    def wait_prebuild(self):
        p = self.prebuild
        if p is None or not p.running():
            return
        left = self.args.budget_s - self.elapsed()
        limit = min(left * 0.5, 300)
        self.log(f"waiting up to {limit:.0f}s for the FlashInfer JIT prebuild "
                 f"(running {time.monotonic() - p.started:.0f}s)")
        rc = p.wait(limit)
        self.log(f"prebuild {'finished, exit ' + str(rc) if rc is not None else 'still running'}")

    def run_fi_shape(self, shape):
        impls = fi_impls_for(shape)
        fi = self.get_fi()
        if fi is None:
            self.recs += [na(shape.name, impl, self.fi_error) for impl in impls]
            return
        torch = self.torch
        todo = [impl for impl in impls if not fi_reason(shape, impl)]
        recs = [na(shape.name, impl, fi_reason(shape, impl)) for impl in impls
                if fi_reason(shape, impl)]
        prep = None
        if todo:
            try:
                prep = FiPrep(torch, shape, replicas_for(shape.kv_bytes))
            except Exception as exc:
                self.cuda_ok()
                recs += [na(shape.name, impl, f"FlashInfer inputs: {exc_text(exc)}")
                         for impl in todo]
                todo = []
        firsts = []
        for impl in todo:
            if self.fatal:
                recs.append(Rec(shape.name, impl, status="skipped", reason=self.fatal))
                continue
            try:
                call = fi.build(impl, shape, prep)
                secs = first_call_seconds(torch, call)
                if secs > 5:
                    firsts.append(describe_first(impl, secs))
                rec = self.run_one(shape, impl, call, len(prep.sets), prep.ref)
            except Unavailable as exc:
                rec = na(shape.name, impl, str(exc))
            except Exception as exc:
                rec = na(shape.name, impl, exc_text(exc, 200))
                self.cuda_ok()
            recs.append(rec)
        self.recs += recs
        self.fi_done.add(shape.name)
        self.log(f"{shape.name} " + " ".join(
            f"{r.impl}={fmt(r.us_graph, 2) if r.status == 'ok' else r.status}" for r in recs)
            + (f" ({'; '.join(firsts)})" if firsts else ""))
        if firsts:
            self.notes.append(f"{shape.name}: " + "; ".join(firsts))
        del prep
        torch.cuda.empty_cache()

    # -- phase 4: FlexAttention ------------------------------------------------
    def run_flex_shape(self, shape):
        torch = self.torch
        why = flex_reason(shape)
        if why:
            self.recs.append(na(shape.name, "flex", why))
            return
        if self.flex.error:
            self.recs.append(na(shape.name, "flex", self.flex.error))
            return
        replicas, _, sets, ref = self.prepare(shape)
        psets, lens_t, _ = self.peer_inputs(shape, sets)
        del sets
        try:
            call = self.flex.call(shape, psets, lens_t)
            rec = self.run_one(shape, "flex", call, replicas, ref, out_view=lambda o: o[:, :, 0])
        except Unavailable as exc:
            rec = na(shape.name, "flex", str(exc))
        except Exception as exc:
            rec = na(shape.name, "flex", short(exc, 160))
            self.cuda_ok()
        psets = None
        torch.cuda.empty_cache()
        # A compiler that fails everywhere would cost its compile time on every row.
        self.flex.failures = self.flex.failures + 1 if rec.status == "n/a" else 0
        if self.flex.failures >= 3:
            self.flex.error = "flex failed on 3 rows in a row, not tried again: " + rec.reason
        self.recs.append(rec)
        self.log(f"{shape.name} flex={fmt(rec.us_graph, 2) if rec.status == 'ok' else rec.status}"
                 + (f" ({short(rec.reason, 80)})" if rec.status != "ok" else ""))

    # -- the run ---------------------------------------------------------------
    def _skip(self, shape, impl, what):
        self.recs.append(Rec(shape.name, impl, status="skipped",
                             reason=self.fatal or f"time budget {self.args.budget_s:.0f}s ({what})"))

    def run(self):
        """Yields after every measured shape (the caller rewrites the CSV each time)."""
        args = self.args
        for shape in self.shapes:  # phase 1
            if self.fatal or self.over_budget():
                self._skip(shape, "flashdecode", "grid rows")
                self.notes.append(f"{shape.name} skipped ({self.fatal or 'time budget'})")
                continue
            peer_source = None
            if shape.page_size and shape.base in self.done:
                peer_source = self.done[shape.base]
            try:
                self.run_shape(shape, peer_source)
            except Exception as exc:
                self._phase_error(shape, "flashdecode", exc)
            yield shape
        for shape in self.variants:  # phase 2
            if self.fatal or self.over_budget():
                self._skip(shape, "flashdecode", "variant rows")
                continue
            try:
                self.run_variant(shape)
            except Exception as exc:
                self._phase_error(shape, "flashdecode", exc)
            yield shape
        for shape in self.mla:  # phase 2, MLA rows
            if self.fatal or self.over_budget():
                self._skip(shape, "flashdecode", "MLA rows")
                continue
            try:
                self.run_mla(shape)
            except Exception as exc:
                self._phase_error(shape, "flashdecode", exc)
            yield shape
        if self.want_fi():  # phase 3
            todo = [s for s in self.all_shapes if s.name in self.done
                    and (measured_by_fi(s) or s.base not in self.done)]
            if todo:
                self.wait_prebuild()
            for shape in todo:
                if self.fatal or self.over_budget():
                    for impl in fi_impls_for(shape):
                        self._skip(shape, impl, "FlashInfer")
                    continue
                try:
                    if shape.rope_dim:
                        self.run_fi_mla(shape)
                    else:
                        self.run_fi_shape(shape)
                except Exception as exc:
                    self._phase_error(shape, fi_impls_for(shape)[0], exc)
                yield shape
        self.stop_prebuild()
        if self.want_peers() and not args.no_flex:  # phase 4
            for shape in self.all_shapes:
                if shape.name not in self.done or shape.rope_dim or (
                        shape.page_size and shape.base in self.done and not shape.is_variant):
                    continue
                if shape.is_variant and not args.flex_variants and not flex_reason(shape):
                    self.recs.append(na(shape.name, "flex", "not run (variant rows need "
                                                            "--flex-variants: compile time)"))
                    continue
                if self.fatal or self.over_budget():
                    self._skip(shape, "flex", "FlexAttention")
                    continue
                try:
                    self.run_flex_shape(shape)
                except Exception as exc:
                    self._phase_error(shape, "flex", exc)
                yield shape
        for shape in self.shapes:  # phase 5: paged rows restate their base row's peers
            if shape.page_size and shape.base in self.done and shape.name in self.done:
                base = [r for r in self.recs if r.shape == shape.base]
                impls = ("flex",) + (tuple(fi_impls_for(shape))
                                     if shape.name not in self.fi_done else ())
                self.recs += self.copied(shape, base, impls)

    def _phase_error(self, shape, impl, exc):
        msg = exc_text(exc, 200)
        self.notes.append(f"{shape.name} ({impl}): {msg}")
        self.recs.append(na(shape.name, impl, msg))
        self.log(f"{shape.name} FAILED to run ({impl}): {msg}")
        self.cuda_ok()
        try:
            self.torch.cuda.empty_cache()
        except Exception:
            pass
