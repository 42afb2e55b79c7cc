"""Keep the memory that CPU tensors free inside the process, so that a training step does not page-fault it anew.

PyTorch takes CPU tensor storage from the C library's ``malloc``. glibc serves a block above its mmap threshold (which
adapts upward with use, but never beyond 32 MiB on 64-bit) with a fresh ``mmap`` and unmaps it on ``free``. So every
training step maps each large temporary again and the kernel faults in and zeroes it page by page: a 32k × 512 fp32
tensor — the tied embedding's gradient, the logits of 512 tokens, the row-normalized W a head mode folds into the
output layer, and that copy's gradient — costs 16 384 page faults each time. At that size (Transformer-base with a
32k vocabulary, 2 CPU threads) a step of the baseline took ~185 k page faults (0.3 s of a ~2.8 s step in the kernel),
and each head mode's few extra V × d temporaries added ~75 k more: that, not the mode's arithmetic, was most of the
modes' 1.09–1.13× step time at that size (README, "Speed").

``keep_freed_memory`` turns glibc's mmap path off (``M_MMAP_MAX = 0``) and raises the size above which it hands the
top of its heap back to the system (``M_TRIM_THRESHOLD``), so the next step reuses the blocks the last one freed —
as PyTorch's CUDA caching allocator does on the GPU, and at the same price: the process keeps what it once used
(+6–13 % peak RSS in that measurement). Preloading jemalloc or tcmalloc (``python -m torch.backends.xeon.run_cpu
--enable_jemalloc``) is the alternative where they are installed; glibc's own settings then no longer matter.
"""

from __future__ import annotations

import ctypes
import platform

# mallopt() parameters, from glibc's <malloc.h>.
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
# mallopt takes a C int: the largest trim threshold it can be given (2 GiB of free heap top kept).
MAX_TRIM_THRESHOLD = 2**31 - 1


def keep_freed_memory() -> str:
    """Make glibc's malloc keep freed memory for reuse instead of unmapping it (process-wide, from now on).

    Returns:
        One line saying what was done, for the run's log.
    """
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return f"CPU memory: left to the allocator (not glibc on Linux: {platform.system()} {platform.libc_ver()[0]})"
    # The process's own symbols, glibc's among them: ctypes.util.find_library("c") would start `ldconfig -p` at
    # every call (one process launch per training run set up).
    libc = ctypes.CDLL(None)
    if not (libc.mallopt(M_MMAP_MAX, 0) and libc.mallopt(M_TRIM_THRESHOLD, MAX_TRIM_THRESHOLD)):
        raise RuntimeError("glibc's mallopt refused M_MMAP_MAX = 0 / M_TRIM_THRESHOLD = 2 GiB")
    return "CPU memory: freed tensor memory stays in the process for reuse (glibc mmap off, heap not trimmed)"
