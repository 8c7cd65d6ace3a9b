#!/usr/bin/env python3
"""An adversarial probe of the commands: each attack runs a command as a subprocess, as a careless or hurried
user would, with every input checksummed before and after, and is classified by what came of it.

  python tools/probe_inputs.py                      # every attack (a few minutes on 2 cores)
  python tools/probe_inputs.py --classes outputs    # one class
  python tools/probe_inputs.py --smoke              # a handful, one per class (the test suite's)
  python tools/probe_inputs.py --list               # the attacks, without running them

Outcomes, worst first:

- ``hang``: still running after ``--timeout`` seconds (killed);
- ``lost input``: an input's bytes changed, or it vanished or became something else (but for the folder a
  resumed training or collection continues, where that is the attack's point);
- ``traceback``: a Python traceback, or an exit status other than 0, 2, 130 or 143;
- ``silent wrong result``: exit status 0 where the input was refused by the rules, or an output that does not
  say what the run did (each attack that must succeed checks its output);
- ``unclean error``: exit status 2 with more than the one line ``error: ...`` on stderr;
- ``false refusal``: a one-line error where the run should have succeeded;
- ``clean error``: exit status 2 and exactly one line ``error: ...`` (an attack that must be refused);
- ``correct run``: exit status 0 and the attack's own check of the output passed.

Attacks never aim at a real device file (a named pipe in the scratch folder stands for one: an output
written over ``/dev/full`` replaces it for everyone) and write only inside the scratch folder (``--keep``
keeps it). Classes: outputs (no output over an input, a device, another kind, an unwritable folder),
comparisons (records and checkpoints priced alike), ambiguity (a column, a key, a batch line twice;
statistics of another batch), bounds (device counts, memory, repeats, numbers), files (missing, empty,
binary, folders where files go), processes (two runs in one folder, SIGTERM). The report counts the
outcomes per class and names every attack that did not end clean.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from shardcore.cli.common import check_outputs, make_parser, run_main  # noqa: E402
from shardcore.errors import ShardError  # noqa: E402

GPU = ROOT / "data" / "gpu_measurements"
EMU_DS = GPU / "dlrm_b65536"
T50 = GPU / "tasks" / "dlrm_tasks_50_test.txt"
SHIPPED = [EMU_DS / "table_configs.json", T50, GPU / "h200_emulator.json"]   # repository inputs some attacks read
OUTCOMES = ("hang", "lost input", "traceback", "silent wrong result", "unclean error", "false refusal",
            "clean error", "correct run")
BAD = OUTCOMES[:6]
CLASSES = ("outputs", "comparisons", "ambiguity", "bounds", "files", "processes")
EMU = ["--oracle", "emulated:h200"]


@dataclass
class Attack:
    """One command run as an attack: ``argv`` after the script, ``{ws}`` standing for the scratch folder's
    inputs and ``{out}`` for this attack's own output folder; ``expect`` "error" (the rules refuse it) or
    "ok" (it must run, and ``check(ws, out, stdout)`` returns what is wrong with its output, or None)."""

    name: str
    klass: str
    script: str
    argv: list
    expect: str = "error"
    needs: tuple = ()
    setup: Callable | None = None
    check: Callable | None = None
    kind: str = "cmd"           # cmd | concurrent (a second run while the first holds its folder) | sigterm
    marker: str | None = None   # concurrent, sigterm: the file whose appearance says the first run is at work
    continues: str | None = None   # an input folder a run that must succeed continues (a resumed training's)
    timeout: float | None = None


# -- the scratch folder: inputs built on demand -------------------------------------------------------------
class Workspace:
    def __init__(self, path: Path, repo: Path = ROOT):
        self.path, self.repo = path, repo
        self.inputs = path / "in"
        self.inputs.mkdir(parents=True, exist_ok=True)
        self.built: set[str] = set()

    def env(self) -> dict:
        tmp = self.path / "tmp"
        tmp.mkdir(exist_ok=True)
        return {**os.environ, "PYTHONPATH": str(self.repo), "TMPDIR": str(tmp), "SHARDKIT_NUM_THREADS": "1"}

    def run(self, script: str, argv: list, timeout: float = 600) -> subprocess.CompletedProcess:
        proc = subprocess.run([sys.executable, str(self.repo / script), *map(str, argv)], cwd=self.path, env=self.env(),
                              capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise ShardError(f"probe set-up: {script} failed: {(proc.stderr or proc.stdout).strip()[-300:]}")
        return proc

    def need(self, what: str) -> None:
        if what in self.built:
            return
        getattr(self, f"_build_{what}")()
        self.built.add(what)

    def _build_base(self) -> None:
        import numpy as np
        import torch

        from shardcore.dataset import save_dataset
        from shardcore.tables import TableConfig

        rng = np.random.default_rng(0)
        tables, indices, offsets = [], [], []
        for i in range(20):
            row = int(10 ** rng.uniform(1, 5))
            lengths = rng.poisson(float(rng.choice([1.0, 3.0, 8.0])), size=16)
            off = np.concatenate([[0], np.cumsum(lengths)])
            tables.append(TableConfig(i, row, int(rng.choice([4, 8, 16])), float(lengths.mean())))
            indices.append(torch.from_numpy(rng.integers(0, row, size=int(off[-1]))))
            offsets.append(torch.from_numpy(off))
        save_dataset(self.inputs / "ds", tables, indices, offsets, 16)
        i = self.inputs
        (i / "tasks.txt").write_text("0,1,2,3,4\n5,6,7,8,9\n10,11,12\n")
        (i / "a_file").write_text("a plain file where a folder is expected\n")
        (i / "t.csv").write_text("name,rows,dim,pooling_factor\nuser,150000,16,1\nitem,90000,16,2\ncat,100,8,3\n"
                                 "brand,5000,8,1\nquery,20000,8,6\n")
        bins = ",".join(["0.6", "0.3"] + ["0.1"] + ["0"] * 14)
        (i / "t_stats.csv").write_text("# batch_size: 65536\nname,rows,dim,pooling_factor,"
                                       + ",".join(f"bin_{k}" for k in range(17)) + "\n"
                                       + "".join(f"t{k},{1000 * (k + 1)},8,{k % 4 + 1},{bins}\n" for k in range(6)))
        (i / "t.json").write_text(json.dumps({"tables": [{"name": f"j{k}", "row": 100 * (k + 1), "dim": 8,
                                                          "pooling_factor": 1.0 + k} for k in range(5)],
                                              "batch_size": 4096}))
        (i / "plan.json").write_text(json.dumps({"tables": [0, 1], "shardings": [
            {"type": "table_wise", "devices": [0]}, {"type": "table_wise", "devices": [1]}]}))
        (i / "shards.jsonl").write_text("".join((GPU / "h200_b65536_random_shards.jsonl").read_text()
                                                .splitlines(True)[:3]))
        data = i / "cost"
        data.mkdir()
        (data / "compute_costs.csv").write_text(
            "sample,table_ids,dims,rows,pooling_factors,fw_ms,bw_ms\n" + "".join(
                f"{k},{k % 5};{(k + 1) % 5},8;4,{100 + k};{50 + k},2.0;1.0,{1.0 + 0.1 * k},{2.0 + 0.2 * k}\n"
                for k in range(12)))
        from shardcore.oracles.cache import CostCache

        CostCache(i / "cache.sqlite").check_usable()

    def _build_records(self) -> None:
        common = [*EMU, "--data-dir", EMU_DS, "--task-path", T50, "--gpu-devices", "0,1,2,3", "--max-memory", 5,
                  "--quiet", "--max-tasks", 2]
        self.run("eval.py", [*common, "--alg", "lookup_greedy,size_greedy", "--out", self.inputs / "rec.jsonl"])
        self.run("eval.py", [*common, "--alg", "random", "--comm-bandwidth", 20, "--out", self.inputs / "rec_bw20.jsonl"])
        self.run("eval.py", [*common, "--alg", "random", "--emulator-fit", "full", "--out", self.inputs / "rec_full.jsonl"])
        self.run("eval.py", [*common, "--alg", "random", "--out", self.inputs / "rec_random.jsonl"])
        self.run("eval.py", [*common, "--alg", "random", "--batch-size", 4096, "--out", self.inputs / "rec_b4096.jsonl"])
        recs = [json.loads(x) for x in (self.inputs / "rec.jsonl").read_text().splitlines()]
        (self.inputs / "rec_old.jsonl").write_text("".join(   # as written before records carried their pricing
            json.dumps({k: v for k, v in r.items() if k != "pricing"}) + "\n" for r in recs))
        (self.inputs / "rec_bw20_old.jsonl").write_text("".join(
            json.dumps({k: v for k, v in json.loads(x).items() if k != "pricing"}) + "\n"
            for x in (self.inputs / "rec_bw20.jsonl").read_text().splitlines()))

    def _build_dreamshard(self) -> None:
        self.need("base")
        self.run("train_dreamshard.py", [
            "--data-dir", self.inputs / "ds", "--task-path", self.inputs / "tasks.txt", "--gpu-devices", "0,1", *EMU,
            "--out-dir", self.inputs / "dsrun", "--num-iterations", 1, "--max-memory", 5, "--bench-steps", 2,
            "--bench-training-steps", 2, "--rl-num-batches", 1, "--rl-batch-size", 2, "--curve-tasks", 0])

    def _build_autoshard(self) -> None:
        self.need("base")
        self.run("train_autoshard.py", [
            "--data-dir", self.inputs / "ds", "--task-path", self.inputs / "tasks.txt", "--gpu-devices", "0,1", *EMU,
            "--savedir", self.inputs / "asrun", "--xpid", "x", "--total-steps", 200, "--unroll-length", 10,
            "--batch-size", 2])

    def _build_comm(self) -> None:
        self.need("base")
        self.run("collect_comm_cost_data.py", [
            "--dataset_dir", self.inputs / "ds", "--gpu-devices", "0,1", *EMU, "--weights-precision", "fp16",
            "--max_dim", 16, "--T_range", "2,4", "--data_size", 3, "--out_dir", self.inputs / "comm"])

    # -- checksums of every input ------------------------------------------------------------------------------
    def snapshot(self) -> dict:
        out = {}
        for p in sorted(self.inputs.rglob("*")) + [Path(s) for s in SHIPPED]:
            rel = str(p.relative_to(self.inputs)) if p.is_relative_to(self.inputs) else str(p)
            if p.is_symlink():
                out[rel] = ("link", os.readlink(p))
            elif p.is_file():
                out[rel] = ("file", hashlib.sha256(p.read_bytes()).hexdigest(), p.read_bytes())
            elif p.is_dir():
                out[rel] = ("dir",)
            else:
                out[rel] = ("special",)
        return out

    def damage(self, before: dict) -> list[str]:
        """The inputs an attack changed (their names), and every input put back as it was."""
        after = self.snapshot()
        hurt = [k for k, v in before.items() if after.get(k, ("gone",))[:2] != v[:2]]
        for k in hurt:
            p = Path(k) if k.startswith("/") else self.inputs / k
            kind = before[k][0]
            if p.is_symlink() or p.is_file() or (p.exists() and not p.is_dir()):
                p.unlink()
            elif p.is_dir() and kind != "dir":
                shutil.rmtree(p)
            if kind == "file":
                p.parent.mkdir(parents=True, exist_ok=True)
                p.write_bytes(before[k][2])
            elif kind == "link":
                p.symlink_to(before[k][1])
            elif kind == "dir":
                p.mkdir(parents=True, exist_ok=True)
        for k in sorted(set(after) - set(before), key=len, reverse=True):   # what the attack added among them
            p = self.inputs / k
            if p.is_symlink() or p.is_file() or (p.exists() and not p.is_dir()):
                p.unlink()
            elif p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
        return hurt


# -- running and judging one attack -------------------------------------------------------------------------
def fill(argv: list, ws: Workspace, out: Path) -> list[str]:
    return [str(a).replace("{ws}", str(ws.inputs)).replace("{out}", str(out)) for a in argv]


def judge(attack: Attack, rc: int | None, stdout: str, stderr: str, hurt: list[str], problem: str | None) -> tuple:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    if rc is None:
        return "hang", f"still running after {attack.timeout} s"
    if hurt:
        return "lost input", "changed: " + ", ".join(hurt[:4])
    if "Traceback (most recent call last)" in stderr or rc not in (0, 2, 130, 143):
        return "traceback", (lines[-1] if lines else f"exit status {rc}")[:300]
    if problem:   # what the run left behind (a temporary folder, a first run that failed), or a wrong output
        return "silent wrong result", problem
    if rc == 0:
        if attack.expect == "error":
            return "silent wrong result", "exit 0; " + ((stdout.strip().splitlines() or [""])[-1])[:200]
        return "correct run", ""
    if rc == 2 and len(lines) == 1 and lines[0].startswith("error: "):
        return ("clean error" if attack.expect == "error" else "false refusal"), lines[0][:300]
    return "unclean error", " | ".join(lines[-3:])[:300]


def run_attack(attack: Attack, ws: Workspace, timeout: float) -> tuple[str, str, float]:
    for n in attack.needs:
        ws.need(n)
    out = ws.path / "out" / attack.name
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    if attack.setup is not None:
        attack.setup(ws, out)
    before = ws.snapshot()
    attack.timeout = attack.timeout or timeout
    cmd = [sys.executable, str(ws.repo / attack.script), *fill(attack.argv, ws, out)]
    t0 = time.perf_counter()
    problem = None
    if attack.kind == "cmd":
        try:
            proc = subprocess.run(cmd, cwd=out, env=ws.env(), capture_output=True, text=True, timeout=attack.timeout)
            rc, so, se = proc.returncode, proc.stdout, proc.stderr
        except subprocess.TimeoutExpired as exc:
            rc, so, se = None, str(exc.stdout or ""), str(exc.stderr or "")
    else:
        rc, so, se, problem = run_special(attack, cmd, ws, out)
    seconds = time.perf_counter() - t0
    if rc == 0 and attack.expect == "ok" and attack.check is not None and problem is None:
        problem = attack.check(ws, out, so)
    hurt = [h for h in ws.damage(before) if not (attack.continues and h.startswith(attack.continues + "/"))]
    if attack.kind == "sigterm" and rc == 143 and problem is None:
        rc = 2 if attack.expect == "error" else 0       # judged by what it left behind (problem)
        se = "error: stopped by SIGTERM\n"
    outcome, detail = judge(attack, rc, so, se, hurt, problem)
    return outcome, detail, seconds


def run_special(attack: Attack, cmd: list, ws: Workspace, out: Path) -> tuple:
    """``concurrent``: a first run holds its folder; the same command again must be refused in one line while
    the first still runs, and the first must end well. ``sigterm``: SIGTERM once the run has started its work;
    it must end in one line with nothing left in the temporary folder."""
    env = ws.env()
    first = subprocess.Popen(cmd, cwd=out, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        if attack.kind == "concurrent":
            deadline = time.monotonic() + 60
            lock = Path(fill([attack.marker], ws, out)[0])
            while time.monotonic() < deadline and first.poll() is None and not lock.exists():
                time.sleep(0.1)
            try:
                second = subprocess.run(cmd, cwd=out, env=env, capture_output=True, text=True, timeout=attack.timeout)
            except subprocess.TimeoutExpired:
                return None, "", "", None
            so1, se1 = first.communicate(timeout=attack.timeout)
            problem = None if first.returncode == 0 else f"the first run ended with {first.returncode}: {se1[-200:]}"
            return second.returncode, second.stdout, second.stderr, problem
        tmp = Path(env["TMPDIR"])
        deadline = time.monotonic() + (60 if attack.marker == "TMPDIR" else 8)
        while time.monotonic() < deadline and first.poll() is None and not (attack.marker == "TMPDIR" and any(tmp.iterdir())):
            time.sleep(0.05)
        time.sleep(0.5)
        first.send_signal(signal.SIGTERM)
        so, se = first.communicate(timeout=attack.timeout)
        left = sorted(p.name for p in tmp.iterdir())
        problem = f"left in the temporary folder: {', '.join(left)}" if left else None
        if first.returncode == 143 and se.strip().splitlines()[-1:] != ["error: stopped by SIGTERM"]:
            problem = problem or f"SIGTERM said: {se.strip()[-200:]}"
        return first.returncode, so, se, problem
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
        for p in Path(env["TMPDIR"]).iterdir():
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink()


# -- the attacks ----------------------------------------------------------------------------------------------
def fifo(name: str) -> Callable:
    """A named pipe in this attack's folder: stands for a device file, never a real one."""
    def setup(ws, out):
        os.mkfifo(out / name)
    return setup


