"""The verification layer: metrics, the one comparator, the one gate evaluator and the guards that keep a check
from passing when it proves nothing (NaN, zeros, constants, references too small to measure). Every step that
compares a target with a reference (export, clean, calibrate, build's FP8 gate, run, stateful, kvcache, bisect)
goes through it."""
