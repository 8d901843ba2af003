"""What the docs claim holds for a reader who acts on it (issue 41): every ``keras-dp``
option a page gives a command is one of its options and every option is documented;
every dotted name, package file, keyword and inline call the pages name exists as
written; the output samples have the shape of a fresh run's output (the demo, the
lint, ``report --format csv``); the paths the notebook reads work from where the
reader runs the command. tests/test_docs_examples.py runs the code blocks themselves.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.util
import inspect
import io
import json
import os
import re
import subprocess

import pytest

import keras_dp_tools as kdt
from keras_dp_tools.tools.cli import main
from tests.helpers import REPO
from tests.helpers.comparisons import write_known_comparison
from tests.helpers.doc_blocks import documents, fenced_blocks
from tests.helpers.doc_mentions import (
    all_passages,
    code_texts,
    dotted_names,
    inline_calls,
    option_mentions,
    python_file_mentions,
    subcommands,
)
from tests.helpers.package_source import MODULES, string_constants
from tests.helpers.processes import run_cli
from tests.helpers.recorded_runs import COMM_HEAVY, write_run


def options_of(parser) -> list[list[str]]:
    """Each option of a command as its spellings (``--help`` left out)."""
    return [
        action.option_strings
        for action in parser._actions
        if action.option_strings and "--help" not in action.option_strings
    ]


# ----------------------------------------------------------------------------- options


def test_every_option_a_page_gives_a_command_is_one_of_its_options():
    commands = subcommands()
    spellings = {
        name: {s for option in options_of(p) for s in option} for name, p in commands.items()
    }

    wrong = [
        f"{passage.document}:{passage.line}: keras-dp {command} {option}"
        for passage, command, option in option_mentions(set(commands))
        if option not in spellings[command] | {"--help"}
    ]
    assert not wrong, "options the docs give commands that do not take them: " + ", ".join(wrong)


def test_every_option_of_every_command_is_in_the_docs():
    commands = subcommands()
    documented = {(command, option) for _, command, option in option_mentions(set(commands))}

    missing = [
        f"keras-dp {name} {'/'.join(option)}"
        for name, parser in commands.items()
        for option in options_of(parser)
        if not any((name, spelling) in documented for spelling in option)
    ]
    assert not missing, "options only --help shows (document them): " + ", ".join(missing)


def test_the_option_reader_attributes_options_to_the_last_command_named(tmp_path, monkeypatch):
    page = tmp_path / "docs" / "page.md"
    page.parent.mkdir()
    page.write_text(
        "`keras-dp report runs/x --html r.html` then `tensorboard --logdir runs/x`.\n\n"
        "`report --format csv` prints a row per run; `--merge-runs` merges.\n\n"
        "```bash\nkeras-dp sweep demo --replicas 1,2 -- --steps 9\n"
        'make demo DEMO_ARGS="--epochs 2"\n```\n'
    )
    import tests.helpers.doc_mentions as mentions

    monkeypatch.setattr(mentions, "REPO", tmp_path)
    monkeypatch.setattr(mentions, "documents", lambda: ["docs/page.md"])

    found = [
        (command, option) for _, command, option in option_mentions({"report", "sweep", "demo"})
    ]
    assert found == [
        ("report", "--html"),  # --logdir is TensorBoard's
        ("report", "--format"),
        ("report", "--merge-runs"),
        ("sweep", "--replicas"),  # --steps, after "--", is the script's
        ("demo", "--epochs"),
    ]


# ----------------------------------------------------------------------------- names


def resolve(name: str):
    """The object a dotted name of the package names (``kdt.`` is ``keras_dp_tools.``):
    the longest importable module, then attributes. Raises what Python would."""
    parts = name.replace("kdt.", "keras_dp_tools.", 1).split(".")
    for end in range(len(parts), 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:end]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[end:]:
            target = getattr(target, attribute)
        return target
    raise ModuleNotFoundError(name)


def test_every_dotted_name_in_the_docs_resolves():
    failed = []
    for passage, name in dotted_names():
        try:
            resolve(name)
        except (ImportError, AttributeError) as error:
            failed.append(f"{passage.document}:{passage.line}: {name} ({type(error).__name__})")
    assert not failed, "names the docs give that do not exist: " + ", ".join(failed)


def test_every_file_of_the_repository_the_docs_name_exists():
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    missing = [
        f"{passage.document}:{passage.line}: {name}"
        for passage, name in python_file_mentions()
        # lint-corpus.md names files of the repositories the lint was tried on
        if passage.document != "docs/lint-corpus.md"
        and not any(path == name or path.endswith("/" + name) for path in tracked)
    ]
    assert not missing, "files the docs name that the repository does not have: " + ", ".join(
        missing
    )


def package_parameter_names() -> set[str]:
    """The parameter names of every function and method of the package (from its source)."""
    names = set()
    for path in (REPO / "keras_dp_tools").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                arguments = node.args
                for argument in [*arguments.args, *arguments.kwonlyargs, *arguments.posonlyargs]:
                    names.add(argument.arg)
    return names


# Keywords of TensorFlow's and Keras's APIs that the pages name as such.
TENSORFLOW_KEYWORDS = {"_r", "deterministic", "drop_remainder", "host_tracer_level", "batch_size"}


def test_every_keyword_the_docs_name_alone_is_a_parameter():
    """A lone `name=value` in prose (e.g. `all_workers=True`) is a parameter of the
    package's API, or of TensorFlow's that the page is about."""
    known = package_parameter_names() | TENSORFLOW_KEYWORDS
    unknown = [
        f"{passage.document}:{passage.line}: {span}"
        for passage, span in code_texts()
        if not passage.code
        and passage.document != "docs/lint-corpus.md"  # other repositories' code
        and re.fullmatch(r"[a-z_]\w*=[^=\s].*", span)
        and span.split("=")[0] not in known
    ]
    assert not unknown, "keywords no function takes: " + ", ".join(unknown)


def test_every_inline_call_binds_to_the_signature():
    """`kdt.f(a, b, key=...)` as a page writes it binds to ``f``'s signature (``...``
    among the arguments stands for more), and gives what ``f`` cannot do without: a
    ``per_replica_batch`` whose default is None (the pages' ``make_dataset`` takes the
    global batch, which ``tune_allreduce`` then cannot know)."""
    wrong = []
    for passage, span in inline_calls():
        call = ast.parse(span.replace("|", " or "), mode="eval").body
        signature = inspect.signature(resolve(ast.unparse(call.func)))
        place = f"{passage.document}:{passage.line}: {span}"
        elided = any(isinstance(a, ast.Constant) and a.value is Ellipsis for a in call.args)
        keywords = {keyword.arg for keyword in call.keywords if keyword.arg}
        try:
            bound = signature.bind(*range(len(call.args)), **dict.fromkeys(keywords, 0))
        except TypeError as error:
            if not elided:
                wrong.append(f"{place} ({error})")
            continue
        batch = signature.parameters.get("per_replica_batch")
        if (
            "build_model" in signature.parameters  # the tuning contract's functions
            and batch is not None
            and batch.default is None
            and "per_replica_batch" not in bound.arguments
        ):
            wrong.append(f"{place} (no per_replica_batch: make_dataset(global_batch) needs it)")
    assert not wrong, "inline calls that do not match the API: " + ", ".join(wrong)


# ----------------------------------------------------------------------------- samples


def normalised(line: str) -> str:
    """A line's shape: numbers (dates, times, ids; "<0.001" and "-1" too) and "not
    measured" (a value a loaded machine may leave unmeasured) as #, paths as <path>,
    spaces as one."""
    line = line.replace("not measured", "0")
    line = re.sub(r"\S*/\S*", "<path>", line)
    line = re.sub(r"(?<![\w-])[<-]?[0-9a-f]*\d[0-9a-f.,:-]*", "#", line)
    return " ".join(line.split())


def output_samples(of: str) -> list:
    """The fenced blocks marked as output of ``of`` (``<!-- not run: output of `of`...``,
    backquotes or not)."""
    return [
        block
        for document in documents()
        for block in fenced_blocks(document)
        if block.not_run_reason
        and block.not_run_reason.replace("`", "").startswith(f"output of {of}")
    ]


def test_a_lines_shape_sets_numbers_and_paths_aside():
    assert normalised("Sync wait   <0.001  ms  sync_wait_ms") == normalised(
        "Sync wait 0.67 ms sync_wait_ms"
    )
    assert normalised("Summary of run 20261203-162942-a0e4d7:") == "Summary of run #"
    assert normalised("  tensorboard --logdir /tmp/x/run   (Data parallel tab)") == (
        "tensorboard --logdir <path> (Data parallel tab)"
    )
    assert normalised("p90_step_ms") != normalised("median_step_ms")


def test_the_demo_output_samples_have_the_shape_of_a_fresh_demo_run(demo_run):
    """Each line of a sample of the demo's (or its report's) output is a line of a fresh
    demo run's output once numbers and paths are set aside: the labelled summary, the
    "How to read it" lines, the section titles and the "Next:" hints. The findings
    under Advice depend on the run's timing (none on a quiet machine): only their
    severity's form is checked."""
    _, result = demo_run
    fresh = {normalised(line) for line in result.stdout.splitlines()}
    # With no finding (a quiet machine) the heading reads "Advice: nothing stands out in
    # the numbers."; a sample with findings shows it as "Advice:".
    fresh |= {"Advice:"} if any(line.startswith("Advice:") for line in fresh) else set()
    samples = [
        *output_samples("keras-dp demo"),
        *output_samples("make demo"),
        *output_samples("keras-dp report"),
    ]
    assert len(samples) >= 2

    wrong = []
    for block in samples:
        lines = block.code.splitlines()
        advice = lines.index("Advice:") if "Advice:" in lines else len(lines)
        nexts = lines.index("Next:") if "Next:" in lines else len(lines)
        for number, line in enumerate(lines):
            if not line.strip() or line.strip() == "..." or advice < number < nexts:
                continue
            if normalised(line) not in fresh:
                wrong.append(f"{block.document}:{block.line + 1 + number}: {line.strip()}")
        findings = [line for line in lines[advice:nexts] if line.startswith("[")]
        wrong += [
            f"{block.document}: an [error] finding, which a CPU demo does not print: {line}"
            for line in findings
            if line.startswith("[error]")
        ]
    assert not wrong, "sample lines a fresh demo does not print: " + "; ".join(wrong)