def link(name: str, target: str, hard: bool = False) -> Callable:
    def setup(ws, out):
        src = Path(target.replace("{ws}", str(ws.inputs)))
        (os.link(src, out / name) if hard else (out / name).symlink_to(src))
    return setup


def json_check(path: str, test: Callable, what: str) -> Callable:
    def check(ws, out, stdout):
        p = Path(path.replace("{out}", str(out)).replace("{ws}", str(ws.inputs)))
        if not p.is_file():
            return f"{p.name} not written"
        try:
            obj = json.loads(p.read_text())
        except json.JSONDecodeError:
            return f"{p.name} is not JSON"
        return None if test(obj) else f"{p.name}: {what}"
    return check


def stdout_check(text: str) -> Callable:
    return lambda ws, out, stdout: None if text in stdout else f"the output does not say {text!r}"


def writers() -> list[tuple[str, str, list, list]]:
    """(name, script, argv with OUT for the output, needs) of every command that writes."""
    ds, tasks = "{ws}/ds", "{ws}/tasks.txt"
    ep = ["--task-path", tasks, "--data-dir", ds, "--gpu-devices", "0,1", "--max-memory", 5, "--plan-only", "--quiet"]
    return [
        ("eval-out", "eval.py", [*ep, "--out", "OUT"]),
        ("eval-export", "eval.py", [*ep, "--export-torchrec", "OUTDIR"]),
        ("simulator-out", "eval_simulator.py", ["--task-path", tasks, "--data-dir", ds, "--gpu-devices", "0,1",
                                                "--out", "OUT"]),
        ("plan-out", "plan.py", ["--tables", "{ws}/t.csv", "--ndevices", 2, "--out", "OUT"]),
        ("measure-out", "tools/measure_plan.py", ["--data-dir", ds, "--plan", "{ws}/plan.json", "--out", "OUT"]),
        ("measure-torchrec", "tools/measure_plan.py", ["--data-dir", ds, "--plan", "{ws}/plan.json", "--torchrec", "OUT"]),
        ("hot-tasks", "tools/gen_hot_tasks.py", ["--data-dir", EMU_DS, "--tasks", T50, "--out", "OUT"]),
        ("fit-shardkit", "tools/fit_shardkit_model.py", ["--data-dir", ds, "--cache-path", "{ws}/cache.sqlite",
                                                         "--out", "OUT"]),
        ("predict", "tools/predict_shard_costs.py", ["--shards", "{ws}/shards.jsonl", "--allow-wider-dims", "--out", "OUT"]),
        ("cpu-repeat", "tools/cpu_repeatability.py", ["--data-dir", ds, "--gpu-devices", "0,1", "--num-tables", 8,
                                                      "--out", "OUT"]),
        ("emu-accuracy", "tools/emulator_accuracy.py", ["--out", "OUT"]),
        ("fit-emulator", "tools/fit_gpu_emulator.py", ["--out", "OUT"]),
        ("bench-oracle", "tools/bench_oracle.py", ["--data-dir", ds, "--num-tables", 8, "--json", "OUT"]),
        ("gen-tasks", "tools/gen_tasks.py", ["--data-dir", ds, "--T", 3, "--num-train", 2, "--num-test", 2,
                                             "--out-dir", "OUTDIR"]),
        ("gen-dlrm", "tools/gen_dlrm_data.py", ["--synthetic", "--num-tables", 4, "--batch-size", 8, "--out-dir", "OUTDIR"]),
        ("train-autoshard", "train_autoshard.py", ["--data-dir", ds, "--task-path", tasks, "--gpu-devices", "0,1", *EMU,
                                                   "--total-steps", 20, "--savedir", "OUTDIR", "--xpid", "."]),
        ("train-dreamshard", "train_dreamshard.py", ["--data-dir", ds, "--task-path", tasks, "--gpu-devices", "0,1",
                                                     *EMU, "--num-iterations", 1, "--out-dir", "OUTDIR"]),
        ("train-neuroshard", "train_neuroshard.py", ["--dataset-dir", ds, "--gpu-devices", "0,1", *EMU,
                                                     "--skip-collection", "--out-dir", "OUTDIR"]),
        ("collect-compute", "collect_compute_cost_data.py", ["--dataset_dir", ds, *EMU, "--weights-precision", "fp16",
                                                             "--data_size", 2, "--out_dir", "OUTDIR"]),
        ("collect-comm", "collect_comm_cost_data.py", ["--dataset_dir", ds, "--gpu-devices", "0,1", *EMU,
                                                       "--weights-precision", "fp16", "--data_size", 2,
                                                       "--out_dir", "OUTDIR"]),
        ("train-compute-model", "train_compute_cost_model.py", ["--data_dir", "{ws}/cost", "--epochs", 1, "--quiet",
                                                               "--out_path", "OUT"]),
        ("train-comm-model", "train_comm_cost_model.py", ["--data_dir", "{ws}/cost", "--epochs", 1, "--quiet",
                                                         "--fw_out_path", "OUT"]),
        ("run-experiments", "tools/run_experiments.py", ["--scale", "tiny", *EMU, "--data-dir", EMU_DS, "--skip-train",
                                                         "--out-dir", "OUTDIR"]),
        ("bench-planning", "tools/bench_planning.py", ["--data-dir", ds, "--tables", 4, "--devices", 2,
                                                       "--out-dir", "OUTDIR"]),
        ("honest-margins", "tools/honest_margins.py", ["--force", "--max-tasks", 1, "--algs", "lookup_greedy,shardkit",
                                                       "--out-dir", "OUTDIR"]),
        ("train-anchors", "tools/train_anchors.py", ["--stages", "dreamshard", "--data-dir", EMU_DS, "--expected-test",
                                                     T50, "--out-dir", "OUTDIR"]),
        ("gpu-check-work", "tools/gpu_check.py", ["--work-dir", "OUTDIR"]),
        ("gpu-check-shards", "tools/gpu_check.py", ["--shards-out", "OUT"]),
    ]


