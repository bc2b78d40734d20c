"""Running the kernels on the CPU with Triton's interpreter (``TRITON_INTERPRET=1``).

The interpreter executes each program of a launch with numpy, which is how the kernels are
tested - and the whole engine run - on machines without a GPU. It must be switched on
before ``triton`` compiles anything, i.e. in the environment before Octavo starts.

numpy has no bfloat16 or fp8, so the interpreter keeps those values as raw integer bits,
and two of its operations get them wrong; :func:`patch_interpreter` fixes both so that
the kernels compute here what they compute on a GPU:

- ``tl.dot`` multiplies the raw bits of bf16 and fp8 operands (garbage): they are widened
  to fp32 first, exactly - the GPU too accumulates bf16 and fp8 products in fp32;
- float conversions to and from bf16 and fp8 truncate or mis-round, where GPUs round to
  nearest even: they are done by torch, which rounds as the GPU does.

It also backports one fix of Triton 3.7's interpreter to 3.6 (the oldest Triton the plugin
accepts): ``range(start, end)`` over values loaded in the kernel, whose interpreter
tensors hold one-element arrays that 3.6 cannot turn into a Python int.
"""

from __future__ import annotations

import os


def interpreting() -> bool:
    """Whether Triton runs kernels in its interpreter in this process."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def patch_interpreter() -> None:
    """Make the interpreter's bf16 dot and float conversions match the GPU (idempotent)."""
    import numpy as np
    import torch
    import triton.language as tl
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    if getattr(builder, "octavo_patched", False):
        return
    original_dot, original_cast = builder.create_dot, builder.cast_impl
    original_fp_to_fp = builder.create_fp_to_fp
    handle = interpreter.TensorHandle
    # Triton float type -> (torch dtype, the torch dtype of the interpreter's numpy storage)
    floats = {
        tl.float32: (torch.float32, torch.float32),
        tl.float16: (torch.float16, torch.float16),
        tl.bfloat16: (torch.bfloat16, torch.uint16),
        tl.float8e4nv: (torch.float8_e4m3fn, torch.uint8),
        tl.float8e5: (torch.float8_e5m2, torch.uint8),
    }

    def convert(src: interpreter.TensorHandle, dst_type: tl.dtype):
        """``src`` converted to ``dst_type`` by torch, or None for other types."""
        src_types, dst_types = floats.get(src.dtype.scalar), floats.get(dst_type.scalar)
        if src_types is None or dst_types is None:
            return None
        values = torch.from_numpy(np.ascontiguousarray(src.data)).view(src_types[0])
        converted = values.to(dst_types[0]).view(dst_types[1]).numpy()
        return handle(converted, dst_type.scalar)

    def widen(x: interpreter.TensorHandle) -> interpreter.TensorHandle:
        narrow = x.dtype in (tl.bfloat16, tl.float8e4nv, tl.float8e5)
        return convert(x, tl.float32) if narrow else x

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        return original_dot(self, widen(a), widen(b), d, input_precision, max_num_imprecise_acc)

    def cast_impl(self, src, dst_type):
        converted = convert(src, dst_type)
        return original_cast(self, src, dst_type) if converted is None else converted

    def create_fp_to_fp(self, src, dst_type, rounding_mode):
        converted = None
        if rounding_mode in (None, interpreter._ir.ROUNDING_MODE.RTNE):
            converted = convert(src, dst_type)
        if converted is None:
            return original_fp_to_fp(self, src, dst_type, rounding_mode)
        return converted

    original_patch_tensor = interpreter._patch_lang_tensor

    def patch_lang_tensor(tensor, scope):
        original_patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    builder.create_dot = create_dot
    builder.cast_impl = cast_impl
    builder.create_fp_to_fp = create_fp_to_fp
    interpreter._patch_lang_tensor = patch_lang_tensor
    builder.octavo_patched = True
