"""The command-line wiring the scripts share: flags, one-line errors and opening an oracle from
flags (``common``), ``--alg`` names resolved to sharders (``algorithms``)."""
