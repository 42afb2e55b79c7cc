"""An emulated accelerator for CPU-only CI: run the real code paths as if the model lived on a GPU.

``EmulatedAccelerator`` is a ``TorchFunctionMode`` that tags tensors as living "on the device": the model's
parameters, buffers and gradients and the batch (``put``), then every result computed from a tagged tensor, every
factory call and every ``.to(...)`` given the accelerator's device. The tensors really are on the CPU, so the
accelerator's device is told apart from the host's by *object*: ``ACCELERATOR`` (the test's ``torch.device("cuda")``),
a ``torch.device`` handed to ``put`` (the Trainer's ``args.device``), and every ``.device`` read from a tagged tensor
(``device=weight.device``, also through ``torch.device(...)`` and ``nn.Module.to``, whose C++ argument parsing
makes a new object); a ``device="cpu"`` / ``torch.device("cpu")`` written in the code, or a factory call without
``device=``, makes a host tensor, as on a CUDA machine. It raises ``DeviceMismatch`` where CUDA would:

- an op that mixes a tagged tensor with a host tensor of dim > 0 (0-dim host scalars are legal on CUDA, and so are
  host index tensors in ``[]``);
- ``.numpy()`` of a tagged tensor, and ``np.asarray`` / ``np.array`` of one (``Tensor.__array__``).

It counts every host synchronisation on a tagged tensor (``.item()``, ``.tolist()``, ``bool``/``int``/``float`` of a
tensor, ``.nonzero()``, ``torch.equal``, ``unique``, ``masked_select``, ...) with the source line that asked for it,
so that a test can assert that hf_tiednorm's own code adds none to a training step (``syncs_of_ours``).
``emulated_collectives`` makes ``torch.distributed``'s collectives refuse host tensors under the mode, as NCCL does
("No backend type associated with device type cpu").

What it cannot see: the backward formulas of built-in ops (they run in C++; a custom ``autograd.Function``'s Python
forward/backward are seen), and code that branches on ``tensor.device.type`` (the tensors really are on the CPU):
``DEVICE_AWARE`` lists the libraries that move a tensor to the host themselves before ``.numpy()``; and a device
object a library builds itself from a string (accelerate's ``Accelerator.device``) names the host until it is ``put``.
"""

from __future__ import annotations

import collections
import contextlib
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode
from torch.utils.weak import WeakTensorKeyDictionary

import hf_tiednorm

PACKAGE_DIR = str(Path(hf_tiednorm.__file__).resolve().parent)
TORCH_DIR = str(Path(torch.__file__).resolve().parent)
THIS_FILE = str(Path(__file__).resolve())

FACTORIES = {
    torch.full, torch.zeros, torch.ones, torch.empty, torch.arange, torch.tensor, torch.as_tensor, torch.randn,
    torch.rand, torch.randint, torch.eye, torch.linspace, torch.logspace, torch.randperm, torch.scalar_tensor,
    torch.empty_strided, torch.from_numpy,
}  # fmt: skip
LIKE = {
    torch.full_like, torch.zeros_like, torch.ones_like, torch.empty_like, torch.rand_like, torch.randn_like,
    torch.randint_like,
}  # fmt: skip
SYNCS = {
    torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__bool__, torch.Tensor.__int__, torch.Tensor.__float__,
    torch.Tensor.__index__, torch.Tensor.nonzero, torch.nonzero, torch.equal, torch.Tensor.equal, torch.unique,
    torch.Tensor.unique, torch.masked_select, torch.Tensor.masked_select, torch.argwhere, torch.Tensor.argwhere,
}  # fmt: skip
INDEXING = {torch.Tensor.__getitem__, torch.Tensor.__setitem__}
# Metadata and bookkeeping: no data moves, nothing to check.
PASSTHROUGH = {
    "__get__", "__set__", "dim", "size", "numel", "stride", "is_floating_point", "is_complex", "data_ptr",
    "__repr__", "__format__", "requires_grad_", "register_hook", "register_post_accumulate_grad_hook",
    "storage_offset", "untyped_storage", "_typed_storage", "element_size", "nbytes", "itemsize", "__len__",
    "is_contiguous", "__hash__",
}  # fmt: skip
# The object naming the emulated accelerator's device (CUDA's torch.device("cuda")): `.to(ACCELERATOR)`, `device=...`.
ACCELERATOR = torch.device("cpu")
# Libraries that move a device tensor to the host before .numpy() (they branch on tensor.device.type, which the
# emulation cannot fake): their .numpy() of a tagged tensor is not a bug.
DEVICE_AWARE = ("/safetensors/",)


