"""The Ray path (chainrows.runners.ray, README "Many machines") against the single-process run.

Ray advertises the machine's interface address, and these machines may only talk to loopback, so
every Ray session runs in a network namespace of its own with only ``lo`` up (``unshare --net``,
root). One namespaced subprocess (this file run as a script) starts a cluster of two nodes:
a 1-CPU head (``ray start --head --block``) and a 1-CPU second raylet joined to it (``ray start
--address``, a temp dir and agent ports of its own). It runs every scenario against that cluster
(the API with ``address="auto"``, the CLI with ``--ray auto`` and once with a local Ray of its
own), then stops both raylets by their pids (and the PID namespace ends whatever a crashed runner
leaves). The tasks are spread over the nodes (``scheduling_strategy="SPREAD"``); the decide
tasks' records say which node ran each. The expected
outputs come from the single-process CLI in the pytest process; the tests compare.

Datasets are small ``chainrows synth`` datasets made messy: token rows in random order, every
table split into many files (one empty), rollouts missing from the rollouts, ledger or tokens
table, groups of one, a duplicate rollouts row naming another group (only the first row counts).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from chainrows.outdir.provenance import read_provenance

pytestmark = pytest.mark.slow  # tests/README.md: Ray sessions

HERE = Path(__file__).resolve()
# a network namespace with only loopback, and a PID namespace whose first process is the runner:
# however the runner ends (a crash in Ray's C++ core included), the kernel ends every process of
# the session's cluster with it
NAMESPACE = ["unshare", "--net", "--pid", "--fork", "--mount-proc"]
SESSION_TIMEOUT_S = 420


# ----------------------------------------------------------------------------- datasets

def _split(table: pa.Table, root: Path, name: str, pieces: int, rng) -> None:
    """``table`` as ``root/name/`` with ``pieces`` files in read order (one of them empty)."""
    d = root / name
    d.mkdir(parents=True)
    cuts = np.sort(rng.choice(np.arange(1, table.num_rows), size=pieces - 2, replace=False))
    bounds = [0, *cuts.tolist(), table.num_rows]
    chunks = [table.slice(a, b - a) for a, b in zip(bounds, bounds[1:])]
    chunks.insert(int(rng.integers(0, len(chunks) + 1)), table.slice(0, 0))
    for i, chunk in enumerate(chunks):
        pq.write_table(chunk, d / f"part-{i:03d}.parquet")


def messy_dataset(root: Path, n: int, seed: int, **synth) -> Path:
    """A synth dataset reshaped as described in the module docstring."""
    from chainrows.synth import synth_tables

    ledger, tokens, rollouts = synth_tables(n, seed, **synth)
    rng = np.random.default_rng(seed)
    rids = rollouts["rollout_id"].to_pylist()
    no_record, no_calls, no_tokens = set(rids[0:3]), set(rids[3:5]), set(rids[5:7])

    def without(table, ids):
        keep = [r not in ids for r in table["rollout_id"].to_pylist()]
        return table.filter(pa.array(keep))

    ledger, tokens = without(ledger, no_calls), without(tokens, no_tokens)
    groups = rollouts["group_id"].to_pylist()
    for i in range(8, 14):  # groups of one: a null group, or a group nobody else has
        groups[i] = None if i % 2 else f"alone-{i}"
    rollouts = rollouts.set_column(rollouts.schema.get_field_index("group_id"), "group_id",
                                   pa.array(groups, pa.string()))
    dup = rollouts.slice(20, 1)  # a later rollouts row for rollout 20, naming rollout 40's group
    dup = dup.set_column(dup.schema.get_field_index("group_id"), "group_id", pa.array([groups[40]], pa.string()))
    rollouts = pa.concat_tables([without(rollouts, no_record), dup])
    tokens = tokens.take(pa.array(rng.permutation(tokens.num_rows)))
    for name, table, pieces in (("ledger", ledger, 6), ("tokens", tokens, 9), ("rollouts", rollouts, 4)):
        _split(table, root, name, pieces, rng)
    return root


def single_process(dataset, out, flags) -> tuple[int, str]:
    """``chainrows reassemble DATASET OUT FLAGS`` without --ray (the reference result), in this
    process: (exit code, stderr)."""
    import contextlib
    import io

    from chainrows.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(["reassemble", str(dataset), str(out), "--no-progress", *flags])
    return rc, err.getvalue()


def read_output(out: Path, name: str) -> pa.Table:
    """``OUT/<name>.parquet``, or ``OUT/<name>/`` read part by part in file-name order."""
    single = out / f"{name}.parquet"
    if single.is_file():
        return pq.read_table(single)
    files = sorted(p for p in (out / name).iterdir() if not p.name.startswith((".", "_")))
    return pa.concat_tables([pq.read_table(f) for f in files])


def same_table(a: pa.Table, b: pa.Table) -> bool:
    """Schema and every value equal, in order; NaN equals NaN (pyarrow's ``equals`` says a
    NaN reward differs from itself)."""
    if not a.schema.equals(b.schema) or a.num_rows != b.num_rows:
        return False
    for name in a.column_names:
        x, y = a[name].combine_chunks(), b[name].combine_chunks()
        if pa.types.is_floating(x.type):
            if not x.is_null().equals(y.is_null()):
                return False
            if not np.array_equal(x.fill_null(0).to_numpy(zero_copy_only=False),
                                  y.fill_null(0).to_numpy(zero_copy_only=False), equal_nan=True):
                return False
        elif not x.equals(y):
            return False
    return True


def parts(out: Path, name: str) -> int:
    return len([p for p in (out / name).iterdir() if not p.name.startswith((".", "_"))])


# ----------------------------------------------------------------------------- the session

def _netns_ok() -> str | None:
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "unshare or ip not installed"
    probe = subprocess.run([*NAMESPACE, "sh", "-c", "ip link set lo up"], capture_output=True, text=True)
    return None if probe.returncode == 0 else f"unshare --net not permitted here: {probe.stderr.strip()}"


@pytest.fixture(scope="module")
def session():
    """Build the datasets and reference outputs, run every scenario in one namespaced Ray
    session, return (work dir, cases, results)."""
    pytest.importorskip("ray")
    why = _netns_ok()
    if why:
        pytest.skip(why)
    work = Path(tempfile.mkdtemp(prefix="crray-"))  # short: Ray's socket paths live under it
    try:
        yield _run_session(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _run_session(work: Path):
    plan = work / "plan.json"
    t0 = time.perf_counter()
    # the runner starts its head while the datasets and the references are built here
    proc = subprocess.Popen([*NAMESPACE, "sh", "-c", 'ip link set lo up && exec "$0" "$1" "$2"',
                             sys.executable, str(HERE), str(plan)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_env(work))
    try:
        cases = _prepare(work)
    except BaseException:
        _write_plan(plan, {"abort": True})  # the runner stops its head and exits
        proc.communicate(timeout=SESSION_TIMEOUT_S)
        raise
    _write_plan(plan, {"work": str(work), "cases": cases})
    try:
        out, err = proc.communicate(timeout=SESSION_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    assert proc.returncode == 0, f"Ray session failed:\n{out[-4000:]}\n{err[-8000:]}"
    results = json.loads((work / "results.json").read_text())
    results["_seconds"] = time.perf_counter() - t0
    print("Ray session:", out, f"total {results['_seconds']:.1f} s")
    return work, cases, results


def _write_plan(plan: Path, value: dict) -> None:
    tmp = plan.with_suffix(".tmp")
    tmp.write_text(json.dumps(value))
    os.replace(tmp, plan)  # the runner never sees half a plan


def _prepare(work: Path) -> dict:
    """The datasets, the cases and their single-process reference outputs."""
    messy = messy_dataset(work / "messy", 240, seed=3, group_size=4)
    forest = messy_dataset(work / "forest", 160, seed=5, worker_rate=0.3, fork_rate=0.2, group_size=3)
    plain = messy_dataset(work / "plain", 120, seed=7, logprobs=False)
    bad = messy_dataset(work / "bad", 60, seed=9)
    # a null call_id at row 1 of a later ledger file (not the first: its position must be kept)
    f = next(p for p in sorted((bad / "ledger").iterdir())[1:] if pq.read_metadata(p).num_rows >= 2)
    t = pq.read_table(f)
    ids = t["call_id"].to_pylist()
    ids[1] = None
    pq.write_table(t.set_column(t.schema.get_field_index("call_id"), "call_id", pa.array(ids, pa.string())), f)
    no_tokens = messy_dataset(work / "notokens", 60, seed=1)
    shutil.rmtree(no_tokens / "tokens")
    wrong_type = messy_dataset(work / "wrongtype", 60, seed=2)
    for p in (wrong_type / "ledger").iterdir():
        t = pq.read_table(p)
        pq.write_table(t.set_column(t.schema.get_field_index("prev_len"), "prev_len",
                                    t["prev_len"].cast(pa.string())), p)

    every_option = ["--mode", "ordinary", "--placeholders", "--baseline", "loo", "--no-std",
                    "--baseline-population", "ok", "--row-weight", "row"]
    cases = {  # in run order; few Ray executions, each doing double duty
        # a CLI run on the head whose driver is SIGKILLed mid-run; the kill case then runs
        # into the same OUT (and must clean up what the dead driver staged)
        "driver_killed": dict(kind="driver_kill", data=messy, flags=[], ray=["auto"], out="kill"),
        "kill": dict(kind="kill", data=messy, flags=[], options={}, buckets=6),
        "forest_uri": dict(kind="api", data=forest, uri=True, flags=["--plan", "forest", "--placeholders"],
                           options=dict(plan="forest", placeholders=True), buckets=4),
        "bad_api": dict(kind="api", data=bad, flags=[], options={}, buckets=3, prior=True),
        "cli_local": dict(kind="cli", data=plain, flags=every_option, ray=[]),
        "bad_cli": dict(kind="cli", data=bad, flags=[], ray=["auto"], prior=True, extra=["--overwrite"]),
        "bad_cli_local": dict(kind="cli", data=bad, flags=[], ray=[]),  # found in a task of a Ray of its own
        "no_tokens_cli": dict(kind="cli", data=no_tokens, flags=[], ray=["auto"]),
        "wrong_type_cli": dict(kind="cli", data=wrong_type, flags=[], ray=["auto"]),
    }
    for name, case in cases.items():
        case["out"] = str(work / "out" / case.get("out", name))
        case["expected"] = str(work / "expected" / name)
        case["data"] = str(case["data"])
        case["ref_rc"], case["ref_stderr"] = single_process(case["data"], case["expected"], case["flags"])
        if case.get("prior"):  # OUT already holds a result, which a failed run must leave alone
            assert single_process(messy, case["out"], [])[0] == 0
    return cases


def _env(work: Path) -> dict:
    import chainrows

    # the runner (started as a script, so not from this directory) imports the chainrows these
    # tests import, not whichever one the environment has installed
    src = str(Path(chainrows.__file__).resolve().parents[1])
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", RAY_TMPDIR=str(work / "rt"), PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")])))
    env.pop("RAY_ADDRESS", None)
    return env


# ----------------------------------------------------------------------------- the tests

def _same_tables(case) -> None:
    """Same tables as the single-process run, and every file with the same provenance."""
    from chainrows.outdir.provenance import provenance_of

    out, expected = Path(case["out"]), Path(case["expected"])
    want_prov = read_provenance(expected)
    assert want_prov is not None and want_prov["input"] is not None
    for name in ("rows", "report"):
        got, want = read_output(out, name), read_output(expected, name)
        assert got.schema.equals(want.schema), name
        for f in (out / name).iterdir():
            assert provenance_of(pq.read_metadata(f).metadata) == want_prov, f
        assert got.num_rows == want.num_rows, name
        assert same_table(got, want), f"{name} differs from the single-process run"
    assert not [p for p in out.iterdir() if p.name.startswith(".chainrows-tmp")], "staging left behind"


@pytest.mark.parametrize("name", ["kill", "forest_uri"])
def test_api_run_equals_single_process(session, name):
    """cc linear (the kill case, which also loses a worker) and cc forest with placeholders,
    the latter with file:// URIs for DATASET and OUT (the pyarrow-filesystem paths)."""
    work, cases, results = session
    case, got = cases[name], results[name]
    assert got["error"] is None, got["error"]
    _same_tables(case)
    assert parts(Path(case["out"]), "rows") > 1, "the comparison should span several parts"
    report = read_output(Path(case["expected"]), "report")
    assert got["summary"]["rollouts"] == report.num_rows
    assert got["summary"]["ok"] == report["status"].to_pylist().count("ok")
    import chainrows

    whole = chainrows.reassemble(case["data"], **case["options"])
    assert (got["summary"]["generated"], got["summary"]["untrained"]) == (whole.generated_tokens,
                                                                          whole.untrained_tokens)
    assert whole.untrained_tokens > 0


