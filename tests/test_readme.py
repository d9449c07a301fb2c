"""The README's snippets run against the code, so they cannot drift from it again.

- YAML blocks: a deployments file goes through the config loader, a compose file through
  YAML with its services' kvgate commands checked; any other kind must be taught here.
- Shell blocks and inline code: every `kvgate ...` command resolves in the real CLI with
  every flag it names; every `make` target is in the Makefile; every `KVGATE_` variable
  is a setting (or one the test suite reads).
- The commands list names exactly the CLI's commands; the settings table lists exactly
  the settings, with their defaults.
- Python blocks compile.
"""

from __future__ import annotations

import ast
import re
import shlex
from dataclasses import dataclass
from decimal import Decimal
from enum import Enum
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml

from gateway.cli import app
from gateway.config import DEV_ADMIN_TOKEN, DEV_SECRET, Settings, load_deployments

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()
CLI = typer.main.get_command(app)
# A field read under another name (PROMETHEUS_MULTIPROC_DIR, which `kvgate serve --workers`
# sets for its workers) is not a KVGATE_ setting a user sets.
SETTINGS = {
    f"KVGATE_{name.upper()}": field
    for name, field in Settings.model_fields.items()
    if field.validation_alias is None
}
TOOLS = {"pip", "curl", "docker"}  # other programs shell blocks may run, unchecked


@dataclass(frozen=True)
class Block:
    language: str
    text: str
    line: int

    def __str__(self) -> str:
        return f"README.md:{self.line} ({self.language or 'plain'} block)"


def blocks() -> list[Block]:
    """The fenced code blocks, with their language and first line."""
    found = []
    for match in re.finditer(r"^```(\w*)\n(.*?)^```$", README, re.MULTILINE | re.DOTALL):
        found.append(Block(match[1], match[2], README.count("\n", 0, match.start()) + 2))
    return found


def prose() -> str:
    """The README without its fenced blocks."""
    return re.sub(r"^```\w*\n.*?^```$", "", README, flags=re.MULTILINE | re.DOTALL)


def inline_code() -> list[str]:
    """Inline code spans outside the fenced blocks, whitespace (line breaks) collapsed."""
    return [" ".join(span.split()) for span in re.findall(r"`([^`\n]+(?:\n[^`\n]+)*)`", prose())]


def of(language: str) -> list[Block]:
    return [b for b in blocks() if b.language == language]


# -- the CLI ---------------------------------------------------------------------------


def subcommands(command: Any) -> dict[str, Any]:
    # Typer's click may not be the installed click, so groups are known by what they have.
    return dict(getattr(command, "commands", {}))