def output_attacks() -> list[Attack]:
    """Every writer against: a pipe standing for a device, a file where its folder goes, one of its inputs
    (the same path, a symbolic link to it, a hard link)."""
    out = []
    for name, script, argv in writers():
        is_dir = "OUTDIR" in argv
        sub = lambda target: [target if a in ("OUT", "OUTDIR") else a for a in argv]   # noqa: E731
        out.append(Attack(f"{name}:device", "outputs", script, sub("{out}/dev"), setup=fifo("dev"), needs=("base",)))
        out.append(Attack(f"{name}:under-a-file", "outputs", script, sub("{ws}/a_file/x" if is_dir else "{ws}/a_file/x.json"),
                          needs=("base",)))
        victim = {"eval-out": "{ws}/tasks.txt", "eval-export": "{ws}/ds", "simulator-out": "{ws}/tasks.txt",
                  "plan-out": "{ws}/t.csv", "measure-out": "{ws}/plan.json", "measure-torchrec": "{ws}/plan.json",
                  "fit-shardkit": "{ws}/cache.sqlite", "predict": "{ws}/shards.jsonl",
                  "cpu-repeat": "{ws}/ds/data.pt", "bench-oracle": "{ws}/ds/table_configs.json",
                  "train-compute-model": "{ws}/cost/compute_costs.csv"}.get(name)
        if victim and not is_dir:
            out.append(Attack(f"{name}:over-its-input", "outputs", script, sub(victim), needs=("base",)))
            out.append(Attack(f"{name}:link-to-its-input", "outputs", script, sub("{out}/link"), needs=("base",),
                              setup=link("link", victim)))
            if name in ("eval-out", "plan-out", "measure-out", "predict"):
                out.append(Attack(f"{name}:hard-link-to-its-input", "outputs", script, sub("{out}/hard"),
                                  needs=("base",), setup=link("hard", victim, hard=True)))
    ds, tasks = "{ws}/ds", "{ws}/tasks.txt"
    out += [
        Attack("gen-tasks:beside-the-dataset", "outputs", "tools/gen_tasks.py",
               ["--data-dir", ds, "--T", 3, "--num-train", 2, "--num-test", 2, "--out-dir", ds], expect="ok",
               needs=("base",), check=lambda ws, o, so: None if (ws.inputs / "ds" / "train.txt").is_file() else "no train.txt"),
        Attack("gen-dlrm:over-its-raw-input", "outputs", "tools/gen_dlrm_data.py",
               ["--data", "{ws}/ds/data.pt", "--out-dir", ds], needs=("base",)),
        Attack("gen-dlrm:raw-out-is-its-data-pt", "outputs", "tools/gen_dlrm_data.py",
               ["--synthetic", "--num-tables", 4, "--batch-size", 8, "--out-dir", "{out}/g", "--raw-out", "{out}/g/data.pt"]),
        Attack("eval:out-is-the-cache", "outputs", "eval.py",
               ["--task-path", tasks, "--data-dir", ds, "--gpu-devices", "0,1", "--cache-path", "{ws}/cache.sqlite",
                "--out", "{ws}/cache.sqlite"], needs=("base",)),
        Attack("eval:out-replaces-a-database", "outputs", "eval.py",
               ["--task-path", tasks, "--data-dir", ds, "--gpu-devices", "0,1", "--plan-only", "--out", "{out}/c.sqlite"],
               needs=("base",), setup=lambda ws, o: shutil.copy(ws.inputs / "cache.sqlite", o / "c.sqlite")),
        Attack("eval:export-folder-holds-the-tasks", "outputs", "eval.py",
               ["--task-path", "{out}/exp/random/t.txt", "--data-dir", ds, "--gpu-devices", "0,1", "--plan-only",
                "--alg", "random", "--export-torchrec", "{out}/exp"], needs=("base",),
               setup=lambda ws, o: ((o / "exp" / "random").mkdir(parents=True),
                                    shutil.copy(ws.inputs / "tasks.txt", o / "exp" / "random" / "t.txt"))),
        Attack("eval:out-inside-the-dataset-folder", "outputs", "eval.py",
               ["--task-path", tasks, "--data-dir", ds, "--gpu-devices", "0,1", "--plan-only", "--out", "{ws}/ds/r.jsonl"],
               expect="ok", needs=("base",),
               check=lambda ws, o, so: None if (ws.inputs / "ds" / "r.jsonl").is_file() else "r.jsonl not written"),
        Attack("honest-margins:out-holds-its-anchors", "outputs", "tools/honest_margins.py",
               ["--force", "--out-dir", "{out}", "--anchors", "{out}/anchors"],
               setup=lambda ws, o: (o / "anchors").mkdir()),
        Attack("train-neuroshard:models-of-an-earlier-run", "outputs", "train_neuroshard.py",
               ["--dataset-dir", ds, "--gpu-devices", "0,1", *EMU, "--skip-collection", "--compute-data-dir", "{ws}/cost",
                "--out-dir", "{out}"], needs=("base",),
               setup=lambda ws, o: (o / "compute.pt").write_bytes(b"PK\x03\x04 an earlier run's model")),
        Attack("plan:torchrec-form-over-the-tables", "outputs", "plan.py",
               ["--tables", "{out}/p.torchrec.json", "--ndevices", 2, "--out", "{out}/p.json", "--torchrec"],
               needs=("base",), setup=lambda ws, o: shutil.copy(ws.inputs / "t.json", o / "p.torchrec.json")),
        Attack("out-empty-name", "outputs", "plan.py", ["--tables", "{ws}/t.csv", "--out", ""], needs=("base",)),
        Attack("plan:out-replaces-its-own-earlier-plan", "outputs", "plan.py",
               ["--tables", "{ws}/t.csv", "--ndevices", 2, "--out", "{out}/p.json"], expect="ok", needs=("base",),
               setup=lambda ws, o: (o / "p.json").write_text('{"an": "earlier plan"}\n'),
               check=json_check("{out}/p.json", lambda o: o.get("ndevices") == 2, "not the new plan")),
        Attack("eval:out-replaces-its-own-earlier-records", "outputs", "eval.py",
               ["--task-path", tasks, "--data-dir", ds, "--gpu-devices", "0,1", "--plan-only", "--out", "{out}/r.jsonl"],
               expect="ok", needs=("base",), setup=lambda ws, o: (o / "r.jsonl").write_text("old\n"),
               check=lambda ws, o, so: None if (o / "r.jsonl").read_text().count("\n") == 3 else "not 3 records"),
        Attack("gen-tasks:into-its-own-earlier-folder", "outputs", "tools/gen_tasks.py",
               ["--data-dir", ds, "--T", 3, "--num-train", 2, "--num-test", 2, "--out-dir", "{out}"], expect="ok",
               needs=("base",), setup=lambda ws, o: (o / "train.txt").write_text("0,1,2\n"),
               check=lambda ws, o, so: None if len((o / "train.txt").read_text().splitlines()) == 2 else "not rewritten"),
        Attack("link-output-to-elsewhere", "outputs", "plan.py",
               ["--tables", "{ws}/t.csv", "--ndevices", 2, "--out", "{out}/l.json"], expect="ok", needs=("base",),
               setup=lambda ws, o: ((o / "target.json").write_text("{}\n"), (o / "l.json").symlink_to(o / "target.json")),
               check=lambda ws, o, so: None if (o / "target.json").read_text() == "{}\n" and not (o / "l.json").is_symlink()
               else "the link's target was written through"),
        Attack("out-is-a-folder", "outputs", "plan.py", ["--tables", "{ws}/t.csv", "--out", "{out}"], needs=("base",)),
    ]
    return out


