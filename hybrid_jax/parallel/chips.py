"""Accelerator specifications by device kind: bf16 peak, HBM capacity and bandwidth, and where the numbers come from.

MFU (training, `bench step`) needs the peak; `compile-check`'s fit verdict and roofline estimate need the HBM
numbers, and its price of a mesh's collectives the bidirectional inter-chip (ICI) bandwidth per chip.
A TPU device is one chip for v4 and later (megacore), one core for v2/v3. Dense bf16, no sparsity. Matched against
`device.device_kind` in order, more specific names first.
"""

import dataclasses

_NVIDIA = 'NVIDIA data sheet of the part'
_TPU_DOCS = 'https://cloud.google.com/tpu/docs/'


@dataclasses.dataclass(frozen=True)
class Chip:
  name: str  # Substring of device_kind that identifies the part.
  peak_bf16_tflops: float
  hbm_bytes: float | None = None  # As the vendor states it (GB = 1e9 bytes, GiB = 2**30 bytes).
  hbm_bytes_per_s: float | None = None
  source: str = ''
  ici_bytes_per_s: float | None = None  # Bidirectional inter-chip interconnect bandwidth per chip.


_GB, _GIB = 1e9, 2**30
CHIPS = (
    Chip('H100 PCIe', 756.0, 80 * _GB, 2.0e12, _NVIDIA), Chip('H100 NVL', 835.0, 94 * _GB, 3.9e12, _NVIDIA),
    Chip('H100', 989.0, 80 * _GB, 3.35e12, _NVIDIA), Chip('H200', 989.0, 141 * _GB, 4.8e12, _NVIDIA),
    Chip('H800', 989.0, source=_NVIDIA), Chip('GH200', 989.0, source=_NVIDIA), Chip('B200', 2250.0, source=_NVIDIA),
    Chip('B100', 1750.0, source=_NVIDIA), Chip('A100', 312.0, 80 * _GB, 2.039e12, _NVIDIA),
    Chip('A800', 312.0, source=_NVIDIA), Chip('L40S', 362.0, source=_NVIDIA), Chip('L4', 121.0, source=_NVIDIA),
    Chip('A10G', 70.0, source=_NVIDIA),
    Chip('TPU v2', 22.5, source=_TPU_DOCS + 'system-architecture-tpu-vm'),
    Chip('TPU v3', 61.5, source=_TPU_DOCS + 'system-architecture-tpu-vm'),
    Chip('TPU v4', 275.0, 32 * _GIB, 1200e9, _TPU_DOCS + 'v4'),
    Chip('TPU v5 lite', 197.0, 16 * _GB, 819e9, _TPU_DOCS + 'v5e', 400e9),
    Chip('TPU v5e', 197.0, 16 * _GB, 819e9, _TPU_DOCS + 'v5e', 400e9),
    Chip('TPU v5p', 459.0, 95 * _GB, 2765e9, _TPU_DOCS + 'v5p', 1200e9),
    Chip('TPU v5', 459.0, 95 * _GB, 2765e9, _TPU_DOCS + 'v5p', 1200e9),
    Chip('TPU v6 lite', 918.0, 32 * _GB, 1638e9, _TPU_DOCS + 'v6e', 800e9),
    Chip('TPU v6e', 918.0, 32 * _GB, 1638e9, _TPU_DOCS + 'v6e', 800e9),
)


def chip(device_kind: str) -> Chip | None:
  """The specification of a device kind (e.g. 'TPU v5 lite', 'NVIDIA H200'), or None when unknown (CPU)."""
  kind = device_kind.lower()
  return next((c for c in CHIPS if c.name.lower() in kind), None)
