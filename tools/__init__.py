"""The command-line tools. Run one as ``python tools/<name>.py`` once the repository is installed
(``make install`` or ``pip install -e .``), or as ``python -m tools.<name>`` from the repository root
without installing."""