def comparison_attacks() -> list[Attack]:
    cmp, acc = "tools/shardkit_compare.py", "tools/shardkit_cost_accuracy.py"
    cat = lambda *names: (lambda ws, o: (o / "cat.jsonl").write_text(   # noqa: E731
        "".join((ws.inputs / n).read_text() for n in names)))
    out = [
        Attack("compare:exchange-models-mixed", "comparisons", cmp, ["{out}/cat.jsonl", "--alg", "random"],
               needs=("records",), setup=cat("rec.jsonl", "rec_bw20.jsonl")),
        Attack("compare:exchange-models-mixed-older-records", "comparisons", cmp, ["{out}/cat.jsonl", "--alg", "random"],
               needs=("records",), setup=cat("rec_old.jsonl", "rec_bw20_old.jsonl")),
        Attack("compare:emulator-fits-mixed", "comparisons", cmp, ["{out}/cat.jsonl", "--alg", "random"],
               needs=("records",), setup=cat("rec.jsonl", "rec_full.jsonl")),
        Attack("compare:batches-mixed", "comparisons", cmp, ["{out}/cat.jsonl", "--alg", "random"],
               needs=("records",), setup=cat("rec.jsonl", "rec_b4096.jsonl")),
        Attack("compare:two-runs-concatenated", "comparisons", cmp, ["{out}/cat.jsonl", "--alg", "lookup_greedy"],
               needs=("records",), setup=cat("rec.jsonl", "rec.jsonl")),
        Attack("compare:priced-alike", "comparisons", cmp, ["{out}/cat.jsonl", "--alg", "random"], expect="ok",
               needs=("records",), setup=cat("rec.jsonl", "rec_random.jsonl"), check=stdout_check("best anchor")),
        Attack("compare:anchor-is-the-alg", "comparisons", cmp, ["{ws}/rec.jsonl", "--alg", "size_greedy",
                                                                 "--anchors", "size_greedy"], needs=("records",)),
        Attack("compare:anchor-not-in-the-file", "comparisons", cmp, ["{ws}/rec.jsonl", "--alg", "size_greedy",
                                                                      "--anchors", "torchrec"], needs=("records",)),
        Attack("compare:alg-not-in-the-file", "comparisons", cmp, ["{ws}/rec.jsonl", "--alg", "shardkit"],
               needs=("records",)),
        Attack("compare:a-precision-edited", "comparisons", cmp, ["{out}/p.jsonl", "--alg", "lookup_greedy"],
               needs=("records",), setup=lambda ws, o: (o / "p.jsonl").write_text("".join(
                   json.dumps({**r, "pricing": {**r.get("pricing", {}), "precision": "fp32"}} if r["alg"] == "size_greedy" else r)
                   + "\n" for x in (ws.inputs / "rec.jsonl").read_text().splitlines() for r in [json.loads(x)]))),
        Attack("compare:hardware-edited", "comparisons", cmp, ["{out}/h.jsonl", "--alg", "lookup_greedy"],
               needs=("records",), setup=lambda ws, o: (o / "h.jsonl").write_text("".join(
                   json.dumps({**r, "hardware": "another card"} if k == 0 else r) + "\n"
                   for k, x in enumerate((ws.inputs / "rec.jsonl").read_text().splitlines()) for r in [json.loads(x)]))),
        Attack("cost-accuracy:exchange-models-mixed", "comparisons", acc,
               ["--records", "{ws}/rec.jsonl,{ws}/rec_bw20.jsonl", "--task-path", T50, "--data-dir", EMU_DS, *EMU],
               needs=("records",)),
        Attack("cost-accuracy:batches-mixed", "comparisons", acc,
               ["--records", "{ws}/rec.jsonl,{ws}/rec_b4096.jsonl", "--task-path", T50, "--data-dir", EMU_DS, *EMU],
               needs=("records",)),
    ]
    ds, tasks = "{ws}/ds", "{ws}/tasks.txt"
    dream = ["--data-dir", ds, "--task-path", tasks, "--out-dir", "{ws}/dsrun", "--resume", "--num-iterations", 2,
             "--max-memory", 5, "--bench-steps", 2, "--bench-training-steps", 2, "--rl-num-batches", 1,
             "--rl-batch-size", 2, "--curve-tasks", 0]
    for name, extra in (("exchange-bandwidth", ["--gpu-devices", "0,1", *EMU, "--comm-bandwidth", 50]),
                        ("exchange-latency", ["--gpu-devices", "0,1", *EMU, "--comm-latency", 500]),
                        ("emulator-fit", ["--gpu-devices", "0,1", *EMU, "--emulator-fit", "full"]),
                        ("device-count", ["--gpu-devices", "0,1,2", *EMU]),
                        ("batch", ["--gpu-devices", "0,1", *EMU, "--bench-batch-size", 8]),
                        ("oracle", ["--gpu-devices", "0,1", "--oracle", "measured", "--cache-path", "{out}/c.sqlite"]),
                        ("hyper-parameter", ["--gpu-devices", "0,1", *EMU, "--rl-lr", 0.01])):
        out.append(Attack(f"dreamshard-resume:{name}", "comparisons", "train_dreamshard.py", [*dream, *extra],
                          needs=("dreamshard",)))
    auto = ["--data-dir", ds, "--task-path", tasks, "--savedir", "{ws}/asrun", "--xpid", "x", "--resume",
            "--total-steps", 400, "--unroll-length", 10, "--batch-size", 2]
    for name, extra, expect in (("exchange-bandwidth", ["--gpu-devices", "0,1", *EMU, "--comm-bandwidth", 50], "error"),
                                ("emulator-fit", ["--gpu-devices", "0,1", *EMU, "--emulator-fit", "devices"], "error"),
                                ("precision", ["--gpu-devices", "0,1", *EMU, "--weights-precision", "fp32"], "error"),
                                ("device-count", ["--gpu-devices", "0,1,2", *EMU], "error"),
                                ("other-tasks", ["--gpu-devices", "0,1", *EMU, "--task-path", "{ws}/tasks2.txt"], "error"),
                                ("same-setting", ["--gpu-devices", "0,1", *EMU], "ok")):
        out.append(Attack(f"autoshard-resume:{name}", "comparisons", "train_autoshard.py", [*auto, *extra],
                          expect=expect, needs=("autoshard",), continues="asrun",
                          setup=lambda ws, o: (ws.inputs / "tasks2.txt").write_text("0,1,2\n3,4,5\n"),
                          check=stdout_check("resuming")))
    out.append(Attack("dreamshard-resume:same-setting", "comparisons", "train_dreamshard.py",
                      [*dream, "--gpu-devices", "0,1", *EMU], expect="ok", needs=("dreamshard",), continues="dsrun",
                      check=lambda ws, o, so: None if (ws.inputs / "dsrun" / "1.pt").is_file() else "1.pt not written"))
    comm = ["--dataset_dir", ds, "--gpu-devices", "0,1", *EMU, "--weights-precision", "fp16", "--max_dim", 16,
            "--T_range", "2,4", "--out_dir", "{ws}/comm"]
    out += [
        Attack("collect-comm:another-bandwidth", "comparisons", "collect_comm_cost_data.py",
               [*comm, "--data_size", 6, "--comm-bandwidth", 20], needs=("comm",)),
        Attack("collect-comm:another-latency", "comparisons", "collect_comm_cost_data.py",
               [*comm, "--data_size", 6, "--comm-latency", 0], needs=("comm",)),
        Attack("collect-comm:another-batch", "comparisons", "collect_comm_cost_data.py",
               [*comm, "--data_size", 6, "--batch-size", 4], needs=("comm",)),
        Attack("train-neuroshard:reuses-samples-at-another-bandwidth", "comparisons", "train_neuroshard.py",
               ["--dataset-dir", ds, "--gpu-devices", "0,1", *EMU, "--weights-precision", "fp16", "--max_dim", 16,
                "--T-range", "2,4", "--comm-samples", 3, "--compute-samples", 2, "--compute-data-dir", "{out}/compute",
                "--comm-data-dir", "{ws}/comm", "--comm-bandwidth", 20, "--out-dir", "{out}/m", "--quiet"],
               needs=("comm",)),
        Attack("train-comm-model:folders-of-two-exchanges", "comparisons", "train_comm_cost_model.py",
               ["--data_dir", "{ws}/comm,{out}/c20", "--epochs", 1, "--quiet", "--fw_out_path", "{out}/fw.pt",
                "--bw_out_path", "{out}/bw.pt"], needs=("comm",),
               setup=lambda ws, o: ws.run("collect_comm_cost_data.py", [
                   "--dataset_dir", ws.inputs / "ds", "--gpu-devices", "0,1", *EMU, "--weights-precision", "fp16",
                   "--max_dim", 16, "--T_range", "2,4", "--data_size", 3, "--comm-bandwidth", 20, "--out_dir", o / "c20"])),
        Attack("collect-comm:same-setting-tops-up", "comparisons", "collect_comm_cost_data.py", [*comm, "--data_size", 5],
               expect="ok", needs=("comm",), continues="comm", check=stdout_check("5 samples (2 added")),
        Attack("collect-comm:corrupt-meta", "comparisons", "collect_comm_cost_data.py",
               [*comm[:-1], "{out}/comm", "--data_size", 6], needs=("comm",),
               setup=lambda ws, o: (shutil.copytree(ws.inputs / "comm", o / "comm"),
                                    (o / "comm" / "meta.json").write_text("{not json"))),
    ]
    return out


