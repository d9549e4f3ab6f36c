"""Read the pack's own support matrix: ``systems/support_matrix/<system>.csv``.

Each CSV row is one (model, system, backend, version, mode) combination the reference tool was
run on, with its outcome. Columns (perf-data-format.md, section 2.4): ``HuggingFaceID,
Architecture, System, Backend, Version, Mode, Status, ErrMsg, Command, Source``. ``Status`` is
PASS, FAIL, HW_INCOMPATIBLE, HYBRID_PASS or FRAMEWORK_INCOMPATIBLE; ``ErrMsg`` is a Python
traceback whose newlines are stored as the two characters ``\\n`` (its last line is the
exception); ``Command`` is the reference's command line, whose ``--total-gpus`` is the GPU budget
the row was searched with. ``index.json`` lists the files; without it every ``*.csv`` is read.
"""

from __future__ import annotations

import csv
import json
import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import DataFileError
from .pack import Pack

MATRIX_DIR = "support_matrix"
COLUMNS = ("HuggingFaceID", "Architecture", "System", "Backend", "Version", "Mode", "Status")


@dataclass(frozen=True)
class MatrixRow:
    """One row of the pack's support matrix."""

    model: str
    architecture: str
    system: str
    backend: str
    version: str
    mode: str
    status: str
    error: str  # the last line of the reference's traceback ("" for PASS rows)
    total_gpus: int | None  # the reference run's --total-gpus
    isl: int | None
    osl: int | None

    @property
    def passed(self) -> bool:
        return self.status == "PASS"

    @property
    def key(self) -> tuple[str, str, str, str, str]:
        return (self.model, self.system, self.backend, self.version, self.mode)


def _flag(command: str, name: str) -> int | None:
    m = re.search(rf"--{name}[ =](\d+)", command or "")
    return int(m.group(1)) if m else None


def last_error_line(errmsg: str) -> str:
    """The exception line of a traceback stored with literal ``\\n`` (or real) newlines."""
    lines = [ln.strip() for ln in (errmsg or "").replace("\\n", "\n").splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def matrix_files(pack: Pack) -> list[Path]:
    """The matrix CSVs of ``pack`` (those ``index.json`` lists, else every CSV); [] if it has none."""
    d = pack.systems_dir / MATRIX_DIR
    if not d.is_dir():
        return []
    index = d / "index.json"
    if index.exists():
        try:
            names = json.loads(index.read_text()).get("files") or []
        except (json.JSONDecodeError, AttributeError) as exc:
            raise DataFileError(f"cannot parse {index}", str(exc)) from exc
        return [d / n for n in names if (d / n).exists()]
    return sorted(d.glob("*.csv"))


def read_matrix(pack: Pack) -> list[MatrixRow]:
    """Every row of the pack's support matrix, in file order."""
    rows: list[MatrixRow] = []
    for path in matrix_files(pack):
        try:
            with path.open(newline="", encoding="utf-8") as fh:
                reader = csv.DictReader(fh)
                missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
                if missing:
                    raise DataFileError(f"support matrix {path.name} lacks columns {', '.join(missing)}",
                                        f"expected {', '.join(COLUMNS)}")
                for r in reader:
                    cmd = r.get("Command") or ""
                    rows.append(MatrixRow(
                        r["HuggingFaceID"].strip(), r["Architecture"].strip(), r["System"].strip(),
                        r["Backend"].strip(), r["Version"].strip(), r["Mode"].strip(), r["Status"].strip(),
                        last_error_line(r.get("ErrMsg") or ""), _flag(cmd, "total-gpus"), _flag(cmd, "isl"),
                        _flag(cmd, "osl"),
                    ))
        except (OSError, UnicodeDecodeError, csv.Error) as exc:
            raise DataFileError(f"cannot read support matrix {path}", str(exc)) from exc
    return rows
