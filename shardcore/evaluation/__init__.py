"""Evaluation: every algorithm planned and judged on every task (``compare``), the summary and its
statistics (``report``), the figures (``plots``)."""
