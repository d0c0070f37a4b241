"""wmbook: a notebook workbook for making world-model inference fast."""

__version__ = "0.1.0"
