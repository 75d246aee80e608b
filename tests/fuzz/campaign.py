"""The campaign: families of seeded cases, each made from ``(seed, family, index)`` alone (so a
case can be made again), run through the CLI in a worker process (``CliWorker``: an abort or a
hang is seen as such) or, for the kills, as a command of its own, and checked (:func:`check`).

A failing case keeps its directory (inputs, ``command.json``, the result) under the replay
directory; ``python -m tests.fuzz --replay DIR`` runs it again.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tests.support.cli_worker import CliResult, CliWorker, default_sigint
from tests.support.footers import encode_struct, split
from tests.support.oracle import check_against_oracle, option_args
from tests.support.outputs import read_output
from tests.support.paths import REPO

TABLES = ("ledger", "tokens", "rollouts")
STARTUP_S = 0.15
FAMILIES = ("bytes", "footer", "values", "cli", "importers", "kills")
WEIGHTS = {"bytes": 4, "footer": 4, "values": 5, "cli": 6, "importers": 5, "kills": 1}
INT_POOL = (0, 1, -1, 2, 2**31 - 1, 2**31, 2**53 + 1, 2**62, 2**63 - 1, -(2**63))
TOKEN_POOL = (0, -1, 2**31 - 1, -(2**31), 151_000)
FLOAT_POOL = (float("nan"), float("inf"), -float("inf"), None, 1e30, -1e30, 1e308, -1e308, 2.0**53, -0.0,
              5e-324, 0.5)
ID_POOL = ("", " ", "\x00", "é", "\U0001F642", "\u202eevil", "x" * 300, "r_s0", None)
JSON_POOL = ("null", "1e400", "-1", "\"x\"", "[]", "{}", "NaN", "1" + "0" * 30, "true", "-0", "\"\"", "[null]")
NUMBERS = ("", " ", "-1", "0", "1", "3", "1e400", "nan", "inf", "-inf", "1e400GiB", "1MiB", "64MiB",
           str(1 << 63), str(1 << 64), "9" * 30, "abc", "1.5", "0x10", "+2", "1_000")


@dataclass
class Case:
    family: str
    index: int
    dir: Path
    argv: list[str]
    out: str | None  # the OUT argument, relative to ``dir``
    inputs: list[str]  # files and directories that must not change
    expect: tuple = (0, 2)
    oracle: dict | None = None  # reassemble options: compare with the reference
    tables: tuple = TABLES  # what a complete OUT holds
    kill: dict | None = None
    notes: str = ""


@dataclass
class Tally:
    cases: Counter = field(default_factory=Counter)
    exits: Counter = field(default_factory=Counter)
    failures: list = field(default_factory=list)


# ---------------------------------------------------------------------------------- the base
def make_base(root: Path) -> Path:
    """The inputs every case starts from, made once per campaign under ``root/base``."""
    from chainrows.formats.calls.export import export_calls, write_results_jsonl
    from chainrows.formats.native.dataset import read_dataset
    from chainrows.synth import write_synth_dataset

    base = root / "base"
    if (base / "done").exists():
        return base
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    write_synth_dataset(base / "data", 24, seed=11, corrupt_rate=0.3, mean_gen_tokens=40, prompt_tokens=60)
    write_synth_dataset(base / "clean", 12, seed=1, corrupt_rate=0.0, mean_gen_tokens=30, prompt_tokens=40)
    clean = read_dataset(base / "clean")
    pq.write_table(export_calls(clean.ledger, clean.tokens), base / "calls.parquet")
    write_results_jsonl(base / "calls-results.jsonl", clean.rollouts)
    calls = pq.read_table(base / "calls.parquet").to_pylist()
    with open(base / "calls.jsonl", "w", encoding="utf-8") as f:
        for rec in calls:
            f.write(json.dumps(rec) + "\n")
    shutil.copytree(REPO / "examples" / "gym" / "raw", base / "raw")
    shutil.copytree(REPO / "examples" / "gym" / "dump", base / "dump")
    from chainrows.runners.bulk import run as reassemble_dir

    reassemble_dir(base / "data", base / "reassembled")  # what inspect and pack read
    (base / "done").touch()
    return base


# ------------------------------------------------------------------------------- the families
def make_case(family: str, seed: int, index: int, root: Path, base: Path) -> Case:
    rng = random.Random(f"{seed}/{family}/{index}")
    d = root / f"{family}-{index}"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    return MAKERS[family](rng, d, base, index)


def _dataset(rng, d: Path, base: Path) -> Path:
    data = d / "data"
    shutil.copytree(base / "data", data)
    return data


def _options(rng) -> dict:
    return dict(mode=rng.choice(("cc", "cc", "ordinary")), placeholders=rng.random() < 0.5,
                baseline=rng.choice(("mean", "loo")), no_std=rng.random() < 0.3,
                baseline_population=rng.choice(("all", "ok")), row_weight=rng.choice(("rollout", "row")))


def _reassemble(rng, d: Path, family: str, index: int, notes: str) -> Case:
    opts = _options(rng)
    extra = ["--buckets", "3"] if rng.random() < 0.2 else []
    argv = ["reassemble", "data", "out", *option_args(opts), *extra]
    return Case(family, index, d, argv, "out", ["data"], oracle=opts, tables=("rows", "report"), notes=notes)


def make_bytes(rng, d, base, index) -> Case:
    """Bit flips, overwritten ranges, zeroed runs, truncation of one Parquet file."""
    data = _dataset(rng, d, base)
    name = rng.choice(TABLES)
    path = data / f"{name}.parquet"
    raw = bytearray(path.read_bytes())
    n = len(raw)
    how = rng.choice(("flip", "flip", "overwrite", "truncate", "zero", "tail"))
    if how == "flip":
        for _ in range(rng.randint(1, 4)):
            raw[rng.randrange(n)] ^= 1 << rng.randrange(8)
    elif how == "overwrite":
        pos = rng.randrange(n)
        raw[pos:pos + 8] = rng.randbytes(rng.randint(1, 8))
    elif how == "truncate":
        raw = raw[:rng.randrange(n)]
    elif how == "zero":
        pos = rng.randrange(n)
        k = min(rng.randint(1, 256), n - pos)
        raw[pos:pos + k] = bytes(k)
    else:  # a byte of the footer's last 400
        raw[n - 8 - rng.randint(1, min(400, n - 9))] = rng.randrange(256)
    path.write_bytes(bytes(raw))
    return _reassemble(rng, d, "bytes", index, f"{how} {name}")


def _fields(s, out, where=()):
    """Every (container, key) of a decoded footer, depth first."""
    items = s.items() if isinstance(s, dict) else enumerate(s)
    for k, v in items:
        out.append((s, k, where))
        if isinstance(v, (dict, list)):
            _fields(v, out, where + (k,))
    return out


def make_footer(rng, d, base, index) -> Case:
    """One field of a Parquet footer changed where it is decoded (Thrift compact): an integer to
    an extreme, a list shortened or grown, a binary cut or lengthened, a field dropped."""
    data = _dataset(rng, d, base)
    name = rng.choice(TABLES)
    path = data / f"{name}.parquet"
    body, meta = split(path.read_bytes())
    fields = _fields(meta, [])
    for _ in range(rng.randint(1, 2)):
        s, k, where = rng.choice(fields)
        v = s[k]
        if isinstance(v, bool):
            s[k] = not v
        elif isinstance(v, int):
            s[k] = rng.choice((0, -1, 1, v + 1, v - 1, 2 * v + 1, 2**31 - 1, -(2**31), 99))
        elif isinstance(v, bytes):
            s[k] = rng.choice((b"", v[:-1], v + b"\1", v[:1]))
        elif isinstance(v, list) and v:
            if rng.random() < 0.5:
                v.pop(rng.randrange(len(v)))
            else:
                v.append(v[rng.randrange(len(v))])
        elif isinstance(s, dict) and k not in (1,):
            del s[k]
            s.kinds.pop(k)
    try:
        path.write_bytes(body + _encoded(meta))
    except (ValueError, TypeError, KeyError):
        pass  # not encodable as changed: the file stays as it was
    return _reassemble(rng, d, "footer", index, f"footer {name}")


def _encoded(meta) -> bytes:
    footer = encode_struct(meta)
    return footer + len(footer).to_bytes(4, "little") + b"PAR1"


def make_values(rng, d, base, index) -> Case:
    """Schema-valid value mutations (the same types, hostile values) in one to three places."""
    data = d / "data"
    data.mkdir()
    tables = {n: pq.read_table(base / "data" / f"{n}.parquet") for n in TABLES}
    notes = []
    for _ in range(rng.randint(1, 3)):
        name = rng.choice(TABLES)
        tables[name], what = _mutate(rng, tables[name])
        notes.append(f"{name}.{what}")
    for n, tab in tables.items():
        pq.write_table(tab, data / f"{n}.parquet", row_group_size=rng.choice((None, 7, 50)))
    return _reassemble(rng, d, "values", index, " ".join(notes))


def _mutate(rng, table: pa.Table) -> tuple[pa.Table, str]:
    rows = table.to_pylist()
    how = rng.choice(("value", "value", "value", "duplicate", "drop", "shuffle"))
    if how == "duplicate" and rows:
        rows.insert(rng.randrange(len(rows) + 1), dict(rows[rng.randrange(len(rows))]))
    elif how == "drop" and rows:
        rows.pop(rng.randrange(len(rows)))
    elif how == "shuffle":
        rng.shuffle(rows)
    elif rows:
        col = rng.choice(table.column_names)
        typ = table.schema.field(col).type
        i = rng.randrange(len(rows))
        for _ in range(5):
            rows[i][col] = _hostile(rng, typ, rows[i][col], [r[col] for r in rows])
            try:
                return pa.Table.from_pylist(rows, schema=table.schema), f"{col}[{i}]"
            except (pa.ArrowException, OverflowError, TypeError, ValueError):
                continue
        return table, "none"
    return pa.Table.from_pylist(rows, schema=table.schema), how


def _hostile(rng, typ: pa.DataType, old, column: list):
    if rng.random() < 0.1:
        return None
    if pa.types.is_list(typ) or pa.types.is_large_list(typ):
        old = list(old or [])
        how = rng.choice(("empty", "cut", "grow", "reverse", "entry"))
        if how == "empty":
            return []
        if how == "cut":
            return old[:rng.randrange(len(old) + 1)]
        if how == "reverse":
            return old[::-1]
        elem = _hostile(rng, typ.value_type, old[0] if old else None, old)
        if how == "grow":
            return old + [elem]
        if old:
            old[rng.randrange(len(old))] = elem
        return old
    if pa.types.is_integer(typ):
        pool = TOKEN_POOL if typ.bit_width <= 32 else INT_POOL
        return rng.choice(pool + ((old + 1, old - 1) if isinstance(old, int) else ()))
    if pa.types.is_floating(typ):
        return rng.choice(FLOAT_POOL)
    if pa.types.is_boolean(typ):
        return rng.random() < 0.5
    if pa.types.is_string(typ) or pa.types.is_large_string(typ):
        return rng.choice(ID_POOL + tuple(v for v in column[:20] if v is not None))
    return old


def make_cli(rng, d, base, index) -> Case:
    """Command-line abuse: every command, each argument from a pool of hostile ones, options with
    values they cannot represent, OUT absent, empty or holding a result."""
    from chainrows.cli import COMMANDS

    shutil.copytree(base / "data", d / "data")
    shutil.copytree(base / "raw", d / "raw")
    (d / "file").write_text("not a directory\n")
    command = rng.choice(sorted(COMMANDS))
    good = {"reassemble": ["data", "out"], "stats": ["data"], "synth": ["out"],
            "import-jsonl": ["raw/ledger.jsonl", "raw/tokens.jsonl", "raw/results.jsonl", "out"],
            "export-gym": ["raw/ledger.jsonl", "raw/tokens.jsonl", "raw/results.jsonl", "out"],
            "import-gym": ["dump", "out"], "import-calls": ["calls.jsonl", "calls-results.jsonl", "out"],
            "explain": ["data", "r00000003"], "inspect": ["reassembled", "--data", "data", "--html", "pages/page.html"],
            "pack": ["reassembled", "out", "--max-tokens", "4096"]}[command]
    if command in ("inspect", "pack"):
        shutil.copytree(base / "reassembled", d / "reassembled")
        (d / "pages").mkdir()
    if command == "import-gym":
        shutil.copytree(base / "dump", d / "dump")
    if command == "import-calls":
        shutil.copy(base / "calls.jsonl", d)
        shutil.copy(base / "calls-results.jsonl", d)
    args = list(good)
    for i in range(len(args)):
        if args[i].startswith("--") or (i and args[i - 1] == "--max-tokens"):
            continue
        if i and args[i - 1] == "--html":  # the page is OUT's one file: only refusals, never a stray write
            args[i] = rng.choice(("", " ", "\t", args[i], args[i]))
            continue
        if rng.random() < 0.25:
            args[i] = rng.choice(("", " ", "\t", "missing", "file", ".", "data", "data/inner", "out/../out",
                                  "-", "é" * 40, "a" * 300, "raw"))
    options = {"reassemble": ["--memory-budget", "--threads", "--mode", "--buckets", "--steps", "--hold-runs"],
               "stats": ["--memory-budget", "--threads"], "import-gym": ["--memory-budget", "--threads"],
               "import-calls": ["--memory-budget", "--on-drift"],
               "synth": ["--rollouts", "--seed", "--group-size", "--corrupt-rate", "--worker-rate", "--workers"],
               "explain": ["--mode", "--plan", "--baseline"], "inspect": ["--sample"],
               "pack": ["--max-tokens", "--world-size", "--seed", "--window"],
               }.get(command, [])
    extra = []
    for opt in options:
        if rng.random() < 0.35:
            extra += [opt, rng.choice(NUMBERS + ("cc", "forest"))]
    if command == "synth" and "--rollouts" not in extra:
        extra += ["--rollouts", "5"]
    if rng.random() < 0.2:
        extra.append(rng.choice(("--overwrite", "--resume", "--no-progress", "--bogus", "--ray=")))
    out = {"stats": None, "explain": None, "inspect": "pages"}.get(command, args[1] if command == "pack" else args[-1])
    if out and rng.random() < 0.3 and out == "out":  # OUT exists: empty, or holding a result
        (d / "out").mkdir()
        if rng.random() < 0.5:
            (d / "out" / "keep.txt").write_text("mine\n")
    written = [] if command == "inspect" else [out] if out else []
    inputs = [a for a in args if a not in written and not a.startswith("--") and a.strip() and _exists(d / a)]
    tables = {"reassemble": ("rows", "report"), "export-gym": ("receipts.jsonl",),
              "import-calls": ("ledger", "tokens", "rollouts", "import_report"),
              "inspect": ("page.html",), "pack": ("packing",)}.get(command, TABLES)
    return Case("cli", index, d, [command, *args, *extra], out, inputs + ["raw", "file"], tables=tables,
                notes=command)


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except OSError:  # a name too long
        return False


def make_importers(rng, d, base, index) -> Case:
    """Damaged importer input: a line dropped, doubled or swapped, a byte flipped, the file cut,
    a JSON value replaced by a hostile one, for import-jsonl, import-gym and import-calls."""
    which = rng.choice(("import-jsonl", "import-gym", "import-calls", "import-calls-parquet"))
    if which == "import-jsonl":
        shutil.copytree(base / "raw", d / "raw")
        files = ["raw/ledger.jsonl", "raw/tokens.jsonl", "raw/results.jsonl"]
        argv, inputs = ["import-jsonl", *files, "out"], ["raw"]
    elif which == "import-gym":
        shutil.copytree(base / "dump", d / "dump")
        files = ["dump/receipts.jsonl", "dump/staged.jsonl", "dump/results.jsonl"]
        argv, inputs = ["import-gym", "dump", "out"], ["dump"]
    else:
        log = "calls.parquet" if which.endswith("parquet") else "calls.jsonl"
        shutil.copy(base / log, d)
        shutil.copy(base / "calls-results.jsonl", d)
        files = [log, "calls-results.jsonl"]
        argv, inputs = ["import-calls", log, "calls-results.jsonl", "out"], files
    target = d / rng.choice(files)
    raw = target.read_bytes()
    how = _damage_lines(rng, target, raw) if target.suffix == ".jsonl" else _damage_bytes(rng, target, raw)
    tables = ("ledger", "tokens", "rollouts", "import_report") if argv[0] == "import-calls" else TABLES
    return Case("importers", index, d, argv, "out", inputs, tables=tables, notes=f"{which} {target.name} {how}")


def _damage_lines(rng, target: Path, raw: bytes) -> str:
    lines = raw.split(b"\n")
    how = rng.choice(("drop", "double", "swap", "value", "value", "flip", "cut"))
    i = rng.randrange(len(lines))
    if how == "drop":
        lines.pop(i)
    elif how == "double":
        lines.insert(i, lines[i])
    elif how == "swap":
        j = rng.randrange(len(lines))
        lines[i], lines[j] = lines[j], lines[i]
    elif how == "value":
        line = lines[i].decode("utf-8", "replace")
        spots = [k for k, ch in enumerate(line) if ch == ":"]
        if spots:
            k = rng.choice(spots) + 1
            end = k
            depth = 0
            while end < len(line) and not (depth == 0 and line[end] in ",}"):
                depth += line[end] in "[{"
                depth -= line[end] in "]}"
                end += 1
            line = line[:k] + " " + rng.choice(JSON_POOL) + line[end:]
        lines[i] = line.encode("utf-8")
    else:
        return _damage_bytes(rng, target, raw)
    target.write_bytes(b"\n".join(lines))
    return how


def _damage_bytes(rng, target: Path, raw: bytes) -> str:
    raw = bytearray(raw)
    if rng.random() < 0.5:
        for _ in range(rng.randint(1, 3)):
            raw[rng.randrange(len(raw))] ^= 1 << rng.randrange(8)
        how = "flip"
    else:
        raw = raw[:rng.randrange(len(raw))]
        how = "cut"
    target.write_bytes(bytes(raw))
    return how


def make_kills(rng, d, base, index) -> Case:
    """SIGKILL, SIGINT or SIGTERM at a random moment of a reassemble (the spill path, with work
    to resume) that replaces an earlier output or writes a new one; then the rerun with --resume."""
    shutil.copytree(base / "data", d / "data")
    sig = rng.choice(("SIGKILL", "SIGKILL", "SIGINT", "SIGTERM"))
    return Case("kills", index, d, ["reassemble", "data", "out", "--buckets", "3", "--no-progress"], "out",
                ["data"], tables=("rows", "report"),
                kill={"signal": sig, "at": rng.random(), "previous": rng.random() < 0.5}, notes=sig)


MAKERS = {"bytes": make_bytes, "footer": make_footer, "values": make_values, "cli": make_cli,
          "importers": make_importers, "kills": make_kills}


# ---------------------------------------------------------------------------------- checking
def snapshot(d: Path, skip: str | None) -> dict:
    """Every path under ``d`` (outside ``d/skip``) with its content's hash (directories: None)."""
    seen = {}
    skip_path = os.path.normpath(os.path.join(d, skip)) if skip and skip.strip() else None
    for top, dirs, files in os.walk(d):
        if skip_path and os.path.normpath(top) == skip_path:
            dirs[:] = []
            continue
        for name in dirs:
            path = os.path.join(top, name)
            if path != skip_path:
                seen[os.path.relpath(path, d)] = None
        for name in files:
            path = os.path.join(top, name)
            with open(path, "rb") as f:
                seen[os.path.relpath(path, d)] = hashlib.blake2b(f.read(), digest_size=16).hexdigest()
    return seen


