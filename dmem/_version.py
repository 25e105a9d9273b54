"""The one version of dmem (and of the dmem-bench harness beside it)."""

__version__ = "0.1.0"
