"""Teaching aids: the demo (``python -m tensorplay_edu.lab.demo``, ``make demo``), the
transition-table demo, the exercise checks the notebooks use, notebook 06's plan checks (``plan_checks.py``),
and the bug zoo's workers
(``bug_zoo_*.py``: notebook 08's and 08b's bugs, which 08c runs again side by side)."""