def complete(out: Path, tables) -> bool:
    """Every output the command commits is in OUT (in either form)."""
    return all((out / f"{n}.parquet").exists() or (out / n).is_dir() or (out / n).is_file() for n in tables)


def committed_any(out: Path, tables) -> bool:
    return any((out / f"{n}.parquet").exists() or (out / n).exists() for n in tables)


def _out_path(case: Case) -> Path | None:
    """OUT as a path, None when there is none or it cannot name a file (blank, too long)."""
    if not case.out or not case.out.strip():
        return None
    out = case.dir / case.out
    try:
        out.exists()
    except OSError:
        return None
    return out


def check(case: Case, res: CliResult, before: dict, out_before: dict) -> str | None:
    """What is wrong with a case's result, or None."""
    if not isinstance(res.rc, int) or res.rc < 0:
        return f"signal death or hang: rc={res.rc!r}"
    if "Traceback" in res.stderr:
        return "traceback"
    if res.rc not in case.expect:
        return f"exit {res.rc}, expected one of {case.expect}"
    if res.rc == 2:
        lines = res.stderr.splitlines()
        if len(lines) != 1 or not lines[0].startswith("chainrows: error: "):
            return "exit 2 without one error line"
    after = snapshot(case.dir, case.out)
    changed = sorted(k for k in set(before) | set(after) if before.get(k, 0) != after.get(k, 0))
    if changed:
        return f"stray write or modified input: {changed[:5]}"
    out = _out_path(case)
    if out is None or out.resolve() == case.dir.resolve():
        return None
    if res.rc == 0:
        if not complete(out, case.tables):
            return "exit 0 without the complete output"
    elif snapshot(out, None) != out_before and committed_any(out, case.tables) and not out_before:
        return "partial output after a failed run"
    if res.rc == 0 and case.oracle is not None:
        try:
            rows, report = read_output(out)
            check_against_oracle(case.notes, case.dir / "data", rows, report, case.oracle)
        except AssertionError as exc:
            return f"differs from the reference: {' '.join(str(exc).split())[:300]}"
    return None