def page_files(document: str, folder) -> list[str]:
    """Writes the files a page shows (a block whose first line is ``# name.py``) into
    ``folder``; returns their names."""
    names = []
    for block in fenced_blocks(document):
        first = block.code.splitlines()[0] if block.code.strip() else ""
        if re.fullmatch(r"# [\w.]+\.py", first):
            names.append(first[2:])
            (folder / first[2:]).write_text(block.code)
    return names


def run_main(*argv: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(list(argv))
    return out.getvalue()


def test_the_lint_samples_are_the_lint_of_the_pages_own_files(tmp_path, monkeypatch):
    assert page_files("docs/scaling.md", tmp_path) == ["data.py", "train.py"]
    monkeypatch.chdir(tmp_path)
    fresh_json = json.loads(run_main("lint", "train.py", "--format", "json"))
    fresh_text = run_main("lint", "train.py").splitlines()
    (json_sample,) = output_samples("keras-dp lint --format json")
    (text_sample,) = output_samples("keras-dp lint on the two files")

    def same(sample, fresh):  # a value shortened with "..." stands for the rest
        if isinstance(sample, str) and sample.endswith("..."):
            return isinstance(fresh, str) and fresh.startswith(sample[:-3])
        if isinstance(sample, dict):
            return sample.keys() == fresh.keys() and all(same(sample[k], fresh[k]) for k in sample)
        if isinstance(sample, list):
            return len(sample) == len(fresh) and all(map(same, sample, fresh))
        return sample == fresh

    sample = json.loads(json_sample.code)
    assert same(sample, fresh_json), json.dumps(fresh_json, indent=1)
    shown = [line for line in text_sample.code.splitlines() if not line.startswith("$")]
    for line, fresh in zip(shown, fresh_text, strict=True):
        assert fresh.startswith(line.removesuffix("...").rstrip(". ")), (line, fresh)


def test_the_report_csv_comment_says_what_a_comparison_folder_gives(tmp_path):
    """A compare-strategies log dir holds the comparison and each candidate's trial
    runs; the page's comment on `keras-dp report <that folder> --format csv` says what
    the CSV then holds (a row per run, or a row per candidate)."""
    folder = tmp_path / "strategies"
    write_known_comparison(folder)
    write_run(folder / "mirrored", run="trial-mirrored", breakdown=COMM_HEAVY)

    done = run_cli("report", str(folder), "--format", "csv")
    assert done.returncode == 0, done.stderr
    header = done.stdout.splitlines()[0].split(",")
    (line,) = [
        passage.text
        for passage in all_passages()
        if passage.code and re.search(r"keras-dp report runs/strategies --format csv", passage.text)
    ]
    comment = line.split("#", 1)[1]
    if "where" in header:  # the comparisons' table
        assert "row per candidate" in comment, (comment, header)
    else:  # the runs' summary (the trial runs)
        assert (
            "row per" in comment
            and "run" in comment
            and "candidate" not in comment.split("row per")[1].split(";")[0]
        ), (comment, header)


# ----------------------------------------------------------------------------- behaviour


WINDOW_STATUSES = ("analysed", "skipped", "failed", "interrupted", "foreign", "open")


def test_the_pages_agree_on_a_window_beside_tensorboard_profiling():
    """Keras's TensorBoard(profile_batch=...) in the same fit: our window is moved past
    its capture and analysed, beside a ``foreign`` row for its steps
    (tests/test_data_parallel_profiler.py::test_window_moves_past_keras_tensorboard_profile_batch).
    A passage that names it with a window status names one of those two."""
    sentences = [
        (passage, sentence)
        for passage in all_passages()
        if passage.document != "docs/records.md"  # its table defines every status
        for sentence in re.split(r"(?<=[.;])\s+", passage.text)
        if "profile_batch" in sentence
    ]
    wrong = [
        f"{passage.document}:{passage.line}: {status}"
        for passage, sentence in sentences
        for status in re.findall(r"`(\w+)`", sentence)
        if status in WINDOW_STATUSES and status not in ("analysed", "foreign")
    ]
    assert not wrong, "a window beside TensorBoard's profiling is said to be: " + ", ".join(wrong)


def test_the_tuning_page_says_how_many_trials_the_example_starts():
    """One process per candidate that applies: the reason the example is not run says
    how many, on a CPU and with GPUs, as the candidates' own rules count them."""
    from keras_dp_tools.tools.tuning.allreduce import CANDIDATES, _skip_reason

    def applying(gpus: bool) -> int:
        return sum(_skip_reason(candidate, gpus=gpus) is None for candidate in CANDIDATES.values())

    (block,) = [
        block
        for block in fenced_blocks("docs/tuning.md")
        if "kdt.tune_allreduce(" in block.code and block.not_run_reason
    ]
    said = [
        int(n) for n in re.findall(r"(\d+) (?:training processes|on a CPU)", block.not_run_reason)
    ]
    assert said == [applying(False)], block.not_run_reason
    assert f"all {applying(True)} with GPUs" in block.not_run_reason


def test_the_notebook_commands_give_it_an_absolute_log_dir():
    """Jupyter starts the kernel in the notebook's folder: a relative KERAS_DP_LOG_DIR
    would be read from there. Every command line of the docs that opens a notebook
    gives it an absolute path ($PWD/...) or one the command resolves itself."""
    relative = [
        f"{passage.document}:{passage.line}: {passage.text.strip()}"
        for passage in all_passages()
        if "jupyter" in passage.text
        for value in re.findall(r"KERAS_DP_LOG_DIR=(\S+)", passage.text)
        if not value.startswith(("/", "$PWD", '"$PWD', "$(pwd)", "~"))
    ]
    assert not relative, "relative log dirs given to a notebook: " + ", ".join(relative)


def test_make_notebook_gives_the_kernel_an_absolute_log_dir(tmp_path, monkeypatch):
    """``make notebook RUN=runs/x`` runs regenerate.py from the checkout; the kernel
    runs in notebooks/, so the path is resolved first."""
    import nbclient
    import nbformat

    spec = importlib.util.spec_from_file_location("regenerate", REPO / "notebooks/regenerate.py")
    regenerate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(regenerate)
    seen = []

    class Client:  # what the kernel would be given, without starting one
        def __init__(self, notebook, **kwargs):
            pass

        def execute(self):
            seen.append(os.environ["KERAS_DP_LOG_DIR"])

    monkeypatch.setattr(nbclient, "NotebookClient", Client)
    monkeypatch.setattr(nbformat, "write", lambda *args: None)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "x").mkdir(parents=True)

    regenerate.main(["--log-dir", "runs/x"])

    assert seen == [str(tmp_path / "runs" / "x")]


