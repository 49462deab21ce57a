"""`moss-serve bench`: a gRPC load client against the gateway (workload.py → load.py → stream.py → report.py,
plots.py)."""
