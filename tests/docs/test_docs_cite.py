"""The README and docs/*.md cannot drift from the code.

Every page is read as a user reads it, and each of these fails on a stale citation:
- code names in backticks: ``chainrows.x.y`` imports or is an attribute; ``module.name`` and
  ``Class.name`` forms whose head is a chainrows module, package or class (``footers.remembered``,
  ``runners.bulk.job.run``, ``Batch.validate``) or numpy/pyarrow/numba/xxhash (``np.copyto``,
  ``pq.read_table``) resolve; ``path.py name`` and ``path.py:name`` forms too;
- paths in backticks (``chainrows/engine/cut.py``, ``tests/cases.py``, ``runners/bulk/job.py``
  read under ``chainrows/``, a bare ``test_bulk.py``; ``file.py::test_name``) exist;
- every relative link resolves, and its ``#anchor`` names a heading of the target; a section
  named in quotes after a page (``README "Output"``, ``limits.md "Huge pages"``) begins a
  heading of that page;
- every ``--flag`` a page shows on a command line (in a code block, or in backticks after
  ``chainrows COMMAND``, ``python -m chainrows COMMAND`` or ``python -m asv_benchmarks.NAME``)
  is in that command's real ``--help`` usage; a lone `--flag` in backticks is a flag of a
  command its paragraph names, or of some ``chainrows`` command when it names none;
- every ```python block runs in a fresh interpreter on a plain install (numpy, pyarrow, numba,
  xxhash: pandas, torch, jax, ray and matplotlib are refused), in a temporary directory holding
  the data the pages use (below), unless the line before it is ``<!-- not run: REASON -->``.

Left out: ``docs/notebooks/`` (pages rendered from the notebooks by ``notebooks/render.py``;
``tests/docs/test_notebooks.py`` executes the notebooks themselves, and their text is generated).
"""

from __future__ import annotations

import ast
import functools
import inspect
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# The architecture page's reader: its resolver of dotted names, and its split of a page into
# bullets, table rows and paragraphs (a flag is read against the commands of its own).
from tests.support.docs import paragraphs, resolve_dotted

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
# Cited before they exist: pages written on another branch of the same change. Remove an entry
# once its file is in the tree.
PENDING: set = set()

# The data a snippet finds in its working directory (built once, copied per snippet):
#   DATA/                         a synthetic dataset (`chainrows synth`, 40 rollouts, a few corrupt)
#   OUT/rows/, OUT/report.parquet `chainrows reassemble DATA OUT`
#   ledger.jsonl, tokens.jsonl, results.jsonl   the complete example of docs/jsonl.md
#   dump/                         the NeMo Gym example dump (examples/gym/dump)
#   calls.parquet, calls-results.jsonl          a consistent dataset written back as a call log
#   data/                         `chainrows import-calls calls.parquet calls-results.jsonl data`
SNIPPET_DIR_CONTENTS = ("DATA", "OUT", "ledger.jsonl", "tokens.jsonl", "results.jsonl", "dump",
                        "calls.parquet", "calls-results.jsonl", "data")
# What a plain install lacks: a snippet that imports one of these needs `<!-- not run: ... -->`.
NOT_INSTALLED = ("pandas", "torch", "jax", "ray", "matplotlib", "tensorflow")
PRELUDE = f"""\
import sys
class _NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {NOT_INSTALLED!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}} (not part of a plain install)")
sys.meta_path.insert(0, _NotInstalled())
"""
THIRD_PARTY = {"np": "numpy", "numpy": "numpy", "pa": "pyarrow", "pyarrow": "pyarrow",
               "pq": "pyarrow.parquet", "pc": "pyarrow.compute", "numba": "numba",
               "xxhash": "xxhash"}
FILE_EXTENSIONS = {"py", "md", "ipynb", "parquet", "jsonl", "gz", "json", "toml", "arrow",
                   "tmp", "lock", "png", "txt", "nbi", "nbc", "cfg", "yaml", "yml", "sh"}
TABLES = {"ledger", "tokens", "rollouts", "rows", "report", "import_report"}  # `table.column`
TOP_DIRS = ("chainrows/", "tests/", "docs/", "asv_benchmarks/", "notebooks/", "examples/", ".ci/")


# ---------------------------------------------------------------- reading the pages

def rel(page: Path) -> str:
    return str(page.relative_to(ROOT)) if ROOT in page.parents else page.name