def ambiguity_attacks() -> list[Attack]:
    head = "name,rows,dim,pooling_factor"
    csvs = {
        "two-name-columns": f"{head},name\na,10,8,1,b\n",
        "row-and-rows": "name,row,dim,pooling_factor,rows\na,10,8,1,20\n",
        "two-dim-columns": "name,rows,dim,pooling_factor,dim\na,10,8,1,16\n",
        "two-bin-columns": f"{head},bin_0,bin_0\na,10,8,1,0.5,0.7\n",
        "two-batch-lines": f"# batch_size: 65536\n# batch_size: 4096\n{head}\na,10,8,1\n",
        "two-batch-lines-equal": f"# batch_size: 4096\n# batch = 4096\n{head}\na,10,8,1\n",
        "a-table-named-twice": f"{head}\na,10,8,1\na,20,8,1\n",
        "more-cells-than-columns": f"{head}\na,10,8,1,7\n",
        "header-only": f"{head}\n",
        "missing-column": "name,rows,dim\na,10,8\n",
    }
    jsons = {
        "key-twice": '{"tables": [{"name": "a", "row": 10, "row": 20, "dim": 8, "pooling_factor": 1}]}',
        "row-and-rows": '{"tables": [{"name": "a", "row": 10, "rows": 20, "dim": 8, "pooling_factor": 1}]}',
        "batch-twice": '{"tables": [{"row": 10, "dim": 8, "pooling_factor": 1}], "batch_size": 8, "batch_size": 9}',
        "tables-twice": '{"tables": [{"row": 10, "dim": 8, "pooling_factor": 1}], "tables": []}',
        "a-table-named-twice": '{"tables": [{"name": "a", "row": 10, "dim": 8, "pooling_factor": 1}, '
                               '{"name": "a", "row": 20, "dim": 8, "pooling_factor": 1}]}',
    }
    out = []
    for name, text in csvs.items():
        out.append(Attack(f"tables-csv:{name}", "ambiguity", "plan.py", ["--tables", "{out}/t.csv", "--ndevices", 2],
                          setup=lambda ws, o, text=text: (o / "t.csv").write_text(text)))
    for name, text in jsons.items():
        out.append(Attack(f"tables-json:{name}", "ambiguity", "plan.py", ["--tables", "{out}/t.json", "--ndevices", 2],
                          setup=lambda ws, o, text=text: (o / "t.json").write_text(text)))
    ds = "{ws}/ds"
    configs_key_twice = lambda ws, o: (shutil.copytree(ws.inputs / "ds", o / "ds"), (o / "ds" / "table_configs.json")   # noqa: E731
                                       .write_text((ws.inputs / "ds" / "table_configs.json").read_text()
                                                   .replace('"dim":', '"dim": 4, "dim":', 1)))
    configs_index_twice = lambda ws, o: (shutil.copytree(ws.inputs / "ds", o / "ds"), (o / "ds" / "table_configs.json")   # noqa: E731
                                         .write_text((ws.inputs / "ds" / "table_configs.json").read_text()
                                                     .replace('"index": 1,', '"index": 0,', 1)))
    ep = ["--task-path", "{ws}/tasks.txt", "--gpu-devices", "0,1", "--plan-only", "--quiet"]
    out += [
        Attack("stats-of-another-batch", "ambiguity", "plan.py",
               ["--tables", "{ws}/t_stats.csv", "--ndevices", 2, *EMU, "--batch-size", 4096], needs=("base",)),
        Attack("stats-at-their-batch", "ambiguity", "plan.py",
               ["--tables", "{ws}/t_stats.csv", "--ndevices", 2, *EMU, "--batch-size", 65536, "--out", "{out}/p.json"],
               expect="ok", needs=("base",), check=json_check("{out}/p.json", lambda o: o.get("batch_size") == 65536,
                                                              "not priced at batch 65536")),
        Attack("no-stats-another-batch", "ambiguity", "plan.py",
               ["--tables", "{ws}/t.json", "--ndevices", 2, *EMU, "--batch-size", 512, "--out", "{out}/p.json"],
               expect="ok", needs=("base",), check=json_check("{out}/p.json", lambda o: o.get("batch_size") == 512,
                                                              "not priced at the batch asked")),
        Attack("dataset-configs-key-twice", "ambiguity", "eval.py", [*ep, "--data-dir", "{out}/ds"], needs=("base",),
               setup=configs_key_twice),
        Attack("dataset-configs-index-twice", "ambiguity", "eval.py", [*ep, "--data-dir", "{out}/ds"], needs=("base",),
               setup=configs_index_twice),
        Attack("record-key-twice", "ambiguity", "tools/shardkit_compare.py", ["{out}/r.jsonl"],
               setup=lambda ws, o: (o / "r.jsonl").write_text(
                   '{"alg": "a", "task": 0, "cost_ms": 1.0, "cost_ms": 9.0, "device_costs_ms": [[1, 0, 0, 0]]}\n')),
        Attack("plan-file-key-twice", "ambiguity", "tools/measure_plan.py",
               ["--data-dir", ds, "--plan", "{out}/p.json"], needs=("base",),
               setup=lambda ws, o: (o / "p.json").write_text('{"tables": [0], "tables": [1], "shardings": []}')),
        Attack("task-path-given-twice", "ambiguity", "eval.py",
               [*ep, "--data-dir", ds, "--task-path", "{ws}/tasks.txt"], expect="ok", needs=("base",),
               check=stdout_check("3 tasks from")),
    ]
    return out


