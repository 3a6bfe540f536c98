"""The FGD paper's GPU fragmentation measure (Weng et al., USENIX ATC '23).

Definitions (as in the data README):

* A *task shape* is ``(cpu_milli, gpu_milli, num_gpu, gpu_spec)``. The *typical shapes* are
  the most frequent shapes of a workload that together cover 95% of its tasks, each with
  its frequency ``p_m`` renormalised over the kept shapes.
* For node ``n`` and shape ``m``: if ``m`` needs no GPU, or ``n``'s model is not allowed by
  ``m``, or ``m`` does not fit on ``n`` (CPU, or fewer than ``num_gpu`` GPUs with at least
  ``gpu_milli`` free), **all** of ``n``'s free milli-GPU is fragment for ``m``. If ``m``
  fits, the fragment is the free milli-GPU of the GPUs that each have less free than
  ``gpu_milli``.
* ``F_n = sum_m p_m * frag(n, m)``; the cluster's fragmentation is ``sum_n F_n``.

Everything here is vectorised over nodes: ``node_fragment`` takes ``(B, G)`` free milli
and ``(B,)`` free CPU and returns ``(B,)`` fragments, so a policy can score every
candidate placement of a request in one call.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from .arrays import ClusterArrays


@dataclass(frozen=True)
class TaskShape:
    cpu_milli: int
    gpu_milli: int  # per GPU; 0 for CPU-only
    num_gpu: int
    gpu_spec: str = ""  # "" = any model, else "A|B|C"

    @property
    def allowed(self) -> frozenset[str]:
        return frozenset(m for m in self.gpu_spec.split("|") if m)


def typical_shapes(shapes: Iterable[TaskShape], coverage: float = 0.95) -> list[tuple[TaskShape, float]]:
    """The most frequent shapes covering ``coverage`` of all tasks, with renormalised frequencies.

    Order follows the reference: by count descending, equal counts by the larger
    ``(cpu, gpu_milli, num_gpu, spec)`` first. Shapes are added one at a time until the
    cumulative count reaches ``coverage`` of the total.
    """
    counts = Counter(shapes)
    total = sum(counts.values())
    if total == 0:
        return []
    ordered = sorted(
        counts.items(),
        key=lambda kv: (kv[1], kv[0].cpu_milli, kv[0].gpu_milli, kv[0].num_gpu, kv[0].gpu_spec),
        reverse=True,
    )
    kept: list[tuple[TaskShape, int]] = []
    cum = 0
    for shape, count in ordered:
        if cum >= coverage * total:
            break
        kept.append((shape, count))
        cum += count
    return [(shape, count / cum) for shape, count in kept]


class ShapeTable:
    """Typical shapes as arrays, bound to one cluster's model vocabulary."""

    def __init__(self, shapes: Sequence[tuple[TaskShape, float]], models: Sequence[str]) -> None:
        self.shapes = [s for s, _ in shapes]
        self.p = np.array([p for _, p in shapes], dtype=np.float64)
        self.cpu = np.array([s.cpu_milli for s in self.shapes], dtype=np.int64)
        self.milli = np.array([s.gpu_milli for s in self.shapes], dtype=np.int64)
        self.num = np.array([s.num_gpu for s in self.shapes], dtype=np.int64)
        # access[model_index, m]: may shape m run on that model? Row -1 (GPU-less node) never.
        access = np.zeros((len(models) + 1, len(self.shapes)), dtype=bool)
        for j, s in enumerate(self.shapes):
            allowed = s.allowed
            for i, model in enumerate(models):
                access[i, j] = (not allowed) or model in allowed
        self.access = access
        # A shape that needs no GPU can never use GPU capacity: its term is always "all free".
        self.needs_gpu = self.milli > 0
        self.p_gpu = self.p[self.needs_gpu]
        self.p_cpu_only = float(self.p[~self.needs_gpu].sum())
        #: Optional per-model frequencies (see :meth:`per_model`): row = model index, -1 last.
        self.p_model_gpu: np.ndarray | None = None
        self.p_model_cpu_only: np.ndarray | None = None

    @classmethod
    def per_model(cls, shapes: Sequence[TaskShape], p: np.ndarray, models: Sequence[str]) -> ShapeTable:
        """A table whose frequencies depend on the node's model: ``p[i, m]`` is shape ``m``'s
        frequency among the work that may run on model ``i`` (row -1, GPU-less nodes, last).

        The shapes carry no model restriction (the frequencies already say where they go),
        so ``F_n`` of a node counts only the work that could ever use it.
        """
        table = cls([(s, 0.0) for s in shapes], models)
        p = np.asarray(p, dtype=np.float64)
        table.p_model_gpu = np.ascontiguousarray(p[:, table.needs_gpu])
        table.p_model_cpu_only = p[:, ~table.needs_gpu].sum(axis=1)
        return table

    def __len__(self) -> int:
        return len(self.shapes)