def split_fences(text: str) -> tuple[str, list[tuple[str, str, str]]]:
    """The page's prose (fenced blocks blanked out, line numbers kept) and its fenced blocks as
    (language, body, the last non-empty line before the fence)."""
    prose, blocks = [], []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^(\s*)```+\s*([\w+-]*)", lines[i])
        if not m:
            prose.append(lines[i])
            i += 1
            continue
        before = next((ln.strip() for ln in reversed(lines[:i]) if ln.strip()), "")
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith("```"):
            j += 1
        blocks.append((m.group(2).lower(), "\n".join(lines[i + 1:j]), before))
        prose.extend([""] * (j + 1 - i))
        i = j + 1
    return "\n".join(prose), blocks


def spans(text: str) -> list[str]:
    """Inline code spans, a span broken over lines joined with a space."""
    return [re.sub(r"\s*\n\s*", " ", s).strip() for s in re.findall(r"`([^`]+)`", text)]


# ---------------------------------------------------------------- code names and paths

@functools.cache
def chainrows_index() -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """Short module and package names -> full module names; top-level class names -> modules."""
    modules: dict[str, list[str]] = {}
    classes: dict[str, list[str]] = {}
    for path in sorted((ROOT / "chainrows").rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        full = ".".join(parts)
        modules.setdefault(parts[-1], []).append(full)
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.ClassDef):
                classes.setdefault(node.name, []).append(full)
    return modules, classes


def resolves(name: str) -> bool:
    """``resolve_dotted``, and an instance attribute a class declares (a dataclass field, an
    annotation, a slot or ``self.name =`` in its source) counts as its attribute."""
    try:
        resolve_dotted(name)
        return True
    except (ImportError, AttributeError):
        pass
    owner, _, attr = name.rpartition(".")
    try:
        cls = resolve_dotted(owner)
    except (ImportError, AttributeError):
        return False
    if not isinstance(cls, type):
        return False
    declared = set()
    for klass in cls.__mro__:
        declared |= set(getattr(klass, "__annotations__", {})) | set(getattr(klass, "__slots__", ()))
        try:
            declared |= set(re.findall(r"self\.(\w+)\s*(?::[^=\n]*)?=", inspect.getsource(klass)))
        except (OSError, TypeError):
            pass
    return attr in declared


def check_code_name(token: str) -> str | None:
    """A problem with a ``head.attr...`` token, or None (resolved, or not a code name)."""
    name = re.split(r"[(\[ ]", token, maxsplit=1)[0]
    if not re.fullmatch(r"[A-Za-z_]\w*(\.\w+)+", name) or name.split(".")[-1] in FILE_EXTENSIONS:
        return None
    head, rest = name.split(".", 1)
    modules, classes = chainrows_index()
    if head == "chainrows":
        candidates = [name]
    elif head in TABLES:
        return None  # a column: `report.loss_tokens`, `rows.logprobs`
    elif head in THIRD_PARTY:
        candidates = [f"{THIRD_PARTY[head]}.{rest}"]
    elif head in modules or head in classes:
        candidates = [f"chainrows.{name}"] + [f"{m}.{rest}" for m in modules.get(head, [])] + \
                     [f"{m}.{name}" for m in classes.get(head, [])]
    else:
        return None  # a variable (`b.input_ids`), a file name, a field path: not a code name
    if any(resolves(c) for c in candidates):
        return None
    return f"`{token}`: resolves as none of {candidates}"


def pending(path: str, page: Path) -> bool:
    """A path cited before it exists (PENDING), read from the root or from the page."""
    path = path.rstrip("/")
    return path in PENDING or (page.parent / path).resolve() in {(ROOT / p).resolve() for p in PENDING}


def find_path(path: str, page: Path) -> Path | None:
    for base in (ROOT, page.parent, ROOT / "chainrows"):
        if (base / path).exists():
            return base / path
    if re.fullmatch(r"[\w-]+\.(py|ipynb|md)", path):  # a bare file name: somewhere in the repo
        for top in ("chainrows", "tests", "asv_benchmarks", "notebooks", "docs", "examples"):
            if next((ROOT / top).rglob(path), None):
                return next((ROOT / top).rglob(path))
        if (ROOT / path).exists():
            return ROOT / path
    return None


