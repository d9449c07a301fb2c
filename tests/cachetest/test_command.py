"""The command's refusals, in-process through typer's runner (no server needed)."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from gateway.cli import app


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["cachetest", *args])
    return result.exit_code, result.output


def test_the_isolation_stage_needs_a_second_key(tmp_path: Path) -> None:
    code, output = invoke(
        "--target", "http://127.0.0.1:9", "--key", "k", "--model", "m",
        "--stages", "isolation", "--report", str(tmp_path),
    )  # fmt: skip
    assert code == 2
    assert "the isolation stage needs --second-key" in output


def test_unknown_stages_and_plans_are_refused(tmp_path: Path) -> None:
    common = ("--target", "http://127.0.0.1:9", "--key", "k", "--model", "m")
    code, output = invoke(*common, "--stages", "warmth", "--report", str(tmp_path))
    assert code == 2 and "unknown stage(s) warmth" in output
    code, output = invoke(*common, "--plan", "huge", "--report", str(tmp_path))
    assert code == 2 and "want one of quick, full" in output


def test_a_target_that_does_not_answer_stops_the_run_at_once(tmp_path: Path) -> None:
    code, output = invoke(
        "--target", "http://127.0.0.1:9", "--key", "k", "--model", "m",
        "--report", str(tmp_path / "report"),
    )  # fmt: skip
    assert code == 2
    assert "error: the first request to http://127.0.0.1:9 failed (status 0)" in output
    assert not (tmp_path / "report").exists()


def test_a_target_that_is_not_a_base_url_is_refused(tmp_path: Path) -> None:
    code, output = invoke(
        "--target", "127.0.0.1:8000/v1", "--key", "k", "--model", "m",
        "--report", str(tmp_path / "report"),
    )  # fmt: skip
    assert code == 2
    words = " ".join(output.replace("│", " ").split())  # the message, out of rich's box
    assert "want an http(s) base URL such as http://127.0.0.1:8000/v1, not '127.0.0.1" in words
    assert not (tmp_path / "report").exists()
