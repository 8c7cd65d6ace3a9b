"""TorchRec interop: TorchRec's planner as an ``--alg`` (``torchrec_planner``) and plan files in
TorchRec's form (``plan_export``). TorchRec is imported lazily, only here."""