# ----------------------------------------------------------------------------------- running
def run_case(worker: CliWorker, case: Case, good: dict) -> tuple[CliResult, str | None]:
    if case.kill:
        return run_kill(worker, case, good)
    out = _out_path(case)
    out_before = snapshot(out, None) if out is not None and out.is_dir() else {}
    before = snapshot(case.dir, case.out)
    res = worker.run(*case.argv, cwd=case.dir, timeout=300)
    return res, check(case, res, before, out_before)


def output_bytes(out: Path) -> dict:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*.parquet"))
            if not any(part.startswith(".") for part in p.relative_to(out).parts)}


def run_kill(worker: CliWorker, case: Case, good: dict) -> tuple[CliResult, str | None]:
    out = case.dir / "out"
    if case.kill["previous"]:
        shutil.copytree(good["old_dir"], out)
    before_out = output_bytes(out) if out.exists() else {}
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONFAULTHANDLER="1")
    env.pop("CHAINROWS_DEBUG", None)
    argv = [sys.executable, "-m", "chainrows", *case.argv] + (["--overwrite"] if case.kill["previous"] else [])
    proc = subprocess.Popen(argv, cwd=case.dir, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=default_sigint)
    at = case.kill["at"] * good["seconds"]
    # SIGKILL at any moment; the others once the interpreter has started (docs/fuzz.md: before
    # any chainrows code runs, ~50 ms, an interrupt is Python's own)
    time.sleep(at if case.kill["signal"] == "SIGKILL" else max(STARTUP_S, at))
    proc.send_signal(getattr(signal, case.kill["signal"]))
    try:
        stdout, stderr = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:  # a hang: faulthandler prints every thread's stack on SIGABRT
        proc.send_signal(signal.SIGABRT)
        stdout, stderr = proc.communicate()
        return CliResult("timeout", stdout, stderr), f"hang after {case.kill['signal']}"
    res = CliResult(proc.returncode, stdout, stderr)
    allowed = {"SIGKILL": (0, -9), "SIGINT": (0, 130), "SIGTERM": (0, 143)}[case.kill["signal"]]
    if res.rc not in allowed:
        return res, f"exit {res.rc} after {case.kill['signal']}, expected one of {allowed}"
    if "Traceback" in stderr and not _swallowed(stderr):
        return res, "traceback"
    now = output_bytes(out) if out.exists() else {}
    if now not in (before_out, good["new"]) or (res.rc == 0 and now != good["new"]):
        return res, "partial or damaged output after the kill"
    again = worker.run(*case.argv, "--resume", "--overwrite", cwd=case.dir, timeout=300)
    if again.rc != 0 or again.stderr:
        return again, f"rerun with --resume: {again}"
    if output_bytes(out) != good["new"]:
        return again, "the rerun's output differs from an uninterrupted run's"
    return res, None


