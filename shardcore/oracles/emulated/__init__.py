"""The emulated oracle: a GPU emulated from real measurements (``oracle``) by a compute model
fitted on them (``emulator``)."""
