"""The Python examples in the README and the manual (``docs/*.md``) run as written against the real
pack (a guard against doc rot: an example that raises or names an API that moved fails here)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: (file, its python blocks) for every document that has any
BLOCKS = {p.relative_to(ROOT).as_posix(): re.findall(r"```python\n(.*?)```", p.read_text(), flags=re.DOTALL)
          for p in DOCS}
CASES = [(name, i) for name, blocks in BLOCKS.items() for i in range(len(blocks))]


def test_docs_have_python_examples():
    assert BLOCKS["README.md"], "the README shows the Python API"
    assert len(BLOCKS["docs/python-api.md"]) >= 2


def test_readme_links_resolve():
    """Every relative link in the README names a file that exists."""
    links = re.findall(r"\]\(([^)#:]+)\)", (ROOT / "README.md").read_text())
    assert links
    missing = [link for link in links if not (ROOT / link).exists()]
    assert not missing, missing


@pytest.mark.real_pack
@pytest.mark.parametrize(("name", "i"), CASES, ids=[f"{n}[{i}]" for n, i in CASES])
def test_doc_python_example_runs(real_pack_available, name, i):
    blocks = BLOCKS[name]
    namespace: dict = {}
    if i > 0:  # later blocks continue the file's first one (they use its imports and names)
        exec(compile(blocks[0], f"{name}[0]", "exec"), namespace)  # noqa: S102 -- the document's own code
    exec(compile(blocks[i], f"{name}[{i}]", "exec"), namespace)  # noqa: S102