def _swallowed(stderr: str) -> bool:
    """Python's "Exception ignored in ..." report of a KeyboardInterrupt it swallowed (the signal
    handler ran inside a callback, e.g. an import lock's, where no exception can propagate); the
    run goes on as if not interrupted (docs/fuzz.md)."""
    return stderr.startswith("Exception ignored in") and stderr.rstrip().endswith("KeyboardInterrupt:") \
        and stderr.count("Traceback") == 1


def prepare_kills(worker: CliWorker, root: Path) -> dict:
    """An uninterrupted run's output bytes and duration, and an earlier output to replace."""
    d = root / "kills-reference"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir()
    shutil.copytree(root / "base" / "data", d / "data")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "chainrows", "reassemble", "data", "new", "--buckets", "3", "--no-progress"],
                   cwd=d, env=env, check=True, capture_output=True)
    seconds = time.perf_counter() - t0
    worker.run("reassemble", "data", "old", "--mode", "ordinary", cwd=d)
    return {"new": output_bytes(d / "new"), "old_dir": d / "old", "seconds": seconds}


def save_failure(case: Case, res: CliResult, problem: str, replay: Path, seed: int, base: Path) -> Path:
    """The failing case made again from its seed under ``replay`` (its inputs as they were before
    the run), with ``command.json``: the command, what went wrong, the exit code and stderr."""
    fresh = make_case(case.family, seed, case.index, replay, base)
    (fresh.dir / "command.json").write_text(json.dumps(
        {"argv": case.argv, "out": case.out, "family": case.family, "notes": case.notes, "problem": problem,
         "rc": res.rc, "stderr": res.stderr[-2000:], "kill": case.kill, "seed": seed}, indent=1))
    return fresh.dir