@pytest.mark.parametrize("name", ["kill", "forest_uri"])
def test_decide_tasks_ran_on_both_nodes(session, name):
    """Scale-out: the decide tasks of an API run ran on both raylets of the session's cluster,
    at least one task each (their records name the node), and the output is the single-process
    tables."""
    work, cases, results = session
    got = results[name]
    assert got["error"] is None, got["error"]
    assert len(results["_nodes"]) == 2, results["_nodes"]
    ran = {r["node"] for r in got["records"]}
    assert ran == set(results["_nodes"]), (ran, results["_nodes"])
    _same_tables(cases[name])


def test_messy_data_exercises_what_it_should(session):
    """The dataset really has the shapes the identity is claimed for."""
    work, cases, _ = session
    report = read_output(Path(cases["kill"]["expected"]), "report")
    reasons = report["reason"].to_pylist()
    for reason in ("no_rollout_record", "no_calls", "missing_tokens", "duplicate_call"):
        assert reason in reasons, reason
    assert report["group_id"].null_count >= 3 + 3  # no rollouts row, and null groups
    assert len(list((Path(cases["kill"]["data"]) / "tokens").iterdir())) == 9


def test_worker_killed_mid_run_gives_identical_output(session):
    work, cases, results = session
    got = results["kill"]
    assert got["error"] is None, got["error"]
    assert got["killed_pid"], "the watcher never killed a worker"
    assert got["attempts"] >= 2, "the killed task was not retried"
    _same_tables(cases["kill"])


