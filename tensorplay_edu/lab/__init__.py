"""Teaching aids: the demo (``python -m tensorplay_edu.lab.demo``, ``make demo``), the
transition-table demo, and the exercise checks the notebooks use."""