def bounds_attacks() -> list[Attack]:
    t = "{ws}/t.csv"
    ep = ["--task-path", "{ws}/tasks.txt", "--data-dir", "{ws}/ds", "--max-memory", 5, "--plan-only", "--quiet"]
    big = "name,rows,dim,pooling_factor\n" + "".join(f"b{k},3000000,64,1\n" for k in range(3))
    out = [
        Attack("plan:ndevices-100000", "bounds", "plan.py", ["--tables", t, "--ndevices", 100000], needs=("base",)),
        Attack("plan:ndevices-4097", "bounds", "plan.py", ["--tables", t, "--ndevices", 4097], needs=("base",)),
        Attack("plan:ndevices-0", "bounds", "plan.py", ["--tables", t, "--ndevices", 0], needs=("base",)),
        Attack("plan:ndevices-minus-1", "bounds", "plan.py", ["--tables", t, "--ndevices", -1], needs=("base",)),
        Attack("plan:ndevices-4096", "bounds", "plan.py", ["--tables", t, "--ndevices", 4096, "--out", "{out}/p.json"],
               expect="ok", needs=("base",), check=json_check("{out}/p.json", lambda o: o.get("ndevices") == 4096,
                                                              "not a 4096-device plan")),
        Attack("plan:gpu-devices-0,1-ndevices-4", "bounds", "plan.py",
               ["--tables", t, "--gpu-devices", "0,1", "--ndevices", 4, "--out", "{out}/p.json"], expect="ok",
               needs=("base",), check=json_check("{out}/p.json", lambda o: o.get("ndevices") == 4 and "device_ids" not in o,
                                                 "not four plan devices without physical ids")),
        Attack("plan:gpu-devices-repeated", "bounds", "plan.py", ["--tables", t, "--gpu-devices", "0,0"], needs=("base",)),
        Attack("plan:gpu-devices-negative", "bounds", "plan.py", ["--tables", t, "--gpu-devices", "-1,2"], needs=("base",)),
        Attack("plan:ndevices-below-gpu-devices", "bounds", "plan.py", ["--tables", t, "--gpu-devices", "0,1,2",
                                                                         "--ndevices", 2], needs=("base",)),
        Attack("plan:tables-exceed-all-memory", "bounds", "plan.py",
               ["--tables", "{out}/big.csv", "--ndevices", 2, "--max-memory", 0.5, "--alg", "shardkit,torchrec",
                "--batch-size", 4096, *EMU], setup=lambda ws, o: (o / "big.csv").write_text(big), timeout=30),
        Attack("plan:a-table-exceeds-one-device", "bounds", "plan.py",
               ["--tables", "{out}/big.csv", "--ndevices", 4, "--max-memory", 0.3, "--alg", "lookup_greedy"],
               setup=lambda ws, o: (o / "big.csv").write_text(big)),
        Attack("plan:max-memory-nan", "bounds", "plan.py", ["--tables", t, "--max-memory", "nan"], needs=("base",)),
        Attack("plan:max-memory-zero", "bounds", "plan.py", ["--tables", t, "--max-memory", 0], needs=("base",)),
        Attack("plan:batch-2**31", "bounds", "plan.py", ["--tables", t, "--batch-size", 2 ** 31], needs=("base",)),
        Attack("plan:batch-0", "bounds", "plan.py", ["--tables", t, "--batch-size", 0], needs=("base",)),
        Attack("plan:comm-bandwidth-0", "bounds", "plan.py", ["--tables", t, "--comm-bandwidth", 0], needs=("base",)),
        Attack("plan:shardkit-time-negative", "bounds", "plan.py", ["--tables", t, "--alg", "shardkit",
                                                                     "--shardkit-time", -1], needs=("base",)),
        Attack("plan:seed-huge", "bounds", "plan.py", ["--tables", t, "--seed", 2 ** 40], needs=("base",)),
        Attack("eval:repeats-on-an-emulated-oracle", "bounds", "eval.py",
               [*EMU, "--data-dir", EMU_DS, "--task-path", T50, "--max-tasks", 1, "--repeats", 3, "--quiet"]),
        Attack("eval:repeats-with-plan-only", "bounds", "eval.py", [*ep, "--repeats", 2], needs=("base",)),
        Attack("eval:ndevices-5000", "bounds", "eval.py", [*ep, "--ndevices", 5000], needs=("base",)),
        Attack("eval:max-tasks-0", "bounds", "eval.py", [*ep, "--max-tasks", 0], needs=("base",)),
        Attack("eval:cap-below-every-task", "bounds", "eval.py", [*ep, "--max-memory", 1e-9, "--out", "{out}/r.jsonl"],
               expect="ok", needs=("base",),
               check=lambda ws, o, so: None if all(not json.loads(x)["feasible"] for x in
                                                   (o / "r.jsonl").read_text().splitlines()) else "a plan over the cap"),
        Attack("measure-plan:ndevices-100000", "bounds", "tools/measure_plan.py",
               ["--data-dir", "{ws}/ds", "--plan", "{ws}/plan.json", "--ndevices", 100000], needs=("base",)),
        Attack("bench-planning:devices-5000", "bounds", "tools/bench_planning.py",
               ["--data-dir", "{ws}/ds", "--devices", 5000, "--out-dir", "{out}"], needs=("base",)),
        Attack("train-neuroshard:comm-devices-5000", "bounds", "train_neuroshard.py",
               ["--dataset-dir", "{ws}/ds", "--comm-devices", "2,5000", "--out-dir", "{out}"], needs=("base",)),
        Attack("gen-tasks:T-larger-than-the-pool", "bounds", "tools/gen_tasks.py",
               ["--data-dir", "{ws}/ds", "--T", 500, "--out-dir", "{out}"], needs=("base",)),
        Attack("train-dreamshard:rl-batch-1", "bounds", "train_dreamshard.py", ["--rl-batch-size", 1]),
        Attack("train-autoshard:learning-rate-huge", "bounds", "train_autoshard.py", ["--learning-rate", 1e10]),
        Attack("compare:draws-0", "bounds", "tools/shardkit_compare.py", ["{ws}/rec.jsonl", "--draws", 0],
               needs=("records",)),
    ]
    return out


