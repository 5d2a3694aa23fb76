import os
import sys

# One test file per feature: tests/test_<feature>.py; its rank code (what runs inside the launched
# processes) in tests/rank_<feature>.py; the helpers every test shares (clean, Checker, raises, chunk,
# gather_all) written once in tests/checks.py. Launched ranks import these modules by name.
sys.path.insert(0, os.path.dirname(__file__))

# A developer's exported TENSORPLAY_CHECK_NCCL (tensorplay_edu.gpu_rules.nccl) would put every launched rank of
# every test under the checker; tests that want it set it themselves.
for _name in ("TENSORPLAY_CHECK_NCCL", "TENSORPLAY_CHECK_NCCL_TIMEOUT"):
    os.environ.pop(_name, None)

# The pictures' tests (tests/test_viz*.py) read figures, never a screen: Agg, and every figure closed after
# each test. Their readers of a figure (texts, colours, patches by gid) are in tests/figures.py.
import matplotlib  # noqa: E402
import pytest  # noqa: E402

matplotlib.use("Agg")


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    if "matplotlib.pyplot" in sys.modules:
        sys.modules["matplotlib.pyplot"].close("all")
