"""An emulated GPU, its public face: the compute model (:mod:`.model`: features, :class:`GpuComputeModel`,
:func:`predict_devices`) and the measurements it is fitted on and judged by (:mod:`.measurements`: the
manifest, the shipped model of a card, held-out refits and their errors). A :class:`GpuComputeModel` made
here is given its card's shipped measurements (its measured range, its replica law) unless told otherwise;
the model module itself reads no file."""

from __future__ import annotations

from typing import Mapping

from . import model as _model
from .model import (  # noqa: F401  (re-exported)
    BIN_REPS, BYTES_PER_WEIGHT, CPU_SPEC, DEFAULT_SPEC, FORMAT, FP32_NOTE, LONG_BIN, MeasuredCard,
    OPTIONAL_TERMS, PIECE_DEVICE_KINDS, REPLICA_FEATURES, SECTOR_BYTES, TableArrays, _cpu_features,
    _distinct_rows, _hat, _hat_sums, _is_cpu, feature_names, fit_params, fit_weights, known_cv, known_index,
    nnls, piece_device_kind, predict_devices, replica_features, shard_features, sort_passes, table_arrays,
    weight_bytes)
from .measurements import (  # noqa: F401  (re-exported)
    FIT_RUNS, GPUCHECK_RUNS, GPUCHECK_SETS, HOLDOUT_RULES, MANIFEST, MEASUREMENTS_DIR, MIN_BIAS_DEVICES,
    MIN_PLAN_TABLES, MIN_REPLICA_DEVICES, MODEL_FILES, MeasuredLandscape, PIECE_ERROR_FILES, PIECE_FILES,
    PLAN_FILES, ROOT, SET_OF_DEVICES, SHARD_FILES, SHIPPED, ShippedMeasurements, TASK_FILES, _fit_rows, _fold_of,
    _parse_subset, _piece_errors, _piece_pool, card_domain, compute_piece_error_rows, default_cv_of,
    fit_replica_weights, heldout_model, judge_error, judge_pool, line_task_set, load_gpu_model,
    load_measurements, measured_landscapes, measured_piece_devices, measured_tables, measurement_features,
    model_error, model_path, physical_weights, piece_bias, piece_error_rows, piece_errors_json,
    piece_judge_error, piece_of, piece_spread, plan_devices, read_manifest, read_params, read_shard_lines,
    replica_devices, seen_tables, shard_key, synthetic_length_cv)


class GpuComputeModel(_model.GpuComputeModel):
    """:class:`shardcore.oracles.emulated.model.GpuComputeModel`, its card's shipped measurements given
    (:data:`~shardcore.oracles.emulated.measurements.SHIPPED`) unless ``measured`` says otherwise."""

    def __init__(self, params: Mapping, measured: _model.MeasuredCard | None = SHIPPED):
        super().__init__(params, measured)
