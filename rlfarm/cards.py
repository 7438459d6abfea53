"""What the accelerator cards can do at most, by device name: the vendors' datasheet figures that the decode
step's roofline (`rlfarm.bench.engine_roofline`) and the learner's model-FLOPs utilization
(`rlfarm.algos.model_flops`) are measured against."""
from __future__ import annotations

import torch

# peak HBM bandwidth by device name (TB/s), first match wins: the vendors' datasheet figures
HBM_TB_S = (("H200", 4.8), ("H100 NVL", 3.9), ("H100 PCIe", 2.0), ("H100", 3.35), ("GH200", 4.0),
            ("A100-SXM4-80GB", 2.039), ("A100 80GB PCIe", 1.935), ("A100", 1.555), ("L40S", 0.864))
# dense (no sparsity) bf16/fp16 tensor-core peak by device name (TFLOP/s), first match wins: datasheet figures
DENSE_TFLOPS = (("H200", 989.0), ("H100 NVL", 835.0), ("H100 PCIe", 756.0), ("H100", 989.0), ("GH200", 989.0),
                ("A100", 312.0), ("L40S", 362.0))


def card_figure(table, device: str, configured) -> float | None:
    """The configured value, else the table's entry for this CUDA device's name (None: neither)."""
    if configured is not None:
        return float(configured)
    if torch.device(device).type != "cuda":
        return None
    name = torch.cuda.get_device_name(torch.device(device))
    return next((value for key, value in table if key in name), None)
