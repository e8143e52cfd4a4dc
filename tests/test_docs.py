"""Docs are code: every shell, console and Python block of the README and docs/ runs, as written,
in a fresh copy of the repository, in the order the doc shows them (`tests/docs_blocks.py`);
console blocks print what the doc says they print. A block that cannot run here says why in a
`<!-- doc-test: skip REASON -->` comment, and this test lists those reasons."""

from pathlib import Path

import pytest

from tests.docs_blocks import ROOT, Session, blocks, console_steps, fresh_copy, match_output, run_block

DOCS = [ROOT / "README.md", ROOT / "examples" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(1500)
@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_block_of_the_doc_runs_as_written(doc, tmp_path):
    runnable = [b for b in blocks(doc) if b.kind != "shown"]
    if not runnable:
        pytest.skip("no runnable blocks")
    session = Session(fresh_copy(tmp_path / "clone"))
    failures = []
    try:
        for block in runnable:
            if block.skip:
                continue
            problem = run_block(session, block)
            if problem:
                failures.append(f"{block.where}: {problem}")
                break  # later blocks build on this one
    finally:
        session.close()
    assert not failures, "\n\n".join(failures)


def test_skipped_blocks_say_why():
    skipped = [(b.where, b.skip) for doc in DOCS for b in blocks(doc) if b.skip]
    assert all(reason and reason != "(no reason given)" for _, reason in skipped), skipped


@pytest.mark.parametrize("expected, actual, ok", [
    (["a", "b"], "a\nb\n", True),
    (["a", "...", "c"], "a\nb\nc\n", True),
    (["a", "c"], "a\nb\nc\n", False),  # without '...' the lines are consecutive
    (["plan verified: ... ops"], "x\nplan verified: 12 ops\n", True),
    (["missing"], "a\n", False),
    (["name ... kind result"], "name        kind   result\n", True),  # table columns: '...' may match nothing
])  # fmt: skip
def test_console_output_matching(expected, actual, ok):
    assert (match_output(expected, actual) is None) == ok


def test_blocks_and_directives_are_parsed(tmp_path):
    doc = ROOT / "tests" / "_doc_example.md"
    doc.write_text("x\n<!-- doc-test: skip needs two hosts -->\n```sh\necho a\n```\n\n```console\n$ echo b\nb\n```\n"
                   "```json\n{}\n```\n")  # fmt: skip
    try:
        found = blocks(doc)
    finally:
        doc.unlink()
    assert [(b.kind, b.skip) for b in found] == [("sh", "needs two hosts"), ("console", ""), ("shown", "")]
    assert console_steps(found[1].code) == [("echo b", ["b"])]
    assert Path(found[0].doc).name == "_doc_example.md"
