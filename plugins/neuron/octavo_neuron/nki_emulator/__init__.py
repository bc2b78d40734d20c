"""A numpy emulator of the subset of AWS NKI (``neuronxcc.nki``) that Octavo's kernels use.

This is a TEST INSTRUMENT, never the production path: on a Neuron device the kernels run
through the real ``neuronxcc.nki`` (see ``octavo_neuron.nki``). AWS ships NKI only on its own
package index, so without it the kernels' numerics and their tiling are checked here, on any
machine, against torch references.

Use it as the module ``nki``: ``nki.jit``, ``nki.language`` (``nl``), ``nki.isa`` (``nisa``).
Values are float32 numpy arrays rounded to their tile's dtype (bfloat16 through torch).
Undefined memory (fresh ``nl.ndarray`` tensors, masked-off load elements) reads as NaN.

Hardware rules are enforced as ``NkiRuleError`` (``.rule`` is the name below); the message
names the rule, the tensor (kernel variable name or shape) and the kernel ``file:line``:

- ``partition-dim``: an SBUF/PSUM tile's partition axis (axis 0, or ``nl.par_dim``) > 128.
- ``psum-size``: a PSUM tile over 2 KiB per partition (one bank: fp32 [128, 512]).
- ``sbuf-size``: an SBUF tile over 192 KiB per partition.
- ``hbm-bounds``: a load/store reaching outside an HBM tensor (masked-off elements aside).
- ``load-store-hbm``: ``nl.load``/``nl.store`` on something that is not an HBM tensor.
- ``store-source``: storing to HBM from anything but an SBUF tile (e.g. straight from PSUM).
- ``store-shape``: a stored tile whose shape is not the destination's.
- ``hbm-direct-write``: assigning into an HBM tensor instead of ``nl.store``.
- ``compute-on-hbm``: arithmetic on an HBM tensor that was never loaded.
- ``matmul-operand-buffer``: a matmul operand not a 2-d SBUF tile (in HBM or PSUM).
- ``matmul-contraction``: contraction (partition) sizes that disagree or exceed 128.
- ``matmul-size``: stationary free size > 128 or moving free size > 512.
- ``transpose-size``: a Tensor Engine transpose of a tile with an axis > 128.
- ``partition-broadcast``: elementwise operands with different partition counts.
- ``reduce-partition``: a reduction over the partition axis.
- ``tile-reshape``: reshaping an on-chip tile (only HBM tensors have views).
- ``kernel-output``: a kernel returning an on-chip tile.

Not emulated: engine timing, SBUF/PSUM capacity across live tiles, grids
(``program_id``), DMA queues, instruction-level dtype restrictions, tile arithmetic
operators (``+``, ``+=`` accumulation into PSUM: use ``nl.add``), and indexing that mixes
slices with index expressions (an explicit ``NotImplementedError``).
"""

from . import isa, language
from .errors import NkiRuleError
from .jit import jit

__all__ = ["NkiRuleError", "isa", "jit", "language"]