def schedule(cases: int, families=FAMILIES) -> list[tuple[str, int]]:
    """(family, index) of ``cases`` cases, the families interleaved by their weights."""
    total = sum(WEIGHTS[f] for f in families)
    counts = {f: cases * WEIGHTS[f] // total for f in families}
    counts[families[0]] += cases - sum(counts.values())
    order = [(f, i) for f in families for i in range(counts[f])]
    random.Random(0).shuffle(order)
    return order


def campaign(cases: int, seed: int, work: Path, replay: Path, families=FAMILIES, progress=None) -> Tally:
    """Run ``cases`` cases; returns the counts by family and exit code, and the failures (each
    saved under ``replay``)."""
    work.mkdir(parents=True, exist_ok=True)
    base = make_base(work)
    tally = Tally()
    worker = CliWorker()
    try:
        good = prepare_kills(worker, work) if "kills" in families else {}
        for k, (family, index) in enumerate(schedule(cases, families)):
            case = make_case(family, seed, index, work / "cases", base)
            res, problem = run_case(worker, case, good)
            tally.cases[family] += 1
            tally.exits[(family, res.rc)] += 1
            if problem:
                saved = save_failure(case, res, problem, replay, seed, base)
                tally.failures.append(f"{family} {index} ({case.notes}): {problem}; "
                                      f"replay: python -m tests.fuzz --replay {saved}")
            shutil.rmtree(case.dir, ignore_errors=True)
            if progress and (k + 1) % progress == 0:
                print(f"{k + 1} cases, {len(tally.failures)} failures", flush=True)
    finally:
        worker.close()
    return tally


def replay(saved: Path) -> CliResult:
    """Run a saved failing case's command again (``python -m chainrows``, in its directory; a
    kill case without its kill)."""
    spec = json.loads((saved / "command.json").read_text())
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-m", "chainrows", *spec["argv"]], cwd=saved, env=env,
                          capture_output=True, text=True)
    return CliResult(proc.returncode, proc.stdout, proc.stderr)


def summary(tally: Tally) -> str:
    lines = [f"{'family':<10} {'cases':>7}  exits"]
    for family in FAMILIES:
        if tally.cases[family]:
            exits = ", ".join(f"{rc}: {n}" for (f, rc), n in sorted(tally.exits.items(), key=str) if f == family)
            lines.append(f"{family:<10} {tally.cases[family]:>7}  {exits}")
    lines.append(f"{'total':<10} {sum(tally.cases.values()):>7}  failures: {len(tally.failures)}")
    return "\n".join(lines + tally.failures[:20])
