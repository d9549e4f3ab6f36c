"""The README's Python examples run as written against the real pack (a guard against doc rot:
an example that raises or names an API that moved fails here)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


def test_readme_has_python_examples():
    assert len(BLOCKS) >= 2


@pytest.mark.real_pack
@pytest.mark.parametrize("i", range(len(BLOCKS)))
def test_readme_python_example_runs(real_pack_available, i):
    namespace: dict = {}
    if i > 0:  # later blocks continue the first one's session (they use its imports and names)
        exec(compile(BLOCKS[0], "README.md[0]", "exec"), namespace)  # noqa: S102 -- the README's own code
    exec(compile(BLOCKS[i], f"README.md[{i}]", "exec"), namespace)  # noqa: S102
