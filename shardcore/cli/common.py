"""Shared command-line plumbing: common flags and the one-line error convention."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Callable, Sequence

from shardcore.argtypes import MAX_DEVICES, device_count, int_list, positive_float
from shardcore.config import Config, _dest, _flags, flag_fields
from shardcore.oracles.setting import DEFAULT_TIMEOUT_S
from shardcore.errors import ShardError
from shardcore.processes import exit_now, unwind_on_sigterm
from shardcore.tables import PRECISION_BYTES
from shardcore.topology import DEFAULT_MAX_MEMORY_GB


def run_main(main: Callable[[Sequence[str] | None], int | None], argv: Sequence[str] | None = None) -> None:
    """Run a script's ``main``; a :class:`ShardError` prints ``error: <message>`` and exits 2,
    Ctrl-C exits 130 without a traceback, SIGTERM 143 (raised as :class:`~shardcore.errors.Terminated`, it
    unwinds as Ctrl-C does: ``finally`` blocks run, workers stop, locks and temporary folders go).

    The script's own torch work (planning, training small networks) runs on one thread
    (``SHARDKIT_NUM_THREADS`` overrides), and so does numpy's OpenBLAS (:func:`limit_blas_threads`):
    these tensors are tiny, and on a busy machine idle OpenMP threads spinning against other processes
    made RL training ~60x slower with 2 threads than with 1.
    The benchmark's workers pin their own threads. Where torch is not imported yet, the count is set
    the moment it is (:class:`_ThreadsOnImport`), so that ``--help`` and a bad flag answer without the
    2 s of importing torch. Where ``main`` is the running script's own (``python eval.py``: its module is
    ``__main__``, its arguments ``sys.argv``), the process then ends by :func:`~shardcore.processes.exit_now`,
    which skips the 0.5-0.9 s of CPU that Python's teardown of torch costs; called from other code
    (tests, entry points, an explicit ``argv``) it raises ``SystemExit``, as a function should."""
    threads = int(os.environ.get("SHARDKIT_NUM_THREADS", "1"))
    limit_blas_threads(threads)
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(threads)
    elif not any(isinstance(f, _ThreadsOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _ThreadsOnImport(threads))
    try:
        with unwind_on_sigterm():   # SIGTERM unwinds like Ctrl-C: workers stopped, locks and temporary files gone
            code = main(argv) or 0
    except ShardError as exc:
        print(f"error: {exc}", file=sys.stderr)
        code = 2
    except KeyboardInterrupt as exc:
        from shardcore.errors import Terminated

        if isinstance(exc, Terminated):
            hint = (" (under torchrun, a host's agent stops all its ranks when one of them fails; see the other "
                    "ranks' output)" if "TORCHELASTIC_RUN_ID" in os.environ else "")
            print(f"error: stopped by SIGTERM{hint}", file=sys.stderr)
            code = 143
        else:
            print("interrupted", file=sys.stderr)
            code = 130
    if argv is None and getattr(main, "__module__", None) == "__main__":   # the script is the process
        if not isinstance(code, int):   # as sys.exit: any other object is printed, status 1
            print(code, file=sys.stderr)
            code = 1
        exit_now(code)
    sys.exit(code)


#: the thread-count setters of the BLAS libraries numpy may have loaded (scipy-openblas, OpenBLAS)
_BLAS_SETTERS = ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads",
                 "openblas_set_num_threads64_", "openblas_set_num_threads")


def limit_blas_threads(threads: int) -> list[str]:
    """Set the OpenBLAS that numpy loaded (already, by the time a script's ``main`` runs) to ``threads``
    threads, unless ``OPENBLAS_NUM_THREADS`` says otherwise; the paths of the libraries set (none where
    there is no OpenBLAS or no ``/proc``). Like torch's threads, and for the same reason: the emulated
    oracle's held-out refits are small least-squares problems, and on this 2-core machine two processes
    with OpenBLAS's default two threads each spun against each other, 40 refits taking 8.9 s instead of
    1.5-1.8 s with one thread each (1.6 s alone, 2.1-2.3 s alone with two). The environment is left alone."""
    if "OPENBLAS_NUM_THREADS" in os.environ:
        return []
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return []
    import ctypes

    done = []
    paths = {line.split()[-1] for line in maps.splitlines() if "openblas" in line.lower()}
    for path in sorted(p for p in paths if p.startswith("/")):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        setter = next((getattr(lib, n) for n in _BLAS_SETTERS if hasattr(lib, n)), None)
        if setter is not None:
            setter(ctypes.c_int(threads))
            done.append(path)
    return done


class _ThreadsOnImport:
    """A meta-path finder that, when torch is first imported, runs its module and then
    ``torch.set_num_threads(threads)`` (and leaves ``sys.meta_path``): the same as importing torch
    first and setting its threads, without importing it where it is not needed."""

    def __init__(self, threads: int):
        self.threads = threads

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        import importlib.util

        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
            run = spec.loader.exec_module

            def exec_module(module, run=run, threads=self.threads):
                run(module)
                module.set_num_threads(threads)

            spec.loader.exec_module = exec_module
        return spec


class ArgumentParser(argparse.ArgumentParser):
    """An ``argparse.ArgumentParser`` whose errors follow the house rule: one line
    ``error: <prog>: <message> (see --help)`` on stderr and exit status 2, no usage block."""

    def error(self, message: str):  # noqa: D401 - argparse's hook
        text = " ".join(str(message).split())
        self.exit(2, f"error: {self.prog}: {text} (see --help)\n")

    def parse_known_args(self, args=None, namespace=None):
        ns, rest = super().parse_known_args(args, namespace)
        default = getattr(ns, "_default_task_path", None)
        if default is not None and getattr(ns, "task_path", None) == default:
            ns.task_path = tasks_beside_dataset(default, getattr(ns, "data_dir", None))
        return ns, rest


def tasks_beside_dataset(default: str, data_dir: str | None) -> str:
    """The task file a script uses when ``--task-path`` is not given: its default, or, when that does
    not exist, the file of the same name (``train.txt`` / ``test.txt``) that ``tools/gen_dlrm_data.py``
    (its task flags, the original layout) writes beside the dataset in ``--data-dir``; a note says so."""
    if os.path.exists(default) or not data_dir:
        return default
    beside = os.path.join(data_dir, os.path.basename(default))
    if os.path.isfile(beside):
        print(f"note: --task-path not given and {default} does not exist: using {beside}, the tasks written "
              "beside the dataset", file=sys.stderr)
        return beside
    return default


def make_parser(description: str | None = None, **kwargs) -> ArgumentParser:
    """The scripts' parser: :class:`ArgumentParser` with the raw description layout by default."""
    kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
    return ArgumentParser(description=description, **kwargs)


_INPUT_FLAGS = (("task_path", "--task-path"), ("tables", "--tables"), ("checkpoint", "--checkpoint"),
                ("shards", "--shards"), ("table_configs", "--table-configs"), ("data", "--data"),
                ("tasks", "--tasks"), ("params", "--params"), ("exclude_tasks", "--exclude-tasks"),
                ("results", "--results"), ("records", "--records"), ("model", "--model"), ("plan", "--plan"),
                ("expected_test", "--expected-test"), ("repeat", "--repeat"), ("anchors", "--anchors"),
                ("files", "FILE"))
_LIST_INPUTS = ("data", "exclude_tasks", "records")   # comma-separated lists of files


def command_inputs(args: argparse.Namespace) -> dict:
    """The files a script's flags name as inputs (flag -> path), for :func:`check_outputs`: the task
    file, the dataset's table configs and ``data.pt``, the measurement cache (where a measured oracle may
    write it), every model file (``--*-model``), plan and record files, and every ``--alg`` entry that is
    a file."""
    from shardcore.oracles.cache import DEFAULT_CACHE_PATH

    inputs: dict = {}
    named = list(_INPUT_FLAGS) + [(d, "--" + d.replace("_", "-")) for d in sorted(vars(args)) if d.endswith("_model")]
    for dest, flag in named:
        v = getattr(args, dest, None)
        parts = [v] if isinstance(v, (str, os.PathLike)) else list(v) if isinstance(v, (list, tuple)) else []
        if dest in _LIST_INPUTS and isinstance(v, str):
            parts = v.split(",")
        for k, part in enumerate(p for p in parts if isinstance(p, (str, os.PathLike)) and str(p)):
            inputs[flag if k == 0 else f"{flag}[{k}]"] = part
    measurements = getattr(args, "measurements", None)   # a folder of measured shards and plans (emulator tools)
    if isinstance(measurements, (str, os.PathLike)) and os.path.isdir(measurements):
        for root, _, files in os.walk(measurements):
            for name in sorted(files):
                if name.endswith((".jsonl", ".jsonl.gz", ".txt")) or name == "table_configs.json":
                    path = os.path.join(root, name)
                    inputs[f"--measurements ({os.path.relpath(path, measurements)})"] = path
    for dest, flag in (("data_dir", "--data-dir"), ("dataset_dir", "--dataset-dir")):
        if getattr(args, dest, None):
            for name in ("table_configs.json", "data.pt"):
                inputs[f"{flag} ({name})"] = os.path.join(getattr(args, dest), name)
    card = _card_file(getattr(args, "oracle", None))
    if card:   # an emulated landscape's card file is read
        inputs["--oracle (card)"] = card
    if hasattr(args, "cache_path") and _measured_landscape(getattr(args, "oracle", None)):
        inputs["--cache-path"] = args.cache_path or DEFAULT_CACHE_PATH
    alg = getattr(args, "alg", None)
    for name in (alg.split(",") if isinstance(alg, str) else alg if isinstance(alg, (list, tuple)) else []):
        if str(name).strip() and os.path.isfile(str(name).strip()):
            inputs[f"--alg {str(name).strip()}"] = str(name).strip()
    return inputs


def _card_file(oracle: str | None) -> str | None:
    """The card file an ``--oracle emulated:<card>`` names (None: another landscape, or no valid name)."""
    from shardcore.planning import EMULATED_PREFIX, is_card_file, parse_landscape

    try:
        spec = parse_landscape(oracle) if oracle else None
    except ShardError:
        return None
    card = spec[len(EMULATED_PREFIX):] if spec and spec.startswith(EMULATED_PREFIX) else None
    return card if is_card_file(card) else None


def _measured_landscape(oracle: str | None) -> bool:
    """Whether ``--oracle`` (None: not given, the measured default) names the measured landscape; a name
    that is none is refused where the oracle is opened, not here."""
    from shardcore.planning import MEASURED, parse_landscape

    try:
        return parse_landscape(oracle or MEASURED) == MEASURED
    except ShardError:
        return False


def check_out_file(args: argparse.Namespace, path, flag: str = "--out", kind: str | None = "text") -> None:
    """Before any work: ``path`` (an output file flag's value; None: not given) obeys
    :func:`shardcore.io.check_outputs` against the command's inputs."""
    check_outputs(args, {flag: path}, {flag: kind})


_KIND_OF_SUFFIX = {".pt": "a zip/torch file", ".png": "a PNG image"}


def check_outputs(args: argparse.Namespace, outputs: dict, kinds: dict | None = None, dirs=(), replaced=(),
                  inputs: dict | None = None, folders: dict | None = None) -> None:
    """Before any work: :func:`shardcore.io.check_outputs`, the one rule for outputs, with the inputs the
    command's flags name (:func:`command_inputs`, plus ``inputs``; a measured oracle's cache, which it
    writes too, is an output as well), then no output replaces a file of another kind (``kinds``: flag ->
    :func:`file_kind`'s word, default text; None: any). ``folders``: flag -> (an output folder, the names
    the command writes in it), each file's kind by its suffix (``.pt``, ``.png``, text)."""
    from shardcore import io

    given, outputs, kinds, dirs = outputs, {}, dict(kinds or {}), list(dirs)
    for flag, (folder, names) in (folders or {}).items():   # a folder before the files in it
        outputs[flag] = folder
        dirs.append(flag)
        for n in names:
            outputs[f"{flag} ({n})"] = None if folder is None else os.path.join(folder, n)
            kinds[f"{flag} ({n})"] = _KIND_OF_SUFFIX.get(os.path.splitext(n)[1], "text")
    outputs.update(given)
    inputs = {**command_inputs(args), **(inputs or {})}
    if "--cache-path" in inputs and not getattr(args, "plan_only", False):   # a measured oracle writes its cache too
        outputs.setdefault("--cache-path", inputs["--cache-path"])
        kinds.setdefault("--cache-path", "an SQLite database")
    io.check_outputs(outputs, inputs, dirs=dirs, replaced=replaced)
    for flag, path in outputs.items():
        kind = kinds.get(flag, "text")
        if path and flag not in dirs and kind is not None:
            check_replaces_kind(path, kind, flag)


_MAGIC = ((b"SQLite format 3\x00", "an SQLite database"), (b"PK\x03\x04", "a zip/torch file"),
          (b"\x80", "a pickle/torch file"), (b"\x89PNG", "a PNG image"), (b"%PDF", "a PDF document"))


def file_kind(path: str | os.PathLike) -> str:
    """What an existing file is, by its first bytes: one of ``_MAGIC``'s names, ``"text"`` or ``"binary"``."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(4096)
    except OSError:
        return "unreadable"
    return next((name for magic, name in _MAGIC if head.startswith(magic)), "binary" if b"\x00" in head else "text")


def check_replaces_kind(path: str | os.PathLike, kind: str, flag: str = "output") -> None:
    """An output of ``kind`` (:func:`file_kind`'s words, e.g. ``"text"``) replaces an existing file only of
    the same kind: ``--out cache.sqlite`` for a JSONL report is refused in one line."""
    path = Path(path)
    if path.is_file() and path.stat().st_size and file_kind(path) not in (kind, "unreadable"):
        raise ShardError(f"{flag} {path} exists and is {file_kind(path)}, not "
                         f"{'a text file' if kind == 'text' else kind}: refusing to replace it; choose another {flag}")


def add_task_args(parser: argparse.ArgumentParser, default_tasks: str, what: str = "task file") -> None:
    """``--task-path`` (a task file) and ``--data-dir`` (the processed dataset), with the original
    repositories' spellings."""
    from shardcore.dataset import DEFAULT_DATA_DIR

    parser.add_argument("--task-path", "--task_path", dest="task_path", default=default_tasks,
                        help=f"{what}, one task per line (default %(default)s, or when that does not exist "
                             f"{os.path.basename(default_tasks)} beside the dataset in --data-dir, where "
                             "tools/gen_dlrm_data.py's task flags write it)")
    parser.set_defaults(_default_task_path=default_tasks)
    parser.add_argument("--data-dir", "--data_dir", "--dataset_dir", dest="data_dir", default=DEFAULT_DATA_DIR,
                        help="processed dataset directory (default %(default)s)")


def add_device_args(parser: argparse.ArgumentParser, default_ndevices: int = 4) -> None:
    """``--gpu-devices 0,1,2,3`` and/or ``--ndevices N``: the plan has N devices (default: as many
    as listed), measured on the listed devices (on a CPU-only machine: logical devices)."""
    g = parser.add_argument_group("devices")
    g.add_argument("--gpu-devices", "--gpu_devices", dest="gpu_devices", type=int_list, default=None, metavar="IDS",
                   help="devices that measure, e.g. 0,1,2,3; on a CPU-only machine these are logical "
                        f"devices (default: {default_ndevices} devices, or all GPUs up to --ndevices)")
    g.add_argument("--ndevices", type=device_count, default=None, metavar="N",
                   help="devices a plan has (default: as many as --gpu-devices lists, else "
                        f"{default_ndevices}); more than --gpu-devices lists measures each plan device's "
                        "compute on those devices in turn and models the all-to-all (--comm-bandwidth, "
                        "--comm-latency; fitted to the real exchange when two or more devices are listed)")
    parser.set_defaults(_default_ndevices=default_ndevices)


def topology_of(args: argparse.Namespace, ndevices: int | None = None):
    """The :class:`~shardcore.topology.Topology` the flags give, built once per command: ``ndevices``
    (default :func:`num_devices`), ``--max-memory``, ``--weights-precision`` and the hosts
    (``--devices-per-host``; under ``--launcher torchrun`` without it, torchrun's local world size where it
    splits the devices into several hosts)."""
    from shardcore.topology import Topology

    n = num_devices(args) if ndevices is None else int(ndevices)
    hosts = getattr(args, "devices_per_host", 0) or 0
    if not hosts and getattr(args, "launcher", "spawn") == "torchrun":
        from shardcore.oracles.measured.launch import rank_env

        local = rank_env().local_world_size
        hosts = local if local < n else 0
    return Topology(n, args.max_memory, args.weights_precision, devices_per_host=hosts)


def device_ids(args: argparse.Namespace) -> list[int]:
    """The devices that measure (``--gpu-devices``, else ``0..N-1``)."""
    if args.gpu_devices is not None:
        ids = list(args.gpu_devices)
        if len(set(ids)) != len(ids) or min(ids) < 0:
            raise ShardError(f"--gpu-devices must list distinct non-negative ids, got {ids}")
        if len(ids) > MAX_DEVICES:
            raise ShardError(f"--gpu-devices lists {len(ids)} devices: at most {MAX_DEVICES} are planned for")
        if args.ndevices is not None and args.ndevices < len(ids):
            raise ShardError(f"--ndevices {args.ndevices} is fewer than the {len(ids)} devices --gpu-devices lists")
        return ids
    return list(range(args.ndevices or args._default_ndevices))


def num_devices(args: argparse.Namespace) -> int:
    """The number of devices a plan has (``--ndevices``, else as many as ``--gpu-devices`` lists;
    under ``--launcher torchrun``, else torchrun's world size)."""
    if getattr(args, "launcher", "spawn") == "torchrun" and args.ndevices is None:
        from shardcore.oracles.measured.launch import rank_env

        return rank_env().world_size
    ids = device_ids(args)
    return args.ndevices if args.ndevices is not None else len(ids)



class _PrecisionAction(argparse.Action):
    """``--weights-precision``: remembers that it was given, so ``--max_mem`` leaves it alone."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        namespace._precision_given = True


class _Fp32MaxMemAction(argparse.Action):
    """NeuroShard's ``--max_mem`` in a script whose own default precision is fp16: the cap is counted
    in fp32 (NeuroShard's meaning) unless ``--weights-precision`` is given."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        if not getattr(namespace, "_precision_given", False):
            namespace.weights_precision = "fp32"


def planning_context(args: argparse.Namespace, topology, batch_size: int | None, *, oracle: str | None = "",
                     data_dir: str | None = "", evaluated_tasks: Sequence[str] = ()):
    """The run's :class:`~shardcore.planning.PlanningContext`, built once from the flags: ``topology``
    (:func:`topology_of`), the batch the plans run at, the landscape (``oracle``, default ``--oracle``; None
    where no oracle judges; ``--emulator-fit``, the exchange flags, ``--cache-path``; ``data_dir``, default
    ``--data-dir``), ``--seed`` and the task files being evaluated."""
    from shardcore.planning import HELDOUT, Landscape, PlanningContext

    land = Landscape(getattr(args, "oracle", None) if oracle == "" else oracle,
                     fit=getattr(args, "emulator_fit", None) or HELDOUT,
                     comm_bandwidth=getattr(args, "comm_bandwidth", None), comm_latency=getattr(args, "comm_latency", None),
                     inter_host_bandwidth=getattr(args, "inter_host_bandwidth", None),
                     inter_host_latency=getattr(args, "inter_host_latency", None),
                     data_dir=getattr(args, "data_dir", None) if data_dir == "" else data_dir,
                     cache_path=getattr(args, "cache_path", None))
    return PlanningContext(topology, batch_size, land, int(getattr(args, "seed", 0) or 0), tuple(evaluated_tasks))


def add_memory_args(parser: argparse.ArgumentParser, default_max_memory: float = DEFAULT_MAX_MEMORY_GB,
                    default_precision: str = "fp16") -> None:
    """``--max-memory GiB`` (per device) and ``--weights-precision``. ``default_precision`` is the
    precision of the repository a script mirrors: fp16 for AutoShard and DreamShard, fp32 for
    NeuroShard. Where it is fp16, NeuroShard's spelling ``--max_mem`` keeps NeuroShard's meaning:
    the same per-device cap, counted in fp32 unless ``--weights-precision`` says otherwise."""
    parser.add_argument("--max-memory", dest="max_memory", type=positive_float,
                        default=default_max_memory, metavar="GiB",
                        help=f"memory cap per device for embedding weights, in GiB (default {default_max_memory})")
    from shardcore import registry

    owner = registry.spelling_owner("--max_mem")
    if default_precision == "fp32":
        parser.add_argument("--max_mem", dest="max_memory", type=positive_float, metavar="GiB",
                            help=f"{owner} spelling of --max-memory")
    else:
        parser.add_argument("--max_mem", dest="max_memory", type=positive_float, metavar="GiB",
                            action=_Fp32MaxMemAction,
                            help=f"{owner} spelling of --max-memory, with {owner} meaning: the cap "
                                 "counts weights in fp32 (4 bytes) unless --weights-precision is given")
    origin = registry.precision_origin(default_precision)
    parser.add_argument("--weights-precision", choices=sorted(PRECISION_BYTES), default=default_precision,
                        action=_PrecisionAction,
                        help="weight precision: fp16 counts 2 bytes per weight toward the cap, fp32 "
                             f"counts 4 (default {default_precision}" + (f", {origin})" if origin else ")"))
    parser.set_defaults(_precision_given=False)


def add_oracle_args(parser: argparse.ArgumentParser, batch_flag: str = "--batch-size") -> None:
    """The cost oracle's flags, generated from :class:`~shardcore.oracles.factory.OracleConfig`.

    ``batch_flag`` renames the benchmark's batch flag where ``--batch-size`` means something else
    (``train_autoshard.py``: the learner's batch): ``--bench-batch-size``, its value then
    ``args.bench_batch_size`` (read it with :func:`oracle_batch_size`)."""
    from shardcore.config import add_config_args
    from shardcore.oracles.factory import OracleConfig

    if not (batch_flag.startswith("--") and batch_flag.endswith("batch-size")):
        raise ValueError(f"the benchmark's batch flag must end in batch-size, got {batch_flag!r}")
    g = parser.add_argument_group("hardware measurement")
    defaults = OracleConfig()
    add_config_args(g, defaults, prefix=batch_flag[2:-len("batch-size")], skip_groups=("oracle",))
    add_config_args(g, defaults, skip_groups=("batch",))


def oracle_batch_size(args: argparse.Namespace) -> int | None:
    """The benchmark batch size given by :func:`add_oracle_args`'s flag (None: the dataset's)."""
    return args.bench_batch_size if hasattr(args, "bench_batch_size") else args.batch_size


def open_evaluator(args: argparse.Namespace, data_dir: str, devices: Sequence[int], ndevices: int | None = None):
    """The cost oracle chosen by :func:`add_oracle_args` flags, built by
    :func:`~shardcore.oracles.factory.open_oracle`: a :class:`~shardcore.oracles.measured.driver.PlanEvaluator` measuring
    on ``devices`` inside the measurement cache (use it as a context manager: workers start on entry
    and stop on exit) or an emulated one (:class:`~shardcore.oracles.emulated.oracle.EmulatedOracle`). ``ndevices``:
    devices per plan (default: ``--ndevices`` when the parser has device flags, else
    ``len(devices)``)."""
    from shardcore.oracles.commmodel import CommModel, comm_kwargs
    from shardcore.oracles.factory import open_oracle
    from shardcore.planning import EMULATED_PREFIX, MEASURED, parse_landscape

    torchrun = getattr(args, "launcher", "spawn") == "torchrun"
    if ndevices is None:
        ndevices = getattr(args, "ndevices", None) or (None if torchrun else len(devices))
    oracle = parse_landscape(getattr(args, "oracle", MEASURED))
    comm = CommModel.of(**comm_kwargs(args))
    common = dict(oracle=oracle, batch_size=oracle_batch_size(args), optimizer=args.optimizer,
                  precision=args.weights_precision, comm_model=comm)
    if oracle.startswith(EMULATED_PREFIX):
        return open_oracle(data_dir, ndevices or len(devices), emulator_fit=getattr(args, "emulator_fit", "heldout"),
                           **common)
    kwargs = {}
    if args.bench_iters is not None:
        kwargs["bench_iters"] = args.bench_iters
    if args.warmup_iters is not None:
        kwargs["warmup_iters"] = args.warmup_iters
    if getattr(args, "comm_iters", None) is not None:
        kwargs["comm_iters"] = args.comm_iters
    cache = args.cache_path if args.cache_path else True
    # With --ndevices alone, let the evaluator use the GPUs this machine has (all of them up to N).
    ids = None if getattr(args, "gpu_devices", "given") is None else list(devices)
    if torchrun:
        ids = None
        kwargs["launcher"] = "torchrun"
    return open_oracle(data_dir, ndevices, device_ids=ids, cache=cache, no_cache=args.no_cache,
                       timeout_s=args.timeout, **common, **kwargs)


def original_range(text: str) -> list[int]:
    """argparse type for the originals' ``--T-range``/``--T_range``: ``N`` (exactly N) or ``MIN,MAX``
    with MAX *exclusive*, as in the original scripts (numpy's ``randint``): ``80,81`` is always 80,
    ``10,60`` is 10..59. Returns the inclusive ``[MIN, MAX - 1]``."""
    values = int_list(text)
    if len(values) == 1:
        lo = hi = values[0]
    elif len(values) == 2:
        lo, hi = values[0], values[1] - 1
        if hi < lo:
            raise argparse.ArgumentTypeError(
                f"MIN,MAX with MAX exclusive (as the original scripts), so MAX must exceed MIN; got {text!r} "
                f"(for exactly {values[0]} tables give {values[0]} or {values[0]},{values[0] + 1})")
    else:
        raise argparse.ArgumentTypeError(f"expected N or MIN,MAX, got {text!r}")
    if lo < 1:
        raise argparse.ArgumentTypeError(f"table counts must be at least 1, got {text!r}")
    return [lo, hi]


class OriginalFlagError(argparse.Action):
    """An original repository's flag that this project does not implement: using it stops with one
    line that names the way forward (``help`` is that line's pointer)."""

    def __init__(self, option_strings, dest, pointer: str, nargs=None, **kwargs):
        self.pointer = pointer
        kwargs.setdefault("help", f"original flag, not supported: {pointer}")
        super().__init__(option_strings, dest=argparse.SUPPRESS, nargs=nargs, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        raise ShardError(f"{option_string} (from the original code) is not supported here: {self.pointer}")


def add_refused_flag(parser, *names: str, pointer: str, takes_value: bool = True) -> None:
    """Declare an original flag that is refused with one line naming our equivalent (``pointer``)."""
    parser.add_argument(*names, action=OriginalFlagError, pointer=pointer, nargs=None if takes_value else 0,
                        metavar="X" if takes_value else None)


def prestart_oracle(args: argparse.Namespace) -> bool:
    """Where ``args`` choose the measured oracle with workers on this machine (not torchrun, not
    ``--plan-only``), boot their forkserver now (:func:`~shardcore.oracles.measured.worker.prestart_forkserver`):
    a script calls it once its inputs are checked, before its own set-up (planners, networks), which the
    workers' imports then overlap. True if it was started."""
    from shardcore.planning import MEASURED, parse_landscape

    if (parse_landscape(getattr(args, "oracle", MEASURED)) != MEASURED or getattr(args, "launcher", "spawn") != "spawn"
            or getattr(args, "plan_only", False)):
        return False
    from shardcore.oracles.measured.worker import prestart_forkserver

    return prestart_forkserver()


def serve_if_torchrun_rank(args: argparse.Namespace) -> int | None:
    """Under ``--launcher torchrun``, ranks other than 0 serve measurements here and return their exit
    status (the script returns it); rank 0 and the spawn launcher get None and go on."""
    if getattr(args, "launcher", "spawn") != "torchrun":
        return None
    from shardcore.oracles.measured.launch import rank_env, serve

    if rank_env().rank == 0:
        import signal
        import threading

        from shardcore.errors import Terminated

        def on_term(signum, frame):
            raise Terminated()

        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, on_term)
        return None
    return serve(getattr(args, "timeout", DEFAULT_TIMEOUT_S) + 300.0)


def flags_given(parser: argparse.ArgumentParser, argv: list[str] | None) -> set[str]:
    """The ``dest`` of every option written on the command line ``argv`` (whatever its value, the
    default's included), found by parsing ``argv`` again with no defaults."""
    saved = [(a, a.default) for a in parser._actions]
    try:
        for a in parser._actions:
            a.default = argparse.SUPPRESS
        given, _ = parser.parse_known_args(sys.argv[1:] if argv is None else list(argv))
    finally:
        for a, d in saved:
            a.default = d
    return set(vars(given))


def check_resumed_config(stored: Config, asked: Config, given: set[str], anew: str,
                         free: tuple[str, ...] = (), prefix: str = "") -> None:
    """A resumed training keeps the hyper-parameters it was trained with: a flag of ``stored``'s
    class given on the command line (``given``: :func:`flags_given`) with another value than the
    checkpoint's is refused in one line; fields in ``free`` (how long to run, how many workers) may
    change. ``anew``: how to start a separate training instead."""
    for f in flag_fields(stored):
        if f.name in free or _dest(f, prefix) not in given:
            continue
        was, now = getattr(stored, f.name), getattr(asked, f.name)
        if now is not None and now != was:
            was = "at its default" if was is None else was
            raise ShardError(f"--resume: the checkpoint was trained with {_flags(f, prefix, False)[0]} {was}, this run "
                             f"gives {now}: a resumed training keeps its hyper-parameters; drop the flag, or "
                             f"train anew {anew}")
