"""Data generation: synthetic and downloaded DLRM datasets (``dlrm``) and task files (``taskgen``)."""
