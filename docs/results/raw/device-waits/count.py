"""What a speculation step asks of the device's queue, counted on the CPU: each read of a tensor back to
the host (tolist, item, bool, int, float, cpu, numpy) and each copy of the host's values to the device
(torch.tensor/as_tensor with a device), per step, with where it happens. On a GPU each of them waits for
the work queued before it; one wait a step is the floor (the acceptance). Tiny fp32 models, the device
chains forced on (as under --cuda-graphs), a draft model (no stop rule) and an EAGLE head, greedy:
    PYTHONPATH=. python docs/results/raw/device-waits/count.py"""
import collections
import json
import sys
import traceback

from torch.overrides import TorchFunctionMode

sys.path.insert(0, "tests")
from conftest import tiny_model  # noqa: E402
from specdec.config import GenerationConfig  # noqa: E402
from specdec.drafters.draft_model import DraftModelDrafter  # noqa: E402
from specdec.drafters.eagle import EagleDrafter  # noqa: E402
from specdec.engine.engine import Engine  # noqa: E402
from test_eagle import eagle_head  # noqa: E402

READS = {"tolist", "item", "__bool__", "__int__", "__float__", "__index__", "numpy", "cpu"}


class Count(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.seen = collections.Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        kind = "read" if name in READS else "copy" if name in ("tensor", "as_tensor") and kwargs.get("device") \
            else None
        if kind:
            where = [f for f in traceback.extract_stack()[:-1] if "/specdec/" in f.filename][-1]
            self.seen[f"{kind} {name} {where.filename.split('specdec/')[-1]}:{where.name}"] += 1
        return func(*args, **kwargs)


kw = dict(num_layers=1, hidden_size=32, intermediate_size=64, num_heads=2, num_kv_heads=1)
target = tiny_model(0, **kw)
drafters = {"draft model": DraftModelDrafter(tiny_model(0, **kw), 96, 512, on_device=True),
            "eagle head": EagleDrafter(target, eagle_head(target), 512, on_device=True)}
out = {}
for name, drafter in drafters.items():
    engine = Engine.single(target, drafter, 512)
    cfg = GenerationConfig(41, 4, stop_at_eos=False)
    engine.generate([1, 2, 3, 4], cfg)
    count = Count()
    with count:
        steps = engine.generate([1, 2, 3, 4], cfg).stats.steps
    out[name] = {"steps": steps, "per_step": {k: round(v / steps, 2) for k, v in count.seen.most_common()}}
print(json.dumps(out, indent=1))
