"""Training or loading the learned methods, as each declares it in the method registry.

A method's registry entry (:class:`shardcore.registry.MethodSpec`) says which script trains it, with
which arguments and flags per scale, and where its checkpoint ends up; this module runs that script
as a supervised subprocess (log in ``<out-dir>/logs/``), reuses a finished checkpoint, keeps the
newest checkpoint of a training stopped at its time limit, and turns every other way of ending
without a model into a note.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from shardcore.registry import MethodSpec, TrainContext

from .config import ExperimentConfig, TaskSetDef
from .procs import run_logged, tail


@dataclass
class LearnedModel:
    method: str
    ndevices: int                 # device count it was trained for (0: given by the user, any)
    checkpoint: str
    source: str                   # "given", "existing", "trained", "partial"
    train_set: str | None = None
    train_seconds: float | None = None
    log: str | None = None
    note: str = ""


def method_dir(models_dir: str | os.PathLike, method: str, ndevices: int) -> Path:
    return Path(models_dir) / f"{method}_{ndevices}dev"


def model_checkpoint(spec: MethodSpec, folder: str | os.PathLike) -> Path | None:
    """The checkpoint to evaluate from ``folder``: the spec's ``selected`` file where the training wrote
    one (DreamShard's best.pt), else ``find_checkpoint`` (which also says how far a training got)."""
    if spec.selected is not None and (Path(folder) / spec.selected).is_file():
        return Path(folder) / spec.selected
    return spec.find_checkpoint(folder)


def oracle_flags(cfg: ExperimentConfig) -> list[str]:
    """The hardware oracle's flags of this run, as eval.py spells them."""
    out = ["--optimizer", cfg.optimizer]
    if cfg.batch_size is not None:
        out += ["--batch-size", str(cfg.batch_size)]
    if cfg.bench_iters is not None:
        out += ["--bench-iters", str(cfg.bench_iters)]
    if cfg.warmup_iters is not None:
        out += ["--warmup-iters", str(cfg.warmup_iters)]
    if cfg.comm_iters is not None:
        out += ["--comm-iters", str(cfg.comm_iters)]
    if cfg.cache_path:
        out += ["--cache-path", os.path.abspath(cfg.cache_path)]
    if cfg.no_cache:
        out.append("--no-cache")
    out += ["--timeout", f"{cfg.timeout:g}"]
    if cfg.oracle != "measured":
        out += ["--oracle", cfg.oracle]
    if cfg.comm_bandwidth is not None:
        out += ["--comm-bandwidth", f"{cfg.comm_bandwidth:g}"]
    if cfg.comm_latency is not None:
        out += ["--comm-latency", f"{cfg.comm_latency:g}"]
    for flag in ("devices_per_host", "inter_host_bandwidth", "inter_host_latency"):
        if getattr(cfg, flag) is not None:
            out += ["--" + flag.replace("_", "-"), f"{getattr(cfg, flag):g}"]
    return out


def train_flags(cfg: ExperimentConfig, spec: MethodSpec) -> list[str]:
    """The scale's flags for this method, then the user's ``--<method>-args``."""
    return list(spec.scale_flags.get(cfg.scale, ())) + shlex.split(cfg.train_args.get(spec.name) or "")


def planned_device_counts(cfg: ExperimentConfig) -> tuple[int, ...]:
    """Every device count the run's sets plan for (a model trained once serves them all)."""
    return tuple(sorted({ts.ndevices for ts in cfg.task_sets} | {ts.ndevices for ts in cfg.train_sets}))


def train_command(cfg: ExperimentConfig, spec: MethodSpec, train_set: TaskSetDef, train_path: Path,
                  folder: Path) -> list[str]:
    """The training script's command line (a subprocess of this interpreter)."""
    ctx = TrainContext(task_path=train_path, data_dir=os.path.abspath(cfg.data_dir), ndevices=train_set.ndevices,
                       max_memory=cfg.max_memory, precision=cfg.precision, seed=cfg.seed, folder=folder,
                       oracle_flags=tuple(oracle_flags(cfg)), device_counts=planned_device_counts(cfg))
    return [sys.executable, str(spec.train_script)] + spec.train_args(ctx) + train_flags(cfg, spec)


def prepare_learned(cfg: ExperimentConfig, spec: MethodSpec, train_paths: dict, notes: list[str],
                    echo: bool) -> dict[int, LearnedModel]:
    """Models of one method keyed by device count (key 0: one model for every set)."""
    method = spec.name
    given = cfg.model_paths.get(method)
    if given:
        return {0: LearnedModel(method, 0, str(given), "given", note=f"given with --{method}-model")}
    models: dict[int, LearnedModel] = {}
    for ts in cfg.train_sets:
        if ts.ndevices in models:
            continue
        folder = method_dir(cfg.models_dir, method, ts.ndevices)
        ckpt = spec.find_checkpoint(folder)
        complete = ckpt is not None and spec.is_final(ckpt, train_flags(cfg, spec))
        stale = spec.stale(model_checkpoint(spec, folder), planned_device_counts(cfg)) \
            if complete and spec.stale is not None and not cfg.retrain else None
        if stale and not cfg.skip_train:
            print(f"{method}: the checkpoint in {folder} {stale}: training again")
            notes.append(f"{method}: trained again: the checkpoint of an earlier run {stale}")
            complete = False
            shutil.rmtree(folder)
        elif stale:
            notes.append(f"{method}: the checkpoint used {stale} (--skip-train kept it)")
        if complete and not cfg.retrain:
            models[ts.ndevices] = LearnedModel(method, ts.ndevices, str(model_checkpoint(spec, folder)), "existing",
                                               ts.name, note="reused from an earlier run (--retrain trains again)")
            continue
        if cfg.skip_train:
            if ckpt is not None and not cfg.retrain:
                models[ts.ndevices] = LearnedModel(method, ts.ndevices, str(model_checkpoint(spec, folder)), "partial",
                                                   ts.name, note="the checkpoint an unfinished training left "
                                                                 "(--skip-train)")
            else:
                notes.append(f"{method}: skipped for {ts.ndevices}-device sets: no checkpoint in {folder} "
                             f"and --skip-train")
            continue
        if importlib.util.find_spec(method) is None:
            notes.append(f"{method}: skipped: the {method} package is not in this installation")
            return {}
        if not spec.train_script.is_file():
            notes.append(f"{method}: skipped: its training script {spec.train_script.name} is missing")
            return {}
        if cfg.retrain and folder.is_dir():
            shutil.rmtree(folder)
        folder.mkdir(parents=True, exist_ok=True)
        cmd = train_command(cfg, spec, ts, train_paths[ts], folder)
        log = Path(cfg.out_dir) / "logs" / f"train_{method}_{ts.ndevices}dev.log"
        what = "tasks of every table" if spec.every_table_tasks else "train split"
        print(f"training {method} on {ts.name} ({what}, {cfg.num_train} tasks); log: {log}")
        rc, seconds = run_logged(cmd, log, cfg.train_timeout_s, echo)
        ckpt = model_checkpoint(spec, folder)
        if rc == 0 and ckpt is not None:
            models[ts.ndevices] = LearnedModel(method, ts.ndevices, str(ckpt), "trained", ts.name, seconds, str(log))
            print(f"{method}: trained in {seconds:.0f} s -> {ckpt}")
        elif rc is None and ckpt is not None:
            models[ts.ndevices] = LearnedModel(
                method, ts.ndevices, str(ckpt), "partial", ts.name, seconds, str(log),
                note=f"training stopped at the {cfg.train_timeout_s:g} s limit; the checkpoint it left is used")
            print(f"{method}: training stopped at the time limit; using {ckpt}")
        else:
            why = (f"training stopped at the {cfg.train_timeout_s:g} s limit without a checkpoint" if rc is None
                   else f"training failed (exit status {rc}): {tail(log)}")
            notes.append(f"{method}: skipped for {ts.ndevices}-device sets: {why} (log: {log})")
            print(f"{method}: {why}", file=sys.stderr)
    return models


def model_for(models: dict[int, LearnedModel], ndevices: int) -> LearnedModel | None:
    """The model trained for this device count, else the one given, else the first trained."""
    if not models:
        return None
    return models.get(ndevices) or models.get(0) or models[sorted(models)[0]]