def check_path(token: str, page: Path) -> str | None:
    """A problem with a path token (``a/b.py``, ``a/b.py::test``, ``a/b.py:name``,
    ``a/b.py name``, ``bulk/windows.scan``), or None."""
    m = re.fullmatch(r"([\w./-]+?\.(?:py|md|ipynb))(?:::?(\w+)| (\w+))?", token)
    if m:
        path, attr = m.group(1), m.group(2) or m.group(3)
        if pending(path, page):
            return None
        found = find_path(path, page)
        if found is None:
            return f"`{token}`: no such file"
        if attr and found.suffix == ".py" and not re.search(rf"^\s*(?:def|class) {attr}\b|^{attr}\s*[:=]",
                                                            found.read_text(encoding="utf-8"), re.M):
            return f"`{token}`: {attr} is not defined in {found.relative_to(ROOT)}"
        return None
    m = re.fullmatch(r"([\w-]+(?:/[\w-]+)+)\.(\w+)", token)  # bulk/windows.scan
    if m and m.group(2) not in FILE_EXTENSIONS:
        module = m.group(1)
        if not module.startswith("chainrows/"):
            module = "chainrows/" + module
        if (ROOT / f"{module}.py").exists():
            dotted = module.replace("/", ".") + "." + m.group(2)
            return None if resolves(dotted) else f"`{token}`: {dotted} does not resolve"
        return f"`{token}`: no module {module}.py"
    if token.startswith(TOP_DIRS) and re.fullmatch(r"[\w./-]+", token):
        if pending(token, page) or find_path(token, page):
            return None
        return f"`{token}`: no such path"
    return None


def cited_problems(page: Path) -> list[str]:
    prose, _ = split_fences(page.read_text(encoding="utf-8"))
    problems = []
    for span in spans(prose):
        if "://" in span:
            continue
        tokens = [span] if re.fullmatch(r"[\w./-]+\.py \w+", span) else span.split()
        for token in tokens:
            token = token.rstrip(",;:)")
            problem = check_path(token, page) or check_code_name(token)
            if problem:
                problems.append(f"{rel(page)}: {problem}")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_every_cited_name_and_path_exists(page):
    problems = cited_problems(page)
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------------- links

def slug(heading: str) -> str:
    text = re.sub(r"[`*_]", lambda m: "_" if m.group() == "_" else "", heading.strip().lower())
    return re.sub(r" ", "-", re.sub(r"[^\w\- ]", "", text))


def anchors(page: Path) -> set[str]:
    prose, _ = split_fences(page.read_text(encoding="utf-8"))
    return {slug(h) for h in re.findall(r"^#+ (.+)$", prose, re.M)}


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_every_link_resolves(page):
    """Users get the repository: every link is a path inside it (or a URL), and an anchor names
    a heading of its target."""
    prose, _ = split_fences(page.read_text(encoding="utf-8"))
    problems = []
    for link in re.findall(r"\]\(([^)\s]+)\)", prose):
        if "://" in link or link.startswith("mailto:"):
            continue
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        if path and (path.startswith("..") and page.parent == ROOT or ROOT not in target.parents and target != ROOT):
            problems.append(f"{link}: outside the repository")
        elif path and not target.exists():
            if not pending(path, page):
                problems.append(f"{link}: no such file")
        elif anchor and target.suffix == ".md" and anchor not in anchors(target):
            problems.append(f"{link}: no heading #{anchor} in {target.name}")
    assert not problems, f"{rel(page)}:\n" + "\n".join(problems)


def headings(page: Path) -> list[str]:
    prose, _ = split_fences(page.read_text(encoding="utf-8"))
    return [h.replace("`", "").strip() for h in re.findall(r"^#+ (.+)$", prose, re.M)]


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_every_section_named_exists(page):
    """`README "Output"`, `limits.md "Memory budget"`, `[limits.md](limits.md) "Huge pages"`:
    the quoted name begins a heading of that page."""
    prose, _ = split_fences(page.read_text(encoding="utf-8"))
    problems = []
    for target, names in re.findall(r'(README|[\w-]+\.md)(?:\]\([^)]*\))?,? ((?:"[^"\n]+"(?:,? (?:and )?)?)+)',
                                    prose):
        path = ROOT / "README.md" if target == "README" else page.parent / target
        if not path.exists():
            path = ROOT / "docs" / target
        if not path.exists():
            continue  # a missing page is the link and path tests' to report
        for name in re.findall(r'"([^"\n]+)"', names):
            if not any(h.startswith(name) for h in headings(path)):
                problems.append(f'{target} "{name}": no such section')
    assert not problems, f"{rel(page)}:\n" + "\n".join(problems)