def test_bad_data_in_a_worker_is_the_single_process_error(session):
    work, cases, results = session
    case, got = cases["bad_api"], results["bad_api"]
    assert case["ref_rc"] == 2
    want = case["ref_stderr"].strip().removeprefix("chainrows: error: ")
    assert got["error"] == f"InputError: {want}"
    bad_file = next(p for p in sorted((Path(case["data"]) / "ledger").iterdir())[1:]
                    if pq.read_table(p)["call_id"].null_count)
    assert "call_id" in want and bad_file.name in want and "row 1 " in want
    prior = Path(case["out"])  # the earlier result is untouched, nothing staged is left
    assert same_table(read_output(prior, "report"), read_output(Path(cases["kill"]["expected"]), "report"))
    assert not [p for p in prior.iterdir() if p.name.startswith(".chainrows-tmp")]


# what Ray's C++ core prints (not through Python's logging) in a network namespace with no route out
NAMESPACE_NOTE = "Failed to determine local IP via external connectivity"


@pytest.mark.parametrize("name", ["bad_cli", "bad_cli_local", "no_tokens_cli", "wrong_type_cli"])
def test_cli_bad_input_exits_2_with_the_single_process_line(session, name):
    """The single-process line and nothing else: not Ray's logging of the failed task with its
    traceback, nor Ray's warnings (bad_cli and bad_cli_local find the
    null inside a Ray task)."""
    work, cases, results = session
    case, got = cases[name], results[name]
    assert case["ref_rc"] == 2 and got["rc"] == 2
    want = case["ref_stderr"].strip()
    assert len(want.splitlines()) == 1
    lines = got["stderr"].strip().splitlines()
    assert lines[-1] == want
    assert all(NAMESPACE_NOTE in ln for ln in lines[:-1]), got["stderr"]
    out = Path(case["out"])
    if case.get("prior"):
        assert same_table(read_output(out, "rows"), read_output(Path(cases["kill"]["expected"]), "rows"))
    else:
        assert not out.exists() or not [p for p in out.iterdir() if p.name in ("rows", "report")]