def cli_commands(command: Any = CLI, path: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    """Every runnable command, as its words after `kvgate`."""
    children = subcommands(command)
    if not children:
        return {path}
    return {leaf for name, sub in children.items() for leaf in cli_commands(sub, (*path, name))}


def check_kvgate(words: list[str], where: object) -> None:
    """The command the words name exists, and so does each --flag given to it."""
    assert words[0] == "kvgate", where
    command, path = CLI, ["kvgate"]
    rest = words[1:]
    while subcommands(command):
        assert rest and rest[0] in subcommands(command), (
            f"{where}: `{' '.join(path)}` has no command {rest[:1]} "
            f"(it has {sorted(subcommands(command))})"
        )
        command = subcommands(command)[rest[0]]
        path.append(rest.pop(0))
    flags = {opt for param in command.params if not param.hidden for opt in param.opts}
    for word in rest:
        flag = word.split("=", 1)[0]
        if flag.startswith("--") and flag != "--help":
            assert flag in flags, f"{where}: `{' '.join(path)}` has no option {flag}"


def shell_words(command: str) -> list[str]:
    """A README command line as words: ``[--opt VALUE]`` optional parts kept, ``a|b`` as a."""
    words = []
    for word in shlex.split(command.replace("[", " ").replace("]", " ")):
        words.append(word.split("|", 1)[0] if "|" in word and not word.startswith("'") else word)
    return words


# -- make and settings -----------------------------------------------------------------


def make_targets() -> set[str]:
    makefile = (REPO / "Makefile").read_text()
    return {
        name
        for line in re.findall(r"^([A-Za-z0-9_. -]+):(?!=)", makefile, re.MULTILINE)
        for name in line.split()
    }


def check_variable(name: str, where: object) -> None:
    """A KVGATE_ variable is a setting, or one the test suite itself reads."""
    if name in SETTINGS:
        return
    tests = "".join(
        p.read_text() for p in (REPO / "tests").rglob("*.py") if p.name != "test_readme.py"
    )
    assert re.search(rf"\b{name}\b", tests), (
        f"{where}: {name} is neither a setting nor read by the tests"
    )


# -- shell lines -----------------------------------------------------------------------


def simple_commands(script: str) -> list[str]:
    """The block's simple commands: continuations joined, comments and prompts dropped,
    lists (`;`, `&&`, `||`) split."""
    joined = re.sub(r"\\\n\s*", " ", script)
    commands = []
    for line in joined.splitlines():
        line = re.sub(r"(^|\s)#.*$", "", line).strip()
        for part in re.split(r"\s*(?:;|&&|\|\|)\s*", line):
            if part:
                commands.append(part.removeprefix("$ "))
    return commands


def check_shell(command: str, where: object) -> None:
    words = shell_words(command)
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
        name = words.pop(0).split("=", 1)[0]  # an assignment before the command
        if name.startswith("KVGATE_"):
            check_variable(name, where)
    if not words:
        return
    program = words[0]
    if program == "kvgate":
        check_kvgate(words, where)
    elif program == "make":
        for target in (w for w in words[1:] if "=" not in w and not w.startswith("-")):
            assert target in make_targets(), f"{where}: the Makefile has no target {target!r}"
    elif program == "export":
        for assignment in words[1:]:
            name = assignment.split("=", 1)[0]
            assert name.startswith("KVGATE_"), f"{where}: exports {name}"
            check_variable(name, where)
    else:
        assert program in TOOLS, f"{where}: teach tests/test_readme.py about {program!r}"


# -- the tests -------------------------------------------------------------------------


def test_the_readme_has_the_snippets_this_test_reads() -> None:
    """A change in the README's shape must not silently leave snippets unchecked."""
    assert {b.language for b in blocks()} <= {"", "sh", "yaml", "python"}
    assert len(of("yaml")) >= 1 and len(of("sh")) >= 3 and len(of("python")) >= 1


def check_yaml(text: str, where: object, tmp_path: Path) -> None:
    """A deployments file loads; a compose file's kvgate commands exist."""
    document = yaml.safe_load(text)
    assert isinstance(document, dict), where
    if "models" in document:
        # A model directory must hold a tokenizer.json: the README's stands for one here.
        for model in document["models"]:
            tokenizer = model.get("tokenizer")
            if tokenizer not in (None, "kvgate-sim"):
                directory = tmp_path / tokenizer.lstrip("/")
                directory.mkdir(parents=True, exist_ok=True)
                (directory / "tokenizer.json").write_text("{}")
                model["tokenizer"] = str(directory)
        path = tmp_path / "kvgate.yaml"
        path.write_text(yaml.safe_dump(document))
        loaded = load_deployments(path)
        assert [d.name for d in loaded] == [m["name"] for m in document["models"]]
    elif "services" in document:
        for name, service in document["services"].items():
            command = service.get("command", [])
            words = shlex.split(command) if isinstance(command, str) else [str(w) for w in command]
            if words[:1] == ["kvgate"]:
                check_kvgate(words, f"{where}, service {name}")
    else:
        pytest.fail(f"{where}: YAML of an unknown kind; teach tests/test_readme.py to load it")


@pytest.mark.parametrize("block", of("yaml"), ids=str)
def test_every_yaml_block_is_accepted_by_its_loader(block: Block, tmp_path: Path) -> None:
    check_yaml(block.text, block, tmp_path)


def test_a_compose_snippet_has_its_commands_checked(tmp_path: Path) -> None:
    good = (
        "services:\n  gateway:\n    command: kvgate serve --config /etc/kvgate.yaml --port 8000\n"
    )
    check_yaml(good, "compose", tmp_path)
    bad = "services:\n  gateway:\n    command: [kvgate, serve, --listen, '0.0.0.0']\n"
    with pytest.raises(AssertionError, match="has no option --listen"):
        check_yaml(bad, "compose", tmp_path)


def test_the_deployments_example_has_a_vllm_and_a_litellm_model() -> None:
    """The example the issue found refused: a litellm deployment's primary is its own."""
    (deployments,) = [b for b in of("yaml") if "models" in yaml.safe_load(b.text)]
    backends = {m.get("backend", "vllm") for m in yaml.safe_load(deployments.text)["models"]}
    assert backends == {"vllm", "litellm"}


@pytest.mark.parametrize("block", of("sh"), ids=str)
def test_every_shell_command_exists(block: Block) -> None:
    commands = simple_commands(block.text)
    assert commands, block
    for command in commands:
        check_shell(command, block)


def test_every_inline_command_exists() -> None:
    spans = inline_code()
    commands = [s for s in spans if s.startswith(("kvgate ", "make ")) and " | " not in s]
    assert len(commands) >= 5
    for span in commands:
        check_shell(span, f"README.md inline `{span}`")


def test_the_commands_list_names_every_cli_command_and_no_other() -> None:
    (listing,) = [s for s in inline_code() if s.startswith("kvgate serve |")]
    named: set[tuple[str, ...]] = set()
    for item in listing.removeprefix("kvgate ").split(" | "):
        group, _, subs = item.partition(" ")
        named |= {(group, sub) for sub in subs.split("|")} if subs else {(group,)}
    assert named == cli_commands()


def test_every_kvgate_variable_named_exists() -> None:
    names = set(re.findall(r"\bKVGATE_[A-Z0-9_]*[A-Z0-9]\b", README))
    assert len(names) >= 10
    for name in sorted(names):
        check_variable(name, f"README.md ({name})")


def settings_table() -> dict[str, str]:
    """The settings table: each variable and its documented default."""
    start = README.index("### Settings")
    rows = re.findall(r"^\| (`KVGATE_.*?) \| (.*?) \|", README[start:], re.MULTILINE)
    table = {}
    for names, defaults in rows:
        spans = re.findall(r"`([A-Z0-9_]+)`", names)
        values = [d.strip() for d in defaults.split(" / ")]
        if len(values) != len(spans):
            values = [defaults.strip()] * len(spans)
        stem = spans[0]
        for span, value in zip(spans, values, strict=True):
            # `KVGATE_RECORDER_BATCH_SIZE` / `_FLUSH_INTERVAL_S`: the second shares the group.
            name = span if span.startswith("KVGATE_") else "_".join(stem.split("_")[:2]) + span
            table[name] = value
    return table


def documented(default: str) -> object:
    """A default as the table writes it, as a value."""
    text = default.strip("`")
    if text == "none":
        return None
    if text in ("true", "false"):
        return text == "true"
    if mib := re.fullmatch(r"(\d+) MiB", text):
        return int(mib[1]) * 1024 * 1024
    if kib := re.fullmatch(r"(\d+) KiB", text):
        return int(kib[1]) * 1024
    if re.fullmatch(r"\d{1,3}(,\d{3})+", text):
        return int(text.replace(",", ""))
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return Decimal(text)
    return text


def test_the_settings_table_lists_every_setting_with_its_default() -> None:
    table = settings_table()
    assert set(table) == set(SETTINGS), "settings missing from, or unknown to, the table"
    for name, default in table.items():
        actual = SETTINGS[name].default
        if default == "dev value":
            assert actual in (DEV_SECRET, DEV_ADMIN_TOKEN), name
            continue
        value = documented(default)
        if value is None:
            assert actual in (None, ()), (name, default, actual)  # unset, or an empty list
        elif isinstance(value, Decimal):
            assert Decimal(str(actual)) == value, (name, default, actual)
        elif isinstance(actual, Enum):
            assert actual.value == value, (name, default, actual)
        elif isinstance(actual, Path):
            assert str(actual) == value, (name, default, actual)
        else:
            assert actual == value, (name, default, actual)


@pytest.mark.parametrize("block", of("python"), ids=str)
def test_every_python_block_compiles(block: Block) -> None:
    ast.parse(block.text, filename=str(block))


@pytest.mark.parametrize(
    ("command", "complaint"),
    [
        ("kvgate serve --config kvgate.yaml --hots 0.0.0.0", "has no option --hots"),
        ("kvgate keys rotate --tenant acme", "has no command ['rotate']"),
        ("make demo-everything", "no target 'demo-everything'"),
        ("export KVGATE_DATABASE_URI=sqlite://", "neither a setting nor read by the tests"),
        ("KVGATE_WORKER=2 kvgate serve", "neither a setting nor read by the tests"),
        ("kubectl apply -f kvgate.yaml", "teach tests/test_readme.py about 'kubectl'"),
    ],
)
def test_the_checks_catch_what_drifts(command: str, complaint: str) -> None:
    with pytest.raises(AssertionError, match=re.escape(complaint)):
        check_shell(command, "here")


def test_a_commented_continued_block_splits_into_its_commands() -> None:
    script = (
        "kvgate db upgrade   # migrations\n"
        "kvgate cachetest --target URL \\\n  [--plan quick|full] --report DIR; make test\n"
    )
    assert [shell_words(c) for c in simple_commands(script)] == [
        ["kvgate", "db", "upgrade"],
        ["kvgate", "cachetest", "--target", "URL", "--plan", "quick", "--report", "DIR"],
        ["make", "test"],
    ]
