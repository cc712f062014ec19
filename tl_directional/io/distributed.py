"""Process-group lifecycle under ``torchrun``: free the group at destroy, not at interpreter exit.

A ``torch.distributed`` process group owns worker threads (gloo: ``gloo_tcp_loop`` and two
``pt_gloo_runloop``); ``destroy_process_group()`` joins them only when it drops the last
reference to the group. Anything that still holds the group keeps those threads running into
interpreter shutdown. There a gloo worker that releases its finished all-reduce work has to take
the GIL to free the tensors' Python objects; during finalisation CPython ends such a thread with
``pthread_exit``, whose unwinding hits a ``noexcept`` C++ frame and aborts the whole process
(``terminate called without an active exception``, SIGABRT), so ``torchrun`` reports the job
failed after all its work was done. Whether the worker is still releasing the work at that moment
is a race, which is why the abort comes and goes from run to run.

Two holders seen in this project (measured by listing ``/proc/self/task`` after
``destroy_process_group()``): the default arguments of ``torch.distributed.nn.functional``
(see :func:`release_captured_groups`) and a ``DistributedDataParallel`` wrapper still alive
when the group is destroyed (``train.train`` drops its trainer first).
"""

from __future__ import annotations

import os
import sys
import types

import torch

_CAPTURING_MODULE = "torch.distributed.nn.functional"
# names of a gloo group's native threads as /proc shows them: gloo's event loop (gloo_tcp_loop)
# and c10d's workers (pt_gloo_runloop)
_GROUP_THREAD_PREFIXES = ("gloo_", "pt_gloo")


def rank_and_world() -> tuple[int, int]:
    """``(rank, world_size)`` of the default process group; ``(0, 1)`` outside ``torchrun``.

    The one place sweep, profile and compression geometry ask how to shard their batches
    (rank ``r`` takes every ``world``-th batch) before they all-reduce their sums."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def group_threads_alive() -> list[str] | None:
    """Names of this process's native threads that belong to a gloo process group (Linux ``/proc``).

    Empty after ``destroy_process_group()`` freed every group; ``None`` where ``/proc`` cannot
    be read (not Linux). A diagnostic for tests and scripts: a non-empty list right before exit
    is the condition under which the process can abort at interpreter shutdown.
    """
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return None
    names = []
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
        except OSError:  # the thread ended while we looked
            continue
        if name.startswith(_GROUP_THREAD_PREFIXES):
            names.append(name)
    return sorted(names)


def release_captured_groups() -> int:
    """Drop the process groups that ``torch.distributed.nn.functional`` captured at import.

    Upstream behaviour (torch 2.x, ``torch/distributed/nn/functional.py``): its collectives
    declare ``group=group.WORLD`` as a default argument, which Python evaluates once, at import.
    When the module is first imported *after* ``init_process_group()``, every one of those
    defaults holds the live default group, so ``destroy_process_group()`` can no longer free it.
    Loading a model does that import: transformers 4 (via ``masking_utils`` -> ``torch._dynamo``)
    and transformers 5 (via ``integrations.accelerate`` -> ``distributed.fsdp``) both reach
    ``torch.distributed.fsdp`` -> ``_shard`` -> ``sharded_tensor.reshard``, which imports it.

    Each captured group is replaced by ``None``, which those functions pass on to
    ``torch.distributed`` where it means the default group at call time: the calls behave the
    same, and no stale group is kept once it is destroyed. Safe to call at any time, any number
    of times; a no-op when the module was never imported or captured nothing.

    Returns:
        The number of functions whose defaults were changed.
    """
    mod = sys.modules.get(_CAPTURING_MODULE)
    if mod is None or not torch.distributed.is_available():
        return 0
    group_type = torch.distributed.ProcessGroup
    changed = 0
    for fn in list(vars(mod).values()):
        if not isinstance(fn, types.FunctionType) or fn.__module__ != mod.__name__:
            continue
        hit = False
        if fn.__defaults__ and any(isinstance(d, group_type) for d in fn.__defaults__):
            fn.__defaults__ = tuple(None if isinstance(d, group_type) else d for d in fn.__defaults__)
            hit = True
        if fn.__kwdefaults__ and any(isinstance(d, group_type) for d in fn.__kwdefaults__.values()):
            fn.__kwdefaults__ = {k: (None if isinstance(d, group_type) else d)
                                 for k, d in fn.__kwdefaults__.items()}
            hit = True
        changed += hit
    return changed


def destroy_process_group() -> None:
    """``torch.distributed.destroy_process_group()`` after :func:`release_captured_groups`.

    Use it instead of the plain call at the end of a ``torchrun`` script that loaded a model
    after ``init_process_group()``: the default group (and its worker threads) is then freed
    here rather than at interpreter exit. A no-op when no group is initialised.
    """
    release_captured_groups()
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
