"""Telemetry and alert models arrive with the telemetry issue."""
