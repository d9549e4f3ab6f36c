"""Helpers for the command-line tests: run the CLI in-process and check its one-line errors."""

from __future__ import annotations

import pytest

from infercast.cli.main import main


def run_cli(capsys, argv):
    """Run the CLI in-process; return (exit code, stdout, stderr). Uncaught exceptions fail."""
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse usage errors
        rc = exc.code
    except Exception as exc:  # noqa: BLE001  # pragma: no cover - the failure we are guarding against
        pytest.fail(f"uncaught {type(exc).__name__} from the CLI for {argv}: {exc}")
    out, err = capsys.readouterr()
    return rc, out, err


def assert_one_line_error(rc, out, err, *needles):
    """Exit code 2, no traceback, one ``infercast: error: ...`` line holding every needle."""
    assert rc == 2, (rc, out, err)
    assert "Traceback" not in out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("infercast: error: ")
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]
