import time, torch
from flashlight.integrations import openfold_testing as oft
from openfold.config import model_config
from openfold.model.model import AlphaFold
c = model_config("model_1")
m = AlphaFold(c)
for mod in (m.evoformer, m.extra_msa_stack, m.structure_module):
    t0 = time.perf_counter()
    weights = [(sub._parameters, n, p) for sub in mod.modules() for n, p in sub._parameters.items()] + \
              [(sub._buffers, n, b) for sub in mod.modules() for n, b in sub._buffers.items()]
    t1 = time.perf_counter()
    for _ in range(10):
        ok = all(d.get(n) is t for d, n, t in weights)
    t2 = time.perf_counter()
    print(type(mod).__name__, len(weights), f"collect {1e3*(t1-t0):.2f} ms, check {1e3*(t2-t1)/10:.3f} ms")
