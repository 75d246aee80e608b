"""``chainrows import-gym`` throughput against hashlib's SHA-256 over the same bytes.

The data is an agent-shaped NeMo Gym dump written by ``chainrows.formats.gym.export_gym``: each
rollout one chain of ``CALLS`` calls (every call continues the previous one), deltas of
``CARRY`` observation and ``GEN`` generated tokens, ids from a 150k vocabulary, float logprobs.
It is cached under the bench cache (``common.cache_root``), keyed by its shape and a hash of
chainrows.formats.gym.

Units. *Staged token bytes* are the bytes Gym serializes per staged token for its staging
digest: the id as u64 and the mask and logprob as binary32, 16 bytes. Throughput is staged
token MB per second of ``import_gym`` (parse, verify, write). Two floors, each hashlib SHA-256
over prebuilt buffers, on 1 and on 2 threads:

- ``staged``: the staged token bytes once each (the issue's floor);
- ``checks``: every byte the checks (docs/gym.md) must hash (staging digest, chain hash, extras
  and the cumulative hash, whose input is the whole sequence up to the call: it cannot reuse
  the parent's SHA-256 state, docs/gym.md).

The verifier alone (structural checks and every SHA-256, on calls parsed beforehand) is timed
too, and the import once more with the exact parser alone (``importer.FAST_STAGED = False``:
json.loads of every staged line instead of chainrows.formats.gym.fast's kernel). Import rows also
give CPU seconds (process time, all threads), steadier than walls on a shared machine.
``python -m asv_benchmarks.gym`` prints all of it from one run; the asv class ``ImportGym``
times the import, the verifier and the floors.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from asv_benchmarks import common

CALLS, CARRY, GEN = 8, 400, 200
TOKEN_BYTES = 16  # u64 id + f32 mask + f32 logprob


def _gym_version() -> str:
    import chainrows.formats.gym as gym

    h = hashlib.sha256()
    for path in sorted(Path(gym.__file__).parent.glob("*.py")):
        h.update(path.read_bytes())
    return h.hexdigest()[:12]


def dump_dir(rollouts: int, seed: int = 0) -> Path:
    """The cached dump for ``rollouts`` rollouts (written on first use)."""
    root = common.cache_root() / f"gym-{rollouts}-{CALLS}x{CARRY}+{GEN}-s{seed}-{_gym_version()}"
    if (root / "dump" / "receipts.jsonl").exists():
        return root / "dump"
    tmp = Path(tempfile.mkdtemp(dir=common.cache_root()))
    try:
        _write_raw(tmp, rollouts, seed)
        from chainrows.formats.gym import export_gym

        export_gym(tmp / "ledger.jsonl", tmp / "tokens.jsonl", tmp / "results.jsonl", tmp / "dump")
        shutil.rmtree(root, ignore_errors=True)
        tmp.rename(root)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return root / "dump"


def _write_raw(folder: Path, rollouts: int, seed: int) -> None:
    import numpy as np
    import xxhash

    rng = np.random.default_rng(seed)
    pick = random.Random(seed)
    with open(folder / "ledger.jsonl", "w") as led, open(folder / "tokens.jsonl", "w") as tok, \
            open(folder / "results.jsonl", "w") as res:
        for r in range(rollouts):
            rid, prev, seed_hash, output = f"r{r}", 0, 0, []
            for i in range(CALLS):
                delta = rng.integers(0, 150_000, CARRY + GEN).tolist()
                lp = [0.0] * CARRY + np.round(-rng.exponential(0.5, GEN), 6).tolist()
                item = {"type": "message", "role": "assistant", "id": f"m{r}-{i}",
                        "content": [{"type": "output_text", "text": f"step {i} of {rid} {pick.random()}"}]}
                seed_hash = xxhash.xxh3_64_intdigest(np.array(delta, "<i4").tobytes(), seed_hash)
                led.write(json.dumps(dict(rollout_id=rid, call_id=f"c{i}", parent_id=f"c{i - 1}" if i else None,
                                          response_id=f"resp{i}", prev_len=prev, delta_len=len(delta), gen_len=GEN,
                                          chain_hash=seed_hash, output_items=[item])) + "\n")
                tok.write(json.dumps(dict(rollout_id=rid, call_id=f"c{i}", tokens=delta, logprobs=lp)) + "\n")
                prev += len(delta)
                output.append(item)
            res.write(json.dumps(dict(rollout_id=rid, group_id=f"g{r // 8}", reward=pick.random(), output=output,
                                      terminal_response_id=f"resp{CALLS - 1}")) + "\n")


# ----------------------------------------------------------------------------- floors

def hash_buffers(rollouts: int, seed: int = 0) -> dict:
    """Prebuilt buffers: ``staged`` (16 bytes per staged token, one buffer per call) and
    ``checks`` (per call the buffers the checks hash, the cumulative prefix included)."""
    import numpy as np

    from chainrows.formats.gym import wire as W

    staged, checks = [], []
    with open(dump_dir(rollouts, seed) / "staged.jsonl", "rb") as f:
        bodies: dict = {}
        for line in f:
            st = json.loads(line)
            ids = np.array(st["token_ids_delta"], dtype=np.uint64)
            mask = np.array(st["token_mask_delta"], dtype=np.float32)
            lp = np.array(st["generation_log_probs_delta"], dtype=np.float32)
            body = W.ids_body(ids)
            staged.append(body + W.f32s(mask)[8:] + W.f32s(lp)[8:])
            prefix = bodies.get((st["rollout_id"], st["parent_call_id"]), b"") + body
            bodies[(st["rollout_id"], st["model_call_id"])] = prefix
            checks.append(body + W.f32s(mask) + W.f32s(lp))  # staging digest
            checks.append(body)  # chain hash
            checks.append(prefix)  # cumulative hash
    return {"staged": staged, "checks": checks}


def sha_floor(buffers: list, threads: int) -> float:
    """Seconds to SHA-256 every buffer with hashlib on ``threads`` threads (best of 3)."""

    def run(part):
        for b in part:
            hashlib.sha256(b).digest()

    parts = [buffers[i::threads] for i in range(threads)]
    best = float("inf")
    with ThreadPoolExecutor(threads) as pool:
        for _ in range(3):
            t0 = time.perf_counter()
            list(pool.map(run, parts))
            best = min(best, time.perf_counter() - t0)
    return best


def import_seconds(rollouts: int, threads: int, seed: int = 0, repeats: int = 2, fast: bool = True) -> tuple:
    """(best wall seconds, CPU seconds of that run) of import_gym; ``fast`` False: the exact
    staged parser alone."""
    from chainrows.formats.gym import import_gym, importer

    dump = dump_dir(rollouts, seed)
    best = (float("inf"), 0.0)
    saved = importer.FAST_STAGED
    importer.FAST_STAGED = fast
    try:
        warm = Path(tempfile.mkdtemp(dir=common.cache_root()))
        import_gym(dump, warm / "ds", threads=threads)  # loads (or compiles) the jit cache
        shutil.rmtree(warm, ignore_errors=True)
        for _ in range(repeats):
            out = Path(tempfile.mkdtemp(dir=common.cache_root())) / "ds"
            try:
                t0, c0 = time.perf_counter(), time.process_time()
                import_gym(dump, out, threads=threads)
                best = min(best, (time.perf_counter() - t0, time.process_time() - c0))
            finally:
                shutil.rmtree(out.parent, ignore_errors=True)
    finally:
        importer.FAST_STAGED = saved
    return best


def parsed_rollouts(rollouts: int, seed: int = 0) -> list:
    """(rollout_id, records, staged) of every rollout, as the importer hands them to the verifier."""
    from chainrows.formats.gym import records as G

    dump = dump_dir(rollouts, seed)
    receipts = [G.parse_receipt(G.parse_line(raw, dump, n, "receipts")) for n, raw in G.iter_raw(dump / "receipts.jsonl", "receipts")]
    staged: dict = {}
    for n, raw in G.iter_raw(dump / "staged.jsonl", "staged"):
        st = G.parse_staged(G.parse_line(raw, dump, n, "staged"))
        staged.setdefault(st.rollout_id, {})[st.model_call_id] = st
    return [(rc.rollout_id, rc.manifest, staged.get(rc.rollout_id, {})) for rc in receipts]


def verify_seconds(parsed: list, threads: int, repeats: int = 3) -> float:
    """Seconds for the verifier alone (structural checks + every SHA-256) on parsed calls."""
    from chainrows.formats.gym.verify import Verifier

    best = float("inf")
    with Verifier(threads) as verifier:
        for _ in range(repeats):
            t0 = time.perf_counter()
            for i in range(0, len(parsed), 64):  # the importer's batches hold ~4M tokens; these ~300k
                verifier.verify(parsed[i:i + 64])
            best = min(best, time.perf_counter() - t0)
    return best


def staged_tokens(rollouts: int) -> int:
    return rollouts * CALLS * (CARRY + GEN)


# ----------------------------------------------------------------------------- asv

class ImportGym:
    """import_gym on an agent-shaped dump, and the hashlib floors over the same bytes."""

    params = [[64], [1, 2]]
    param_names = ["rollouts", "threads"]
    timeout = 600
    repeat = (1, 3, 60.0)

    def setup(self, rollouts, threads):
        self.dump = dump_dir(rollouts)
        self.buffers = hash_buffers(rollouts)
        self.parsed = parsed_rollouts(rollouts)
        self.tmp = Path(tempfile.mkdtemp(dir=common.cache_root()))

    def teardown(self, rollouts, threads):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def time_import_gym(self, rollouts, threads):
        from chainrows.formats.gym import import_gym

        out = self.tmp / f"ds-{time.perf_counter_ns()}"
        import_gym(self.dump, out, threads=threads)
        shutil.rmtree(out, ignore_errors=True)

    def time_verify_only(self, rollouts, threads):
        verify_seconds(self.parsed, threads, repeats=1)

    def time_sha256_staged_floor(self, rollouts, threads):
        sha_floor(self.buffers["staged"], threads)

    def time_sha256_checks_floor(self, rollouts, threads):
        sha_floor(self.buffers["checks"], threads)


# ----------------------------------------------------------------------------- one run

def main(argv=None) -> int:
    global CALLS, CARRY, GEN
    p = argparse.ArgumentParser(prog="python -m asv_benchmarks.gym", description=__doc__.splitlines()[0])
    p.add_argument("--rollouts", type=int, default=256, help="rollouts in the dump (default 256: 29 MB staged.jsonl)")
    p.add_argument("--calls", type=int, default=CALLS, help=f"calls per rollout, one chain (default {CALLS})")
    p.add_argument("--carry", type=int, default=CARRY, help=f"observation tokens per delta (default {CARRY})")
    p.add_argument("--gen", type=int, default=GEN, help=f"generated tokens per delta (default {GEN})")
    args = p.parse_args(argv)
    CALLS, CARRY, GEN = args.calls, args.carry, args.gen
    n = args.rollouts
    dump = dump_dir(n)
    mb = staged_tokens(n) * TOKEN_BYTES / 1e6
    size = (dump / "staged.jsonl").stat().st_size / 1e6
    buffers = hash_buffers(n)
    check_mb = sum(len(b) for b in buffers["checks"]) / 1e6
    print(f"dump: {n} rollouts x {CALLS} calls x {CARRY + GEN} tokens; staged.jsonl {size:.1f} MB; "
          f"staged token bytes {mb:.1f} MB; bytes the checks hash {check_mb:.1f} MB")
    print(f"{'':<28}{'1 thread':>14}{'2 threads':>14}")
    parsed = parsed_rollouts(n)
    rates, cpus = {}, {}
    for name, label in (("import", "import_gym MB/s"), ("exact", "import_gym, exact parser"),
                        ("verify", "verifier alone MB/s"),
                        ("staged", "sha256 staged floor MB/s"), ("checks", "sha256 checks floor MB/s")):
        row = []
        for threads in (1, 2):
            if name in ("import", "exact"):
                seconds, cpu = import_seconds(n, threads, fast=name == "import")
                cpus[name, threads] = cpu
            elif name == "verify":
                seconds = verify_seconds(parsed, threads)
            else:
                seconds = sha_floor(buffers[name], threads)
            rate = mb / seconds if name != "checks" else check_mb / seconds
            rates[name, threads] = (rate, seconds)
            row.append(f"{rate:>9.1f} ({seconds:.2f}s)")
        print(f"{label:<28}" + "".join(f"{c:>14}" for c in row))
    print(f"{'import CPU s (fast, exact)':<28}" + "".join(
        f"{cpus['import', t]:>7.2f}, {cpus['exact', t]:.2f}" for t in (1, 2)))
    print("time ratios (target <= 2x):")
    for threads in (1, 2):
        staged_floor, checks_floor = rates["staged", threads][1], rates["checks", threads][1]
        for name in ("import", "exact", "verify"):
            t = rates[name, threads][1]
            print(f"  {threads} thread(s) {name:<7} / staged floor {t / staged_floor:6.1f}x   "
                  f"/ checks floor {t / checks_floor:5.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
