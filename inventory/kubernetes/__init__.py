"""Talking to Kubernetes clusters: stored credentials, API clients, error mapping and node discovery.

Imports nothing from the other apps (inventory knows nothing of them); the apply backend in
``allocations/apply/backends/kubernetes.py`` builds on :mod:`inventory.kubernetes.client`.
"""
