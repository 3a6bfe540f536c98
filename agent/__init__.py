"""The host agent: `python -m agent --portal URL --token TOKEN [--simulate SPEC]`.

Runs on each bare-metal host. It reads the host's GPUs through NVML (nvidia-ml-py), or
through the simulated backend on machines without GPUs, registers them with the portal
and sends heartbeats. It imports no Django and needs only nvidia-ml-py and the standard
library; it talks to the portal over HTTP with a per-host token.
"""
__version__ = "0.1.0"
