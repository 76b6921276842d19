"""The hand-written dequantization scripts the dequantization targets compare against: DeepSeek's
``fp8_cast_bf16.py`` (from bench_tensor.py, here also on a GPU) and the same script shape for
ModelOpt NVFP4. Each takes ``SRC DST [DEVICE]``: load_file per shard, dequantize on DEVICE
(default cpu), save_file, index rewritten; no hashing, no fsync."""

from __future__ import annotations

import bench_tensor

# fp8_cast_bf16.py with its weight_dequant on DEVICE (DeepSeek's own script runs it in Triton on
# the GPU; on the CPU it is bench_tensor.py's baseline unchanged).
FP8_CAST_BF16_DEVICE = bench_tensor.FP8_CAST_BF16.replace(
    "new_state_dict[weight_name] = weight_dequant(weight, scale_inv)",
    "new_state_dict[weight_name] = weight_dequant(weight.to(DEV), scale_inv.to(DEV)).cpu()",
).replace("main(sys.argv[1], sys.argv[2])",
          "DEV = sys.argv[3] if len(sys.argv) > 3 else 'cpu'\nmain(sys.argv[1], sys.argv[2])")

# The same script for ModelOpt NVFP4: codes through the e2m1 table, times the group scale and the
# global scale, in float32, rounded once to bf16; the scales are dropped.
NVFP4_TO_BF16 = r"""
import json, os, sys
from glob import glob
import torch
from safetensors.torch import load_file, save_file

DEV = sys.argv[3] if len(sys.argv) > 3 else "cpu"
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                     -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], device=DEV)

def dequant(packed, scale, scale_2):
    rows = packed.shape[0]
    codes = torch.stack((packed & 0x0F, packed >> 4), dim=-1).reshape(rows, -1).long()
    v = E2M1[codes].view(rows, -1, 16) * scale.to(torch.float32).unsqueeze(-1)
    return (v * scale_2.to(torch.float32)).reshape(rows, -1).to(torch.bfloat16)

src, dst = sys.argv[1], sys.argv[2]
os.makedirs(dst, exist_ok=True)
index = json.load(open(os.path.join(src, "model.safetensors.index.json")))
dropped = set()
for path in sorted(glob(os.path.join(src, "*.safetensors"))):
    tensors = load_file(path)
    out = {}
    for name, t in tensors.items():
        if name.endswith((".weight_scale", ".weight_scale_2", ".input_scale")):
            dropped.add(name)
        elif t.dtype == torch.uint8 and name + "_scale" in tensors:
            base = name[: -len("weight")]
            out[name] = dequant(t.to(DEV), tensors[base + "weight_scale"].to(DEV),
                                tensors[base + "weight_scale_2"].to(DEV)).cpu()
        else:
            out[name] = t
    save_file(out, os.path.join(dst, os.path.basename(path)), metadata={"format": "pt"})
index["weight_map"] = {k: v for k, v in index["weight_map"].items() if k not in dropped}
with open(os.path.join(dst, "model.safetensors.index.json"), "w") as f:
    json.dump(index, f, indent=2)
"""