def file_attacks() -> list[Attack]:
    ep = ["--gpu-devices", "0,1", "--max-memory", 5, "--plan-only", "--quiet"]
    out = []
    for name, setup in (("missing", None), ("empty", lambda ws, o: (o / "x").write_text("")),
                        ("binary", lambda ws, o: (o / "x").write_bytes(b"\xff\xfe\x00\x01garbage")),
                        ("a-folder", lambda ws, o: (o / "x").mkdir()),
                        ("gzip-junk", lambda ws, o: (o / "x").write_bytes(b"\x1f\x8b\x08\x00junk"))):
        out += [
            Attack(f"tasks-{name}", "files", "eval.py", ["--task-path", "{out}/x", "--data-dir", "{ws}/ds", *ep],
                   needs=("base",), setup=setup),
            Attack(f"tables-csv-{name}", "files", "plan.py", ["--tables", "{out}/x"], setup=setup),
            Attack(f"plan-file-{name}", "files", "tools/measure_plan.py", ["--data-dir", "{ws}/ds", "--plan", "{out}/x"],
                   needs=("base",), setup=setup),
            Attack(f"records-{name}", "files", "tools/shardkit_compare.py", ["{out}/x"], setup=setup),
            Attack(f"checkpoint-{name}", "files", "eval.py", ["--task-path", "{ws}/tasks.txt", "--data-dir", "{ws}/ds",
                                                              *ep, "--alg", "{out}/x"], needs=("base",), setup=setup),
        ]
    out += [
        Attack("dataset-folder-missing", "files", "eval.py", ["--task-path", "{ws}/tasks.txt", "--data-dir", "{out}/no",
                                                              *ep], needs=("base",)),
        Attack("dataset-data-pt-truncated", "files", "eval.py",
               ["--task-path", "{ws}/tasks.txt", "--data-dir", "{out}/ds", "--gpu-devices", "0,1", "--max-memory", 5,
                "--quiet", "--cache-path", "{out}/c.sqlite"], needs=("base",),
               setup=lambda ws, o: (shutil.copytree(ws.inputs / "ds", o / "ds"),
                                    (o / "ds" / "data.pt").write_bytes((ws.inputs / "ds" / "data.pt").read_bytes()[:300]))),
        Attack("task-names-a-table-beyond-the-dataset", "files", "eval.py",
               ["--task-path", "{out}/t.txt", "--data-dir", "{ws}/ds", *ep], needs=("base",),
               setup=lambda ws, o: (o / "t.txt").write_text("0,1,99\n")),
        Attack("cache-is-a-text-file", "files", "eval.py",
               ["--task-path", "{ws}/tasks.txt", "--data-dir", "{ws}/ds", "--gpu-devices", "0,1", "--quiet",
                "--cache-path", "{ws}/tasks.txt"], needs=("base",)),
        Attack("emulator-params-nan", "files", "tools/emulator_accuracy.py", ["--params", "{out}/p.json"],
               setup=lambda ws, o: (o / "p.json").write_text(
                   (GPU / "h200_emulator.json").read_text().replace('"default_cv":', '"default_cv": NaN, "x":', 1))),
        Attack("predictions-fed-back", "files", "tools/predict_shard_costs.py",
               ["--shards", "{out}/pred.jsonl", "--allow-wider-dims", "--out", "{out}/again.jsonl"], needs=("base",),
               setup=lambda ws, o: ws.run("tools/predict_shard_costs.py", ["--shards", ws.inputs / "shards.jsonl",
                                                                          "--allow-wider-dims", "--out", o / "pred.jsonl"])),
        Attack("cost-csv-nan", "files", "train_compute_cost_model.py",
               ["--data_dir", "{out}/c.csv", "--out_path", "{out}/m.pt", "--epochs", 1, "--quiet"],
               setup=lambda ws, o: (o / "c.csv").write_text((ws.inputs / "cost" / "compute_costs.csv").read_text()
                                                            + "99,1;2,8;4,100;50,2.0;1.0,nan,2.0\n"), needs=("base",)),
        Attack("run-experiments:training-flag-typo", "files", "tools/run_experiments.py",
               ["--scale", "tiny", *EMU, "--data-dir", EMU_DS, "--out-dir", "{out}/x", "--autoshard-args=--totl-steps 5"]),
        Attack("run-experiments:unbalanced-quote", "files", "tools/run_experiments.py",
               ["--scale", "tiny", *EMU, "--data-dir", EMU_DS, "--out-dir", "{out}/x", "--dreamshard-args=--seed '3"]),
    ]
    return out


