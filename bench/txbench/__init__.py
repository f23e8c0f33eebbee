"""txbox benchmark harness (issue 7): the measures of DESIGN §8 as medians and ratios of
interleaved runs, against the alternatives users would pick. Entry point: bench/run.py."""
