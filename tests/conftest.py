import os
import sys

# Rank code lives in tests/rank_checks.py; launched ranks import it by name.
sys.path.insert(0, os.path.dirname(__file__))