class DeviceMismatch(RuntimeError):
    """What CUDA would have raised (or a host sync a strict test refuses)."""


def _frames() -> list[traceback.FrameSummary]:
    return [f for f in traceback.extract_stack() if f.filename != THIS_FILE and not f.filename.startswith(TORCH_DIR)]


def _is_ours(frame: traceback.FrameSummary) -> bool:
    return frame.filename.startswith(PACKAGE_DIR)


def _where(frame: traceback.FrameSummary) -> str:
    name = frame.filename
    for marker in ("site-packages/", PACKAGE_DIR.rsplit("/", 1)[0] + "/"):
        name = name.split(marker, 1)[-1]
    return f"{name}:{frame.lineno} ({frame.name})"


def _site() -> tuple[str, bool]:
    """(where, ours): the innermost frame outside torch, and whether it is hf_tiednorm's (then the bug or the sync is
    ours; a library's sync inside a call of ours is the library's)."""
    frames = _frames()
    if not frames:
        return "?", False
    inner = frames[-1]
    own = [f for f in frames if _is_ours(f)]
    text = _where(inner) if not own or own[-1] is inner else f"{_where(inner)} via {_where(own[-1])}"
    return text, _is_ours(inner)


class EmulatedAccelerator(TorchFunctionMode):
    """See the module docstring. ``strict_syncs``: raise at a host sync of hf_tiednorm's code instead of counting."""

    def __init__(self, strict_syncs: bool = False):
        super().__init__()
        self.on = WeakTensorKeyDictionary()
        self.syncs: collections.Counter[str] = collections.Counter()  # "op @ site" -> count, every library
        self.own_syncs: collections.Counter[str] = collections.Counter()  # those whose site is hf_tiednorm's
        self.strict_syncs = strict_syncs
        # The torch.device objects that name the accelerator, by identity (kept alive, so no id is reused).
        self.devices: dict[int, torch.device] = {id(ACCELERATOR): ACCELERATOR}
        self._entered = 0

    # -- nn.Module.to(device=...) parses its device into a new object in C++: the parsed one names what was given ----
    def __enter__(self):
        if self._entered == 0:
            original = self._parse_to = torch._C._nn._parse_to

            def parse_to(*args, **kwargs):
                parsed = original(*args, **kwargs)
                given = kwargs.get("device", args[0] if args else None)
                if parsed[0] is not None and self.names_device(given):
                    self.devices[id(parsed[0])] = parsed[0]
                return parsed

            torch._C._nn._parse_to = parse_to
        self._entered += 1
        return super().__enter__()

    def __exit__(self, *exc):
        self._entered -= 1
        if self._entered == 0:
            torch._C._nn._parse_to = self._parse_to
        return super().__exit__(*exc)

    # -- tagging ------------------------------------------------------------------------------------------------
    def put(self, *objects):
        """Tag modules (parameters, buffers, and gradients as they land), dicts/lists of tensors and tensors as
        living on the device, and ``torch.device`` objects as naming it (a Trainer's ``args.device``); returns the
        first object (or all of them)."""
        for obj in objects:
            if isinstance(obj, torch.device):
                self.devices[id(obj)] = obj
            elif isinstance(obj, torch.nn.Module):
                for tensor in [*obj.parameters(), *obj.buffers()]:
                    self.on[tensor] = True
                for parameter in obj.parameters():  # gradients come from the C++ engine: tag them where they land
                    if parameter.requires_grad:
                        parameter.register_post_accumulate_grad_hook(self._tag_grad)
            elif isinstance(obj, dict):
                self.put(*obj.values())
            elif isinstance(obj, (list, tuple)):
                self.put(*obj)
            elif isinstance(obj, torch.Tensor):
                self.on[obj] = True
        return objects[0] if len(objects) == 1 else objects

    def _tag_grad(self, parameter: torch.Tensor) -> None:
        self.on[parameter.grad] = True

    def is_on(self, tensor: torch.Tensor) -> bool:
        return tensor in self.on

    def names_device(self, device) -> bool:
        """Whether ``device`` (a ``device=`` / ``.to`` argument) is the accelerator's: one of its ``torch.device``
        objects, or a tagged tensor; a string (``"cpu"``) or any other device object is the host."""
        if isinstance(device, torch.Tensor):
            return device in self.on
        return isinstance(device, torch.device) and self.devices.get(id(device)) is device

    def reset_syncs(self) -> None:
        self.syncs.clear()
        self.own_syncs.clear()

    def _mark(self, result) -> None:
        if isinstance(result, torch.Tensor):
            self.on[result] = True
        elif isinstance(result, (list, tuple)):
            for item in result:
                self._mark(item)

    # -- the mode -----------------------------------------------------------------------------------------------
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name == "__get__" and getattr(func, "__self__", None) is torch.Tensor.device:
            result = func(*args, **kwargs)
            if args and args[0] in self.on:  # device=weight.device names the accelerator
                self.devices[id(result)] = result
            return result
        if func is torch.device:
            result = func(*args, **kwargs)
            if args and self.names_device(args[0]):  # torch.device(weight.device)
                self.devices[id(result)] = result
            return result
        if name in PASSTHROUGH:
            return func(*args, **kwargs)
        tensors = _tensors(args, kwargs)
        tagged = [t for t in tensors if t in self.on]
        if func in FACTORIES or func in LIKE:
            result = func(*args, **kwargs)
            if kwargs.get("device") is not None:  # an explicit device: the accelerator's or the host's
                on = self.names_device(kwargs["device"])
            else:  # a *_like keeps its input's device; a factory without device= makes a host tensor
                on = func in LIKE and bool(args) and args[0] in self.on
            if on:
                self._mark(result)
            return result
        if name in ("numpy", "__array__") and tagged:
            site, _ = _site()
            if not any(marker in frame.filename for frame in _frames()[-4:] for marker in DEVICE_AWARE):
                raise DeviceMismatch(f"can't convert a device tensor to numpy (CUDA: 'cuda:0 device type tensor'; "
                                     f"use .cpu() first) at {site}")
        if name == "copy_":  # a cross-device copy_ is legal; the destination keeps its device
            return func(*args, **kwargs)
        if name == "cpu" and tagged:  # a host copy (on a real CPU .cpu() returns self: copy it to untag)
            result = func(*args, **kwargs)
            return result.clone() if result is args[0] else result
        if name == "to" and args and isinstance(args[0], torch.Tensor):
            return self._to(func, args, kwargs)
        if func in SYNCS and tagged:
            site, ours = _site()
            self.syncs[f"{name} @ {site}"] += 1
            if ours:
                self.own_syncs[f"{name} @ {site}"] += 1
                if self.strict_syncs:
                    raise DeviceMismatch(f"host sync {name} of a device tensor at {site}")
        elif tagged:
            host = [t for t in tensors if t not in self.on and t.dim() > 0]
            if func in INDEXING:  # host index tensors are legal; a host value written into a device tensor is not
                host = [t for t in host if t is args[0] or (func is torch.Tensor.__setitem__ and t is args[-1])]
            if host:
                site, _ = _site()
                raise DeviceMismatch(
                    f"Expected all tensors to be on the same device, but found a device tensor and a host tensor of "
                    f"shape {tuple(host[0].shape)} in {name} at {site}"
                )
        result = func(*args, **kwargs)
        if tagged:
            self._mark(result)
        return result

    def _to(self, func, args, kwargs):
        source = args[0]
        device = kwargs.get("device", args[1] if len(args) > 1 else None)
        result = func(*args, **kwargs)
        if self.names_device(device):
            self._mark(result)  # .to(x.device) / .to(args.device) / .to(x): the device
        elif isinstance(device, (str, torch.device, torch.Tensor)):
            if result is source and source in self.on:  # .to("cpu") / .to(torch.device("cpu")): a host copy
                result = result.clone()
        elif source in self.on:
            self._mark(result)  # a dtype-only .to keeps the device
        return result


