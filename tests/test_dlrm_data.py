"""Raw dlrm_datasets processing, the synthetic generator and tools/gen_dlrm_data.py."""

from __future__ import annotations

import gzip
import json
import math
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]

from tools import gen_dlrm_data  # noqa: E402
from shardcore.data import dlrm  # noqa: E402
from shardcore.dataset import load_dataset  # noqa: E402
from shardcore.errors import ShardError  # noqa: E402

# A hand-made raw batch: 3 tables x 5 samples; table 2 is empty, table 1 has a hot row.
LOOKUPS = [
    [[0, 3], [3], [], [7, 0, 3], [9]],          # table 0
    [[5, 5, 5], [5], [2, 5], [], [40, 5, 5]],   # table 1 (row 5: 7 times)
    [[], [], [], [], []],                        # table 2
]


def make_raw(lookups=LOOKUPS):
    T, B = len(lookups), len(lookups[0])
    flat = [i for table in lookups for sample in table for i in sample]
    lengths = torch.tensor([[len(s) for s in table] for table in lookups], dtype=torch.int64)
    offsets = torch.zeros(T * B + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(lengths.reshape(-1), 0)
    return torch.tensor(flat, dtype=torch.int64), offsets, lengths


def write_raw(path: Path, obj, gz: bool = False) -> Path:
    if gz:
        with gzip.open(path, "wb") as fh:
            torch.save(obj, fh)
    else:
        torch.save(obj, path)
    return path


def expected_bins(samples):
    """The 17 reuse bins in plain Python: fraction of distinct rows looked up (2^(k-1), 2^k] times."""
    counts = Counter(i for s in samples for i in s)
    out = [0.0] * 17
    for c in counts.values():
        k = 0
        while k < 16 and c > 2 ** k:
            k += 1
        out[k] += 1
    return [v / len(counts) for v in out] if counts else out


def run_tool(*args) -> None:
    with pytest.raises(SystemExit) as exc:
        gen_dlrm_data.run_main(gen_dlrm_data.main, [str(a) for a in args] + ["--quiet"])
    assert exc.value.code == 0


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("batch", [None, 3])
def test_raw_round_trip(tmp_path, gz, batch):
    raw = write_raw(tmp_path / ("raw.pt.gz" if gz else "raw.pt"), make_raw(), gz=gz)
    out = tmp_path / "out"
    run_tool("--data", raw, "--out-dir", out, *(["--batch-size", batch] if batch else []))
    n = batch or 5
    cfg = json.loads((out / "table_configs.json").read_text())["tables"]
    ds = load_dataset(out)
    assert ds.batch_size == n and len(cfg) == 3
    for t, table in enumerate(LOOKUPS):
        every = [i for s in table for i in s]
        kept = table[:n]
        c = cfg[t]
        assert c["index"] == t and c["dim"] == 16
        assert c["row"] == (max(every) + 1 if every else 1)          # hash size over all samples
        assert c["pooling_factor"] == pytest.approx(sum(map(len, kept)) / n)
        assert [c[f"bin_{k}"] for k in range(17)] == pytest.approx(expected_bins(kept))
        idx, off = ds.lookups(t)
        assert [idx[off[b]:off[b + 1]].tolist() for b in range(n)] == kept
    assert not list(out.glob(".*")), "temporary files left behind"


def test_processing_api_and_aggregate():
    raw = dlrm.validate_raw(make_raw())
    data = dlrm.process_raw(raw, progress=False)
    by_lookups, by_rows = data.reuse_histograms()
    # distinct (table, row) pairs: table 0 rows {0:2, 3:3, 7:1, 9:1}, table 1 {5:7, 2:1, 40:1}
    rows = Counter()
    looks = Counter()
    for c in [2, 3, 1, 1, 7, 1, 1]:
        k = 0 if c <= 1 else math.ceil(math.log2(c))
        rows[k] += 1
        looks[k] += c
    assert by_rows.tolist() == pytest.approx([rows[k] / 7 for k in range(17)])
    assert by_lookups.tolist() == pytest.approx([looks[k] / 16 for k in range(17)])
    assert data.total_lookups == 16
    assert data.tables[2].bins == (0.0,) * 17 and data.tables[2].pooling_factor == 0.0
    # each table's bag-length CV: the spread of its per-sample lookup counts over their mean
    for t, table in zip(data.tables, LOOKUPS):
        lens = np.array([len(s) for s in table[:data.batch_size]], dtype=float)
        want = lens.std() / lens.mean() if lens.mean() > 0 else 0.0
        assert t.length_cv == pytest.approx(want, abs=1e-6)


def test_legacy_serialization(tmp_path):
    path = tmp_path / "legacy.pt"
    torch.save(make_raw(), path, _use_new_zipfile_serialization=False)
    raw = dlrm.load_raw(path)
    assert all(torch.equal(x, y) for x, y in zip(raw.to_tuple(), make_raw()))


def test_batch_size_too_large(tmp_path):
    raw = write_raw(tmp_path / "raw.pt", make_raw())
    with pytest.raises(ShardError, match="exceeds"):
        dlrm.process_raw(dlrm.load_raw(raw), batch_size=6, progress=False)


def test_dims_reproducible(tmp_path):
    raw = dlrm.validate_raw(make_raw([[[1]] * 4] * 40))
    draw = lambda seed: [t.dim for t in dlrm.process_raw(raw, dims=[4, 8, 16, 32], seed=seed,
                                                          progress=False).tables]
    a, b, c = draw(3), draw(3), draw(4)
    assert a == b and a != c and set(a) <= {4, 8, 16, 32} and len(set(a)) > 1
    # and through the script
    path = write_raw(tmp_path / "raw.pt", make_raw([[[1]] * 4] * 40))
    run_tool("--data", path, "--out-dir", tmp_path / "o", "--dims", "4,8,16,32", "--seed", 3)
    assert [t["dim"] for t in json.loads((tmp_path / "o" / "table_configs.json").read_text())["tables"]] == a


def test_synthetic_reproducible_and_diverse():
    a = dlrm.generate_synthetic_raw(64, 32, seed=5, progress=False)
    b = dlrm.generate_synthetic_raw(64, 32, seed=5, progress=False)
    c = dlrm.generate_synthetic_raw(64, 32, seed=6, progress=False)
    assert all(torch.equal(x, y) for x, y in zip(a.to_tuple(), b.to_tuple()))
    assert not torch.equal(a.lengths, c.lengths)
    assert a.lengths.shape == (64, 32) and a.offsets.numel() == 64 * 32 + 1
    specs = dlrm.synthetic_table_specs(64, seed=5)
    rows = [s.row for s in specs]
    assert math.log10(max(rows) / min(rows)) >= 3
    assert sum(s.pooling_factor == 0 for s in specs) >= 1
    assert np.mean([s.pooling_factor for s in specs]) == pytest.approx(dlrm.PUBLISHED_MEAN_POOLING, rel=0.01)
    data = dlrm.process_raw(a, progress=False)
    for spec, table in zip(specs, data.tables):
        assert table.row <= spec.row
        if spec.pooling_factor == 0:
            assert table.pooling_factor == 0 and table.row == 1
    # the default population holds the known table of the main file
    assert any(s.row == dlrm.KNOWN_TABLE_ROWS and s.pooling_factor == dlrm.KNOWN_TABLE_POOLING
               for s in dlrm.synthetic_table_specs(856, seed=0))


def test_synthetic_raw_out_round_trip(tmp_path):
    raw = dlrm.generate_synthetic_raw(12, 16, seed=1, progress=False)
    for name in ("syn.pt", "syn.pt.gz"):
        dlrm.save_raw(raw, tmp_path / name)
        back = dlrm.load_raw(tmp_path / name)
        assert all(torch.equal(x, y) for x, y in zip(raw.to_tuple(), back.to_tuple()))


@pytest.mark.parametrize("obj, match", [
    ((torch.zeros(3, dtype=torch.int64), torch.zeros(3, dtype=torch.int64)), "tuple"),
    ({"indices": torch.zeros(1)}, "tuple"),
    ((torch.zeros(4, dtype=torch.int64), torch.tensor([0, 2, 4]), torch.ones(2, 2, dtype=torch.int64)),
     "offsets has shape"),
    ((torch.zeros(4, dtype=torch.int64), torch.tensor([0, 1, 2, 3, 5]), torch.ones(2, 2, dtype=torch.int64)),
     "offsets run from"),
    ((torch.zeros(4, dtype=torch.int64), torch.tensor([0, 1, 2, 3, 4]), torch.ones(4, dtype=torch.int64)),
     "lengths must have shape"),
    ((torch.zeros(4), torch.tensor([0, 1, 2, 3, 4]), torch.ones(2, 2, dtype=torch.int64)), "dtype"),
])
def test_malformed_raw(tmp_path, obj, match):
    path = write_raw(tmp_path / "bad.pt", obj)
    with pytest.raises(ShardError, match=match):
        dlrm.load_raw(path)


def test_malformed_raw_content(tmp_path):
    # offsets that disagree with lengths, and a negative index: caught while processing
    idx, off, lens = make_raw()
    lens2 = lens.clone()
    lens2[0, 0], lens2[0, 1] = 1, 2
    with pytest.raises(ShardError, match="disagree"):
        dlrm.process_raw(dlrm.validate_raw((idx, off, lens2)), progress=False)
    idx2 = idx.clone()
    idx2[0] = -1
    with pytest.raises(ShardError, match="negative"):
        dlrm.process_raw(dlrm.validate_raw((idx2, off, lens)), progress=False)
    with pytest.raises(ShardError, match="not found"):
        dlrm.load_raw(tmp_path / "missing.pt.gz")
    (tmp_path / "junk.pt").write_bytes(b"not a torch file")
    with pytest.raises(ShardError, match="not a readable torch file"):
        dlrm.load_raw(tmp_path / "junk.pt")
    (tmp_path / "trunc.pt.gz").write_bytes(gzip.compress(b"x" * 100)[:20])
    with pytest.raises(ShardError):
        dlrm.load_raw(tmp_path / "trunc.pt.gz")


def test_script_end_to_end(tmp_path):
    out, raw = tmp_path / "ds", tmp_path / "raw.pt.gz"
    env = dict(os.environ, PYTHONPATH="")
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "gen_dlrm_data.py"), "--num-tables", "20",
                           "--batch-size", "128", "--out-dir", str(out), "--raw-out", str(raw), "--quiet"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "generating synthetic data" in proc.stdout and "reuse by lookups" in proc.stdout
    ds = load_dataset(out)
    assert ds.num_tables == 20 and ds.batch_size == 128
    # processing the kept raw file gives the same dataset
    again = dlrm.process_raw(dlrm.load_raw(raw), progress=False)
    assert [t.to_json() for t in again.tables] == [t.to_json() for t in ds.tables]
    bad = subprocess.run([sys.executable, str(ROOT / "tools" / "gen_dlrm_data.py"), "--data",
                          str(tmp_path / "nope.pt"), "--out-dir", str(out)],
                         capture_output=True, text=True, env=env, timeout=120)
    assert bad.returncode == 2 and bad.stderr.startswith("error: raw DLRM data not found")