# ---------------------------------------------------------------- command-line flags

@functools.cache
def usage_flags(command: str) -> frozenset[str]:
    """The flags in ``COMMAND --help``'s usage (hidden options are not there): ``chainrows X``,
    ``chainrows`` itself or ``asv_benchmarks.X``."""
    if command.startswith("asv_benchmarks."):
        argv = [sys.executable, "-m", command, "--help"]
    else:
        argv = [sys.executable, "-m", "chainrows"] + command.split()[1:] + ["--help"]
    out = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, f"{' '.join(argv[2:])}: {out.stderr[-500:]}"
    usage = out.stdout.split("\n\n")[0]
    return frozenset(re.findall(r"(?<![\w-])--[a-z][\w-]*", usage)) | {"--help"}


@functools.cache
def chainrows_commands() -> tuple[str, ...]:
    out = subprocess.run([sys.executable, "-m", "chainrows", "--help"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    return tuple(re.findall(r"^    ([a-z][\w-]+)", out.stdout, re.M))


def command_lines(text: str) -> list[tuple[str, str]]:
    """(command, the rest of its line) for each command line in ``text``: ``chainrows X``,
    ``python -m chainrows X`` (``chainrows.cli``), ``python -m asv_benchmarks.X``; a line
    continued by ``\\`` is joined, a ``#`` comment, ``&&``, ``;`` and ``|`` end a command."""
    text = re.sub(r"\\\n", " ", text)
    found = []
    for line in text.splitlines():
        line = re.sub(r"(^|\s)#.*", "", line)
        for part in re.split(r"&&|;|\|(?!\|)|\$\(", line):
            m = re.search(r"(?:^|\s)(?:python3? -m )?chainrows(?:\.cli)?(?: ([a-z][\w-]*))?(?=\s|$)(.*)", part)
            if m and not m.group(0).lstrip().startswith("-"):
                command = m.group(1)
                if command in chainrows_commands():
                    found.append((f"chainrows {command}", m.group(2)))
                elif command is None or command.isupper() or command.startswith("-"):
                    found.append(("chainrows", (command or "") + m.group(2)))
                continue
            m = re.search(r"python3? -m (asv_benchmarks\.\w+)(.*)", part)
            if m:
                found.append((m.group(1), m.group(2)))
    return found


def flags_in(rest: str) -> set[str]:
    return set(re.findall(r"(?<![\w-])--[a-z][\w-]*", rest))


def flag_problems(page: Path) -> list[str]:
    text = page.read_text(encoding="utf-8")
    prose, blocks = split_fences(text)
    problems = []

    def check(command: str, rest: str, where: str) -> None:
        if command == "chainrows" and rest.strip() and rest.split()[0].islower() \
                and not rest.split()[0].startswith("-"):
            problems.append(f"{where}: no command `chainrows {rest.split()[0]}`")
            return
        for flag in sorted(flags_in(rest) - usage_flags(command)):
            problems.append(f"{where}: `{command}` has no {flag}")

    for lang, body, _ in blocks:
        if lang in ("sh", "bash", "console", "shell", ""):
            for command, rest in command_lines(body):
                check(command, rest, "code block")
    everything = frozenset().union(*(usage_flags(f"chainrows {c}") for c in chainrows_commands()))
    for group in paragraphs(prose):
        named = []
        for span in spans(group):
            lines = command_lines(span)
            for command, rest in lines:
                check(command, rest, f"`{span}`")
            named += [c for c, _ in lines if c != "chainrows"]
        for m in re.finditer(r"(?<![\w-])chainrows ([a-z][\w-]+)", group):  # a command named in prose
            if m.group(1) in chainrows_commands():
                named.append(f"chainrows {m.group(1)}")
        for span in spans(group):
            if not re.fullmatch(r"--[a-z][\w-]*(?:[ =]\S+)?", span):
                continue
            flag = re.match(r"--[a-z][\w-]*", span).group()
            allowed = frozenset().union(*(usage_flags(c) for c in named)) if named else everything
            if flag not in allowed:
                problems.append(f"`{span}`: a flag of none of {sorted(set(named)) or 'the chainrows commands'}")
    return [f"{rel(page)}: {p}" for p in problems]


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_every_flag_shown_is_in_the_help(page):
    problems = flag_problems(page)
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------------- python snippets

def python_blocks() -> list[tuple[str, int, str, str]]:
    """(page, index on the page, body, the line before) of every ```python block."""
    found = []
    for page in PAGES:
        _, blocks = split_fences(page.read_text(encoding="utf-8"))
        python = [(body, before) for lang, body, before in blocks if lang in ("python", "py", "python3")]
        found += [(rel(page), i, body, before) for i, (body, before) in enumerate(python)]
    return found


NOT_RUN = re.compile(r"<!-- not run: (.+?) -->")


def test_every_unrun_block_says_why():
    unrun = [(page, i, NOT_RUN.fullmatch(before)) for page, i, _, before in python_blocks()
             if before.startswith("<!-- not run")]
    assert all(m and len(m.group(1).split()) >= 2 for _, _, m in unrun), unrun
    assert len(unrun) <= 3, f"keep the snippets that are not run few: {unrun}"


@pytest.fixture(scope="module")
def snippet_data(tmp_path_factory) -> Path:
    from chainrows.formats.calls.export import export_calls, write_results_jsonl
    from chainrows.formats.native.dataset import read_dataset
    from chainrows.synth import write_synth_dataset

    d = tmp_path_factory.mktemp("snippet-data")
    write_synth_dataset(d / "DATA", 40, seed=0, corrupt_rate=0.1)
    out = subprocess.run([sys.executable, "-m", "chainrows", "reassemble", "DATA", "OUT", "--no-progress"],
                         cwd=d, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    jsonl = (ROOT / "docs" / "jsonl.md").read_text(encoding="utf-8")
    for name, body in re.findall(r"<!-- file: ([\w.]+) -->\n```jsonl\n(.*?)\n```", jsonl, re.S):
        (d / name).write_text(body + "\n", encoding="utf-8")
    shutil.copytree(ROOT / "examples" / "gym" / "dump", d / "dump")
    write_synth_dataset(d / "clean", 12, seed=1, corrupt_rate=0.0)
    clean = read_dataset(d / "clean")
    import pyarrow.parquet as pq
    pq.write_table(export_calls(clean.ledger, clean.tokens), d / "calls.parquet")
    write_results_jsonl(d / "calls-results.jsonl", clean.rollouts)
    shutil.rmtree(d / "clean")
    imported = subprocess.run([sys.executable, "-m", "chainrows", "import-calls", "calls.parquet",
                               "calls-results.jsonl", "data", "--no-progress"], cwd=d, capture_output=True,
                              text=True, timeout=600)
    assert imported.returncode == 0, imported.stderr
    assert sorted(p.name for p in d.iterdir()) == sorted(SNIPPET_DIR_CONTENTS)
    return d


@pytest.mark.parametrize("body", [pytest.param(body, id=f"{page}-{index}") for page, index, body, before
                                  in python_blocks() if not before.startswith("<!-- not run")])
def test_python_block_runs_on_a_plain_install(body, snippet_data, tmp_path):
    work = tmp_path / "work"
    shutil.copytree(snippet_data, work)
    out = subprocess.run([sys.executable, "-c", PRELUDE + body], cwd=work, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, f"{body}\n---\n{out.stderr[-3000:]}"


# ---------------------------------------------------------------- the checks catch drift

@pytest.mark.parametrize("token", ["chainrows.runners.bulk.plan.input_bytes", "footers.no_such",
                                   "Batch.no_such_method", "np.no_such_function"])
def test_a_stale_name_is_caught(token):
    assert check_code_name(token)


@pytest.mark.parametrize("token", ["chainrows/io/background.py", "tests/no_such.py",
                                   "tests/runners/bulk/test_bulk.py::test_no_such", "bulk/windows.no_such"])
def test_a_stale_path_is_caught(token):
    assert check_path(token, ROOT / "README.md")


def test_a_stale_flag_is_caught(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("```sh\nchainrows reassemble DATA OUT --no-such-flag\n```\n\n"
                    "Run `chainrows import-gym DUMP DATA --threads 2`; `--on-drift mask` too.\n\n"
                    "`python -m asv_benchmarks.bulk_shapes --no-such`\n", encoding="utf-8")
    problems = flag_problems(page)
    assert any("--no-such-flag" in p for p in problems)
    assert any("--on-drift" in p for p in problems)  # import-calls', not import-gym's
    assert any("--no-such" in p and "bulk_shapes" in p for p in problems)
    assert not any("--threads" in p for p in problems)


def test_a_snippet_that_needs_pandas_fails(tmp_path):
    out = subprocess.run([sys.executable, "-c", PRELUDE + "import pandas"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "plain install" in out.stderr
