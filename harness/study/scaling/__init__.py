"""Scaling studies: a sweep of runs (backends x rank counts x repeats), and the tables, intervals,
figures, traces and weight comparisons that say what its records show."""