def test_cli_local_ray_prints_the_summary_and_equals_single_process(session):
    """--ray without ADDRESS (a local Ray of its own), ordinary mode with every §5 option and
    placeholders, input without logprobs."""
    work, cases, results = session
    case, got = cases["cli_local"], results["cli_local"]
    assert got["rc"] == 0, got["stderr"][-2000:]
    _same_tables(case)
    assert "ray, " in got["stdout"] and "a local Ray" in got["stdout"]
    fingerprint = read_provenance(Path(case["out"]))["input"]["fingerprint"]
    assert "made with" in got["stdout"] and fingerprint[:12] in got["stdout"]
    report = read_output(Path(case["expected"]), "report")
    assert f"{report.num_rows:,}" in got["stdout"].split("rollouts", 1)[1].splitlines()[0]
    assert "logprobs" not in read_output(Path(case["out"]), "rows").column_names


def test_killed_driver_leaves_nothing_visible_and_the_next_run_cleans_up(session):
    work, cases, results = session
    got = results["driver_killed"]
    assert got["killed"], "the driver finished before it could be killed"
    assert got["staging_after_kill"], "the kill came before any staging: it tested nothing"
    assert got["visible_after_kill"] == [], got["visible_after_kill"]
    _same_tables(cases["kill"])  # the next run into that OUT: complete, and no staging left


