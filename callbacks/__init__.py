"""Callbacks shared by every family: monitors, checkpointing, prediction writing."""

from callbacks.checkpoint import MonitoredCheckpoint
from callbacks.monitors import GradNormMonitor, NonFiniteLossError, PrecisionMonitor
from callbacks.predictions import WritePredictions

__all__ = ["GradNormMonitor", "MonitoredCheckpoint", "NonFiniteLossError", "PrecisionMonitor", "WritePredictions"]
