"""examples/models: every public configuration reads as a tables file and says where its numbers come from."""

import glob
import os

import pytest

from shardcore.data.user_tables import read_batch_size, read_tables

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ZOO = os.path.join(ROOT, "examples", "models")
FILES = sorted(glob.glob(os.path.join(ZOO, "*.csv")))


def _comments(path):
    """The comment lines before the header, without their '#'."""
    out = []
    with open(path) as f:
        for line in f:
            if not line.lstrip().startswith("#"):
                break
            out.append(line.lstrip()[1:].strip())
    return out


def test_model_zoo_is_not_empty():
    assert len(FILES) >= 7


@pytest.mark.parametrize("path", FILES, ids=os.path.basename)
def test_model_zoo_file_reads_and_cites_its_sources(path):
    tables, names = read_tables(path)
    assert len(tables) == len(names) >= 1
    assert read_batch_size(path) is not None, "a zoo file states the batch its pooling factors belong to"
    comments = _comments(path)
    assert comments and ":" not in comments[0].split(" ")[0], "the first comment line is the description"
    assert any(c.startswith("source:") for c in comments), "every zoo file cites a source"
    keys = {c.split(":", 1)[0] for c in comments[1:]}
    assert keys <= {"source", "assumed", "batch_size"}, f"unexpected comment keys {keys}"


def test_model_zoo_readme_lists_exactly_the_files():
    readme = open(os.path.join(ZOO, "README.md")).read()
    rows = [line for line in readme.splitlines() if line.startswith("| `")]
    listed = {line.split("`")[1] for line in rows}
    assert listed == {os.path.basename(p) for p in FILES}
    for line in rows:   # the table counts in the README agree with the file
        cells = [c.strip() for c in line.strip("|").split("|")]
        tables, _ = read_tables(os.path.join(ZOO, cells[0].strip("`")))
        assert int(cells[2]) == len(tables), cells[0]
        assert int(cells[4].replace(",", "")) == sum(t.row for t in tables), cells[0]