def process_attacks() -> list[Attack]:
    ds, tasks = "{ws}/ds", "{ws}/tasks.txt"
    a = Attack("two-autoshard-runs-one-folder", "processes", "train_autoshard.py",
               ["--data-dir", ds, "--task-path", tasks, "--gpu-devices", "0,1", *EMU, "--total-steps", 10 ** 6,
                "--time-limit", 0.25, "--savedir", "{out}/as", "--xpid", "x"], kind="concurrent", needs=("base",))
    a.marker = "{out}/as/x/.shardkit.lock"
    d = Attack("two-dreamshard-runs-one-folder", "processes", "train_dreamshard.py",
               ["--data-dir", ds, "--task-path", tasks, "--gpu-devices", "0,1", *EMU, "--num-iterations", 4,
                "--max-memory", 5, "--bench-steps", 2, "--bench-training-steps", 2, "--rl-num-batches", 1,
                "--rl-batch-size", 2, "--curve-tasks", 0, "--out-dir", "{out}/ds"], kind="concurrent", needs=("base",),
               timeout=300)
    d.marker = "{out}/ds/.shardkit.lock"
    rows = "".join(f"t{i},{1000 * (i + 1)},{(4, 8, 16, 64)[i % 4]},{1 + i % 5}\n" for i in range(200))
    return [a, d,
            Attack("sigterm-plan-while-pricing", "processes", "plan.py",
                   ["--tables", "{out}/t.csv", "--ndevices", 8, *EMU, "--batch-size", 4096, "--alg", "shardkit",
                    "--shardkit-time", 60], kind="sigterm", marker="TMPDIR",
                   setup=lambda ws, o: (o / "t.csv").write_text("name,rows,dim,pooling_factor\n" + rows)),
            Attack("sigterm-eval-while-planning", "processes", "eval.py",
                   [*EMU, "--data-dir", EMU_DS, "--task-path", T50, "--alg", "shardkit", "--shardkit-time", 30,
                    "--quiet", "--out", "{out}/r.jsonl"], kind="sigterm")]


def all_attacks() -> list[Attack]:
    return output_attacks() + comparison_attacks() + ambiguity_attacks() + bounds_attacks() + file_attacks() \
        + process_attacks()


SMOKE = ("plan-out:device", "plan-out:over-its-input", "tables-csv:two-name-columns", "plan:ndevices-100000",
         "plan:gpu-devices-0,1-ndevices-4", "records-empty")


def build_parser():
    p = make_parser(__doc__.split("\n\n")[0])
    p.add_argument("--classes", default=None, metavar="C,C", help=f"only these classes ({', '.join(CLASSES)})")
    p.add_argument("--only", default=None, metavar="NAME,NAME", help="only the attacks of these names")
    p.add_argument("--smoke", action="store_true", help=f"only a handful: {', '.join(SMOKE)}")
    p.add_argument("--timeout", type=float, default=120.0, metavar="S",
                   help="seconds an attack may run before it counts as a hang (default 120)")
    p.add_argument("--list", action="store_true", help="list the attacks and stop")
    p.add_argument("--keep", default=None, metavar="DIR", help="build the scratch folder here and keep it")
    p.add_argument("--out", default=None, metavar="FILE.json", help="also write every attack's outcome as JSON")
    p.add_argument("--repo", default=str(ROOT), metavar="DIR",
                   help="run the commands of this checkout (default this one's; another, e.g. before a change, to "
                        "compare; the fixtures are built with it too)")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    attacks = all_attacks()
    if args.classes:
        want = {c.strip() for c in args.classes.split(",")}
        unknown = want - set(CLASSES)
        if unknown:
            raise ShardError(f"--classes: unknown class {sorted(unknown)[0]!r} ({', '.join(CLASSES)})")
        attacks = [a for a in attacks if a.klass in want]
    names = set(SMOKE) if args.smoke else {n.strip() for n in args.only.split(",")} if args.only else None
    if names is not None:
        missing = names - {a.name for a in attacks}
        if missing:
            raise ShardError(f"no attack named {sorted(missing)[0]!r} (--list names them)")
        attacks = [a for a in attacks if a.name in names]
    if args.list:
        for a in attacks:
            print(f"{a.klass:12s} {a.expect:5s} {a.name}")
        print(f"{len(attacks)} attacks")
        return 0
    check_outputs(args, {"--out": args.out, "--keep": args.keep}, dirs=["--keep"])
    scratch = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="probe-"))
    if not (Path(args.repo) / "eval.py").is_file():
        raise ShardError(f"--repo {args.repo}: not a shardkit checkout (no eval.py)")
    ws = Workspace(scratch, Path(args.repo).resolve())
    results = []
    try:
        for k, a in enumerate(attacks, 1):
            try:
                outcome, detail, seconds = run_attack(a, ws, args.timeout)
            except (ShardError, OSError, subprocess.SubprocessError) as exc:   # the attack's own set-up failed
                outcome, detail, seconds = "not run", f"set-up: {exc}", 0.0
            results.append({"name": a.name, "class": a.klass, "expect": a.expect, "outcome": outcome,
                            "detail": detail, "seconds": round(seconds, 2)})
            mark = "  " if outcome in ("clean error", "correct run") else "!!"
            print(f"{mark} [{k}/{len(attacks)}] {a.klass:11s} {a.name}: {outcome}" + (f" ({detail})" if mark == "!!" else ""),
                  flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)
    print()
    print(report(results))
    if args.out:
        from shardcore.io import write_json

        write_json(args.out, results)
    return 1 if any(r["outcome"] in (*BAD, "not run") for r in results) else 0


def report(results: list[dict]) -> str:
    """The counts per class and outcome, and every attack that did not end clean."""
    lines = ["| class | attacks | " + " | ".join(OUTCOMES) + " | not run |", "|---" * (len(OUTCOMES) + 3) + "|"]
    for klass in CLASSES + ("all",):
        rows = [r for r in results if klass in ("all", r["class"])]
        if rows:
            lines.append(f"| {klass} | {len(rows)} | " + " | ".join(str(sum(r['outcome'] == o for r in rows))
                                                                   for o in (*OUTCOMES, "not run")) + " |")
    bad = [r for r in results if r["outcome"] in (*BAD, "not run")]
    lines += [f"- {r['outcome']}: {r['name']}: {r['detail']}" for r in bad]
    return "\n".join(lines)


if __name__ == "__main__":
    run_main(main)
