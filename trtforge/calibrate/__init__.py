"""INT8 calibration: data loading, streamed activation statistics, scale methods, the cache, Q/DQ."""
