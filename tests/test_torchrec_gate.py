"""`make test` sets SHARDKIT_REQUIRE_TORCHREC=1: there the TorchRec tests fail, with the way to install
it, when TorchRec cannot be imported; elsewhere they skip. TorchRec is hidden here by an import hook."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HIDE = """import sys
class _HideTorchRec:
    def find_spec(self, name, path=None, target=None):
        if name == "torchrec" or name.startswith("torchrec."):
            raise ImportError("torchrec hidden by the test")
sys.meta_path.insert(0, _HideTorchRec())
"""


def run_torchrec_tests(tmp_path, require: bool) -> subprocess.CompletedProcess:
    (tmp_path / "sitecustomize.py").write_text(HIDE)
    env = {k: v for k, v in os.environ.items() if k != "SHARDKIT_REQUIRE_TORCHREC"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(tmp_path), env.get("PYTHONPATH"), ROOT) if p)
    if require:
        env["SHARDKIT_REQUIRE_TORCHREC"] = "1"
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs",
                           os.path.join(ROOT, "tests", "test_torchrec.py")],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("require", [True, False])
def test_missing_torchrec_fails_under_make_test_and_skips_elsewhere(tmp_path, require):
    proc = run_torchrec_tests(tmp_path, require)
    out = proc.stdout + proc.stderr
    assert "torchrec hidden by the test" in out, out[-2000:]
    if require:
        assert proc.returncode != 0 and "SHARDKIT_REQUIRE_TORCHREC=1" in out and "pip install" in out, out[-2000:]
    else:
        assert proc.returncode == 5 and "1 skipped" in out, out[-2000:]   # 5: no test collected, all skipped
