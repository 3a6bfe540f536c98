"""Applying reservations where the GPUs are: Kubernetes clusters and bare-metal host agents.

The database is the truth. For each cluster the portal computes what should exist right
now (:mod:`.desired`, plain data) and asks the cluster's backend to make reality match
(:mod:`.backends`). Applying a reservation, undoing it and the periodic reconcile are the
same operation, a level-triggered sync, so running any of them twice is harmless.
"""