class FragmentTerms:
    """Per-node, per-shape sufficient statistics of ``F_n``, so a changed GPU costs O(shapes).

    For every GPU-needing typical shape ``m``: ``count[b, m]`` GPUs have room for it,
    ``small[b, m]`` milli sit on GPUs that do not. With the node's total free ``total[b]``
    and CPU, ``F_n`` follows without looking at the GPUs again, and so does the ``F_n`` of
    a state that differs in one GPU or in CPU only (see :meth:`value`).
    """

    def __init__(self, gpu_free: np.ndarray, cpu_free: np.ndarray, model_idx: np.ndarray, table: ShapeTable) -> None:
        self.table = table
        free = self.free = np.asarray(gpu_free, dtype=np.int64)
        self.milli = table.milli[table.needs_gpu]
        self.shape_cpu = table.cpu[table.needs_gpu]
        self.shape_num = table.num[table.needs_gpu]
        self.total = free.sum(axis=1)
        self.cpu = np.asarray(cpu_free, dtype=np.int64)
        self.model_idx = np.asarray(model_idx, dtype=np.int64)
        if table.p_model_gpu is not None:
            # Per-model frequencies, gathered once per row here rather than in every value().
            self.p_rows_gpu = table.p_model_gpu[self.model_idx]
            self.p_rows_cpu = table.p_model_cpu_only[self.model_idx]
        self.access = table.access[np.asarray(model_idx, dtype=np.int64)][:, table.needs_gpu]
        # ge[b, m, g]: GPU g of node b has room for one GPU of shape m.
        ge = free[:, None, :] >= self.milli[None, :, None]
        self.count = ge.sum(axis=2)
        self.small = np.where(ge, 0, free[:, None, :]).sum(axis=2)

    def value(
        self,
        rows: np.ndarray | slice = slice(None),
        count: np.ndarray | None = None,
        small: np.ndarray | None = None,
        total: np.ndarray | None = None,
        cpu: np.ndarray | None = None,
    ) -> np.ndarray:
        """``F_n`` of ``rows``, optionally with replaced statistics (a hypothetical state)."""
        count = self.count[rows] if count is None else count
        small = self.small[rows] if small is None else small
        total = self.total[rows] if total is None else total
        cpu = self.cpu[rows] if cpu is None else cpu
        fits = (cpu[:, None] >= self.shape_cpu[None, :]) & (count >= self.shape_num[None, :]) & self.access[rows]
        frag = np.where(fits, small, total[:, None]).astype(np.float64)
        if self.table.p_model_gpu is not None:
            p_gpu, p_cpu = self.p_rows_gpu[rows], self.p_rows_cpu[rows]
            return np.einsum("bm,bm->b", frag, p_gpu) + total * p_cpu
        return frag @ self.table.p_gpu + total * self.table.p_cpu_only

    def after_one_gpu(
        self, rows: np.ndarray, old_free: np.ndarray, new_free: np.ndarray, cpu_after: np.ndarray
    ) -> np.ndarray:
        """``F_n`` after one GPU of each row goes from ``old_free`` to ``new_free`` milli."""
        ge_old = old_free[:, None] >= self.milli[None, :]
        ge_new = new_free[:, None] >= self.milli[None, :]
        count = self.count[rows] - ge_old + ge_new
        small = self.small[rows] - np.where(ge_old, 0, old_free[:, None]) + np.where(ge_new, 0, new_free[:, None])
        total = self.total[rows] - (old_free - new_free)
        return self.value(rows, count=count, small=small, total=total, cpu=cpu_after)

    def after_whole_gpus(self, num: int, cpu_after: np.ndarray) -> np.ndarray:
        """``F_n`` after ``num`` fully free GPUs of every row are taken (1000 -> 0 milli each)."""
        # A full GPU has room for every shape; an empty one for none and adds nothing to `small`.
        count = self.count - num
        return self.value(count=count, total=self.total - 1000 * num, cpu=cpu_after)


def node_fragment(gpu_free: np.ndarray, cpu_free: np.ndarray, model_idx: np.ndarray, table: ShapeTable) -> np.ndarray:
    """``F_n`` for a batch of node states: ``gpu_free (B, G)``, ``cpu_free (B,)``, ``model_idx (B,)``."""
    if len(table) == 0:
        return np.zeros(len(gpu_free))
    return FragmentTerms(gpu_free, cpu_free, model_idx, table).value()


def cluster_fragment(arrays: ClusterArrays, table: ShapeTable) -> float:
    """Sum of ``F_n`` over all nodes, in milli-GPU."""
    return float(node_fragment(arrays.gpu_free, arrays.cpu_free, arrays.model_idx, table).sum())


def shapes_from_rows(rows: Iterable[tuple[int, int, int, str]]) -> list[TaskShape]:
    """Task shapes from ``(cpu_milli, gpu_milli, num_gpu, gpu_spec)`` tuples (e.g. trace rows)."""
    return [TaskShape(int(c), int(g) if int(n) > 0 else 0, int(n), s or "") for c, g, n, s in rows]
