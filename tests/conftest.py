import os
import sys

# Rank code lives in tests/rank_checks.py; launched ranks import it by name.
sys.path.insert(0, os.path.dirname(__file__))

# A developer's exported TENSORPLAY_CHECK_NCCL (tensorplay_edu.gpu_rules.nccl) would put every launched rank of
# every test under the checker; tests that want it set it themselves.
for _name in ("TENSORPLAY_CHECK_NCCL", "TENSORPLAY_CHECK_NCCL_TIMEOUT"):
    os.environ.pop(_name, None)