def _tensors(args, kwargs) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []

    def walk(value):
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            for item in value:
                walk(item)
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)

    walk(args)
    walk(kwargs)
    return found


@contextlib.contextmanager
def emulated_collectives(accelerator: EmulatedAccelerator):
    """Within: ``torch.distributed``'s all_reduce / broadcast / all_gather_into_tensor / reduce_scatter_tensor refuse
    a host tensor with NCCL's error, and run on the real (gloo) process group otherwise."""
    names = ("all_reduce", "broadcast", "all_gather_into_tensor", "reduce_scatter_tensor")
    originals = {name: getattr(dist, name) for name in names}

    def guarded(name):
        original = originals[name]

        def collective(tensor, *args, **kwargs):
            if not accelerator.is_on(tensor):
                site, _ = _site()
                raise DeviceMismatch(f"No backend type associated with device type cpu ({name} of a host tensor at "
                                     f"{site}; NCCL serves device tensors only)")
            return original(tensor, *args, **kwargs)

        return collective

    try:
        for name in names:
            setattr(dist, name, guarded(name))
        yield accelerator
    finally:
        for name, original in originals.items():
            setattr(dist, name, original)


__all__ = ["ACCELERATOR", "DeviceMismatch", "EmulatedAccelerator", "emulated_collectives"]