def test_keras_dp_docs_prints_the_pages(capsys):
    assert main(["docs", "reading"]) == 0
    assert capsys.readouterr().out == (REPO / "docs" / "reading.md").read_text()
    assert main(["docs", "docs/records.md", "--path"]) == 0
    assert capsys.readouterr().out.strip() == str(REPO / "docs" / "records.md")
    assert main(["docs", "changelog"]) == 0  # the page the site builds from CHANGELOG.md
    assert capsys.readouterr().out == (REPO / "CHANGELOG.md").read_text()

    assert main(["docs"]) == 0
    listed = dict(line.split(None, 1) for line in capsys.readouterr().out.splitlines())
    assert sorted(listed) == sorted(path.stem for path in (REPO / "docs").glob("*.md"))
    assert listed["reading"] == "Reading the numbers"
    assert main(["docs", "nope"]) == 1
    assert "topics: advisor-corpus, api, architecture" in capsys.readouterr().err


# Modules other changes own for now (issue 34's pip user): their messages still say
# docs/<page>.md. Take a module off once its strings say `keras-dp docs <page>`.
DOCS_PATHS_LEFT_IN: set[str] = set()


def test_messages_name_pages_a_pip_user_has():
    """What the package prints (messages, help texts: string constants, not docstrings)
    refers to a page as `keras-dp docs <page>`, which every install has, not as
    docs/<page>.md, which only a checkout has; and each page it names exists."""
    from keras_dp_tools.tools.shipped import topics

    checkout_paths, named = [], []
    for module, path in sorted(MODULES.items()):
        for text in string_constants(path):
            if module not in DOCS_PATHS_LEFT_IN:
                checkout_paths += [(module, m) for m in re.findall(r"docs/[\w-]+\.md", text)]
            named += [(module, m) for m in re.findall(r"keras-dp docs ([a-z][\w-]*)", text)]
    assert not checkout_paths, checkout_paths
    assert named and not [item for item in named if item[1] not in topics()], named


@pytest.mark.parametrize("spelling", ["kdt.Report.load", "keras_dp_tools.analysis.advice.advise"])
def test_resolve_finds_attributes_and_modules(spelling):
    assert callable(resolve(spelling))
    with pytest.raises(AttributeError):
        resolve("kdt.tuning.allreduce.CANDIDATES")  # kdt has no "tuning"
    assert resolve("kdt.Severity.ERROR") is kdt.Severity.ERROR
