"""The measured oracle: ``driver`` (the parent, :class:`~shardcore.oracles.measured.driver.PlanEvaluator`)
drives one ``worker`` process per device, started locally or by ``launch`` under torchrun; each
worker times its kernels with ``benchmark`` on the lookups ``shardings`` builds."""