# ----------------------------------------------------------------------------- the runner
# Runs inside the namespace: `python tests/runners/ray/test_ray.py PLAN.json`.

def _killable_engine(marker_dir: str):
    """The in-memory engine, except that the first task to call it records its pid and waits
    to be killed (SIGKILL from the runner's watcher); every later call, the retry included,
    counts itself and runs normally."""

    def engine(ledger, tokens, rollouts, options):
        from chainrows.api import run_tables

        with open(os.path.join(marker_dir, f"call-{os.getpid()}-{time.monotonic_ns()}"), "w"):
            pass
        try:
            fd = os.open(os.path.join(marker_dir, "first"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return run_tables(ledger, tokens, rollouts, options)
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        time.sleep(300)
        raise RuntimeError("the worker was not killed")

    return engine


def _run_api(case, engine=None) -> dict:
    from chainrows.api import run_tables
    from chainrows.options import Options
    from chainrows.runners.ray.job import run

    data, out = case["data"], case["out"]
    if case.get("uri"):
        data, out = f"file://{data}", f"file://{out}"
    records = []
    try:
        s = run(data, out, Options(**case["options"]), address="auto", buckets=case["buckets"],
                progress=False, engine=engine or run_tables, records=records)
    except Exception as exc:  # the test decides whether an error was expected
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {"error": None, "records": records,
            "summary": {"rollouts": s.rollouts, "ok": s.ok, "generated": s.generated_tokens,
                        "untrained": s.untrained_tokens}}


def _start_cli(case) -> subprocess.Popen:
    """``chainrows reassemble ... --ray [ADDRESS]`` in a child process; without ADDRESS it must
    start a Ray of its own, so it gets no RAY_ADDRESS."""
    env = dict(os.environ)
    if not case["ray"]:
        env.pop("RAY_ADDRESS", None)
    return subprocess.Popen([sys.executable, "-m", "chainrows", "reassemble", case["data"], case["out"],
                             *case["flags"], "--ray", *case["ray"], "--no-progress", *case.get("extra", [])],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _finish_cli(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=300)
    return {"rc": proc.returncode, "stdout": out, "stderr": err}


def _kill_case(case, work: Path) -> dict:
    marker = work / "kill-markers"
    marker.mkdir()
    killed = {}

    def watch():
        first = marker / "first"
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not killed.get("pid"):
            if first.exists() and first.read_text():
                pid = int(first.read_text())
                os.kill(pid, signal.SIGKILL)
                killed["pid"] = pid
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    got = _run_api(case, _killable_engine(str(marker)))
    watcher.join(timeout=1)
    got["killed_pid"] = killed.get("pid")
    got["attempts"] = len(list(marker.glob("call-*")))
    return got


def _driver_kill_case(case) -> dict:
    out = Path(case["out"])
    cmd = [sys.executable, "-m", "chainrows", "reassemble", case["data"], case["out"], *case["flags"],
           "--ray", *case["ray"], "--no-progress"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    staged = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        staged = list(out.glob(".chainrows-tmp-*/.ray/*")) if out.exists() else []
        if staged:
            time.sleep(1.0)  # into the run: the tasks are reading
            break
        time.sleep(0.05)
    killed = proc.poll() is None
    proc.kill()  # SIGKILL: no cleanup of its own
    proc.wait()
    visible = sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) if out.exists() else []
    return {"killed": killed, "staging_after_kill": [str(p) for p in staged], "visible_after_kill": visible}


def _start_cluster(work: Path) -> tuple[list[subprocess.Popen], object]:
    """Two 1-CPU raylets for this namespace, the head and a node joined to it, with a token of
    their own (Ray >= 2.59 token auth, which the joining node needs too); returns their
    ``ray start --block`` processes (head first) and ``ray``, connected, once both nodes are up."""
    import secrets

    os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32), RAY_ADDRESS="127.0.0.1:6379")
    # the interpreter's own ``ray`` first: a venv's python runs without the venv on PATH
    beside = Path(sys.executable).with_name("ray")
    ray_cli = str(beside) if beside.exists() else shutil.which("ray") or "ray"
    common = ["--num-cpus", "1", "--disable-usage-stats", "--block"]
    procs = []

    def start(name: str, args: list[str]) -> None:
        log = open(work / f"{name}.log", "w")
        procs.append(subprocess.Popen([ray_cli, "start", *args, *common, "--temp-dir", str(work / name)],
                                      stdout=log, stderr=log))

    def failed() -> str | None:
        if all(p.poll() is None for p in procs):
            return None
        return "ray start failed: " + "".join((work / f"{n}.log").read_text()[-2000:] for n in ("rt", "rt2"))

    start("rt", ["--head", "--port", "6379", "--include-dashboard=false"])
    # the same IP as the head: every port of its own is picked free (the agent's default is the head's)
    start("rt2", ["--address", "127.0.0.1:6379", "--dashboard-agent-listen-port", "0",
                  "--min-worker-port", "0", "--max-worker-port", "0"])
    import ray

    for _ in range(240):
        if failed():
            break
        try:
            if not ray.is_initialized():
                ray.init(address="auto", include_dashboard=False, log_to_driver=False)
            if len([n for n in ray.nodes() if n["Alive"]]) == 2:
                return procs, ray
        except ConnectionError:
            pass
        time.sleep(0.5)
    why = failed() or "the two Ray nodes did not come up"
    ray.shutdown()
    _stop(procs)
    raise RuntimeError(why)


def _stop(procs: list[subprocess.Popen]) -> None:
    """SIGTERM by pid, joined node first: only this session's raylets and their children."""
    for proc in reversed(procs):
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


def _main(plan_path: str) -> int:
    work = Path(plan_path).parent
    t0 = time.perf_counter()
    procs, ray = _start_cluster(work)
    print(f"two nodes: {time.perf_counter() - t0:.1f} s", flush=True)
    results = {"_nodes": [n["NodeID"] for n in ray.nodes() if n["Alive"]]}
    try:
        deadline = time.monotonic() + SESSION_TIMEOUT_S
        while not Path(plan_path).exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        plan = json.loads(Path(plan_path).read_text())
        if plan.get("abort"):
            return 1
        cases = plan["cases"]
        # the local-Ray CLI case runs beside the others: most of a small run is Ray's latency
        background = {name: (_start_cli(case), time.perf_counter()) for name, case in cases.items()
                      if case["kind"] == "cli" and not case["ray"]}
        for name, case in cases.items():
            t0 = time.perf_counter()
            if name in background:
                continue
            if case["kind"] == "api":
                results[name] = _run_api(case)
            elif case["kind"] == "kill":
                results[name] = _kill_case(case, work)
            elif case["kind"] == "driver_kill":
                results[name] = _driver_kill_case(case)
            else:
                results[name] = _finish_cli(_start_cli(case))
            results[name]["seconds"] = time.perf_counter() - t0
            print(f"{name}: {results[name]['seconds']:.1f} s", flush=True)
        for name, (proc, t0) in background.items():
            results[name] = _finish_cli(proc)
            results[name]["seconds"] = time.perf_counter() - t0
            print(f"{name} (beside the others): {results[name]['seconds']:.1f} s", flush=True)
    finally:
        ray.shutdown()
        _stop(procs)
    (work / "results.json").write_text(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1]))
